#include "catalogue.hpp"

#include <string_view>
#include <vector>

#include "safeckpt/allowlist.hpp"

namespace safeckpt::scan {
namespace {

Severity severity_of(Danger d) {
  switch (d) {
    case Danger::kCritical: return Severity::kCritical;
    case Danger::kHigh: return Severity::kHigh;
    case Danger::kMedium: return Severity::kMedium;
    case Danger::kUnlisted: return Severity::kHigh;
  }
  return Severity::kHigh;
}

}  // namespace

const CatalogueEntry* catalogue_lookup(std::string_view name) noexcept {
  // The table is policy data (src/torch/allowlist.cpp): the same rows decide
  // the loader's hard block. Its rows are mirrored once, in order.
  static const std::vector<CatalogueEntry> kEntries = [] {
    std::vector<CatalogueEntry> v;
    for (const DangerousGlobal& d : dangerous_globals())
      v.push_back(CatalogueEntry{d.pattern, d.category, severity_of(d.danger), d.why});
    return v;
  }();
  const DangerousGlobal* d = find_dangerous_global(name);
  if (d == nullptr) return nullptr;
  return &kEntries[static_cast<std::size_t>(d - dangerous_globals().data())];
}

bool is_nested_loader(std::string_view name) noexcept {
  const CatalogueEntry* e = catalogue_lookup(name);
  return e != nullptr && e->category == "loader";
}

}  // namespace safeckpt::scan
