// Issue 12: the scanner runs the pickle machine once per stream (no second
// opcode walker, no re-runs to find where a refused stream ends). Counted
// with the machine's per-thread run counter (src/pickle/run_count.hpp). The
// loader's verdict (run_loader) is one more run of the whole file: switched
// off in the first cases, counted in the last ones.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "pickle/run_count.hpp"
#include "test_scan_helpers.hpp"

using namespace scantest;
using safeckpt::detail::pickle_runs_on_this_thread;
using safeckpt::scan::Rule;

namespace {

safeckpt::scan::ScanOptions no_loader() {
  safeckpt::scan::ScanOptions o;
  o.run_loader = false;
  return o;
}

// Machine runs made by `f`.
template <class F>
std::uint64_t runs_of(F&& f) {
  const std::uint64_t before = pickle_runs_on_this_thread();
  f();
  return pickle_runs_on_this_thread() - before;
}

}  // namespace

TEST_CASE("scan: a one-INST pickle is run through the machine once") {
  const Buf inst = "(S'true'\nios\nsystem\n.";  // MARK, 'true', INST os system, STOP
  safeckpt::scan::FileReport r;
  const std::uint64_t n = runs_of([&] { r = scan(inst, no_loader()); });
  MESSAGE("machine runs for one INST pickle (scanner only): " << n);
  bool named = false;
  for (const auto& f : r.findings) named = named || f.global == "os.system";
  REQUIRE_MESSAGE(named, dump(r));
  CHECK(r.pickle_streams == 1);
  CHECK(n == 1);
}

TEST_CASE("scan: two refused streams back to back, each run once") {
  // Legacy files hold several pickles back to back: the end of a refused
  // stream (where the next one starts) comes from the same run.
  const Buf two = os_system_pickle() + os_system_pickle();
  safeckpt::scan::FileReport r;
  const std::uint64_t n = runs_of([&] { r = scan(two, no_loader()); });
  MESSAGE("machine runs for two refused streams: " << n);
  CHECK(r.pickle_streams == 2);
  CHECK(n == 2);
  CHECK_FALSE(has(r, Rule::kTrailingData));
}

TEST_CASE("scan: corpus files, one machine run per stream") {
  for (const std::string name : {"torch-1.13/legacy_format.pt", "torch-1.13/protocol_2.pt",
                                 "torch-1.13/argparse_namespace.pt", "torch-1.13/python_values_unsafe.pt"}) {
    CAPTURE(name);
    const std::string path = std::string(SAFECKPT_TEST_DATA) + "/corpus/" + name;
    safeckpt::scan::FileReport r;
    const std::uint64_t n = runs_of([&] { r = safeckpt::scan::scan_file(path, no_loader()); });
    MESSAGE(name << ": " << r.pickle_streams << " stream(s), " << n << " machine run(s)");
    REQUIRE(r.pickle_streams > 0);
    CHECK(n == r.pickle_streams);
  }
}

TEST_CASE("scan: the loader's verdict on a refused pickle is one more run, not two") {
  // The loader names every refused global from the same run (no second run
  // of the refused stream for the message).
  const Buf inst = "(S'true'\nios\nsystem\n.";
  safeckpt::scan::FileReport r;
  const std::uint64_t n = runs_of([&] { r = scan(inst); });
  MESSAGE("machine runs for one INST pickle (scanner + loader): " << n);
  REQUIRE(r.loader.ran);
  CHECK_FALSE(r.loader.ok);
  CHECK(r.pickle_streams == 1);
  CHECK(n == 2);
}

TEST_CASE("scan: a refused corpus zip costs one run more with the loader's verdict than without") {
  // Without the loader: one run per stream plus the probes of embedded byte
  // strings that may be pickles (mal_os_system's 'echo unsafe'); the verdict
  // adds exactly one run of data.pkl.
  for (const std::string name : {"torch-1.13/python_values_unsafe.pt", "torch-2.11/mal_os_system.pt"}) {
    CAPTURE(name);
    const std::string path = std::string(SAFECKPT_TEST_DATA) + "/corpus/" + name;
    safeckpt::scan::FileReport r;
    const std::uint64_t without = runs_of([&] { r = safeckpt::scan::scan_file(path, no_loader()); });
    const std::uint64_t with = runs_of([&] { r = safeckpt::scan::scan_file(path); });
    MESSAGE(name << ": " << without << " machine run(s) without the loader, " << with << " with it");
    REQUIRE(r.loader.ran);
    CHECK_FALSE(r.loader.ok);
    CHECK(with == without + 1);
  }
}
