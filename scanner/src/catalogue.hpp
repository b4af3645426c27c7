// Catalogue of known-dangerous callables: explanation and severity.
//
// The catalogue never lets anything through: a global is refused because it is
// not in the Allowlist (an exact, canonical allowlist is the only thing that
// holds — threats.md, "Why scanners keep losing" 1). It ranks and explains a
// refused global, and its kCritical rows are the Allowlist's hard block (a
// critical global can never be allowlisted). The rows live in the policy layer
// (safeckpt/allowlist.hpp, find_dangerous_global) so the loader reads the same
// table; this is the scanner's view of them.
// Sources: threats.md (CVE-2025-1716 pip.main, CVE-2025-10157 asyncio, the
// picklescan/modelscan/fickling bypass reports, arXiv 2508.19774).
#pragma once

#include <string_view>

#include "safeckpt/scan.hpp"

namespace safeckpt::scan {

struct CatalogueEntry {
  std::string_view pattern;   // "module.name" exact, or "module.*" (module and submodules)
  std::string_view category;  // exec, process, loader, importer, network, file, native, gadget
  Severity severity;
  std::string_view why;
};

// The entry describing canonical `name`, or nullptr when none is known.
const CatalogueEntry* catalogue_lookup(std::string_view name) noexcept;

// True when `name` is a nested loader (pickle.loads, torch.load, ...): the
// scanner then looks for embedded payloads with extra care.
bool is_nested_loader(std::string_view name) noexcept;

}  // namespace safeckpt::scan
