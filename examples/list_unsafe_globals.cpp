// Audit files without loading them: every import/call the pickle would
// make, and whether the allowlist allows it (what `safeckpt scan` prints).
//   list_unsafe_globals FILE...
#include <cstdio>
#include <string>

#include "safeckpt/scan.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE...\n", argv[0]);
    return 2;
  }
  std::vector<safeckpt::scan::FileReport> reports;
  for (int i = 1; i < argc; ++i) {
    safeckpt::scan::FileReport r = safeckpt::scan::scan_file(argv[i]);
    for (const auto& e : r.events)
      if (!e.allowed)
        std::printf("%s: %s %s (%s)\n", argv[i], std::string(safeckpt::scan::event_type_name(e.type)).c_str(),
                    e.name.c_str(), e.member.c_str());
    std::printf("%s: %s, %zu findings, %zu events\n", argv[i],
                std::string(safeckpt::scan::verdict_name(r.verdict)).c_str(), r.findings.size(), r.events.size());
    reports.push_back(std::move(r));
  }
  return safeckpt::scan::exit_code(reports);  // 0 clean, 1 findings, 2 unreadable
}
