// The scanner and the loader agree on every corpus file, and the scan names
// every global PyTorch's own get_unsafe_globals_in_checkpoint named.
// Corpus: tests/data/corpus/torch-2.11 (written and read by PyTorch 2.11, see
// its README); tests/data/corpus/torch-1.13 when present.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/pickle.hpp"
#include "safeckpt/scan.hpp"
#include "test_scan_helpers.hpp"

namespace fs = std::filesystem;
using safeckpt::scan::Verdict;

namespace {

std::vector<fs::path> corpus_cases() {
  std::vector<fs::path> out;
  for (const char* sub : {"torch-2.11", "torch-1.13"}) {
    fs::path d = fs::path(SAFECKPT_TEST_DATA) / "corpus" / sub;
    if (!fs::exists(d)) continue;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("scan/corpus: scan is clean exactly when the loader loads; every unsafe global is named") {
  auto cases = corpus_cases();
  REQUIRE(cases.size() >= 60);
  int agree = 0;
  for (const fs::path& js : cases) {
    std::ifstream in(js);
    nlohmann::json meta = nlohmann::json::parse(in);
    if (!meta.contains("file")) continue;
    fs::path file = js.parent_path() / meta["file"].get<std::string>();
    CAPTURE(file.string());
    auto rep = safeckpt::scan::scan_file(file);
    INFO(scantest::dump(rep));
    auto loaded = safeckpt::load(file);
    const bool clean = rep.verdict == Verdict::kClean;
    CHECK(clean == loaded.has_value());
    CHECK(rep.loader.ran);
    CHECK(rep.loader.ok == loaded.has_value());
    // exit code of `safeckpt scan` is 0 exactly when inspect/load succeeds
    CHECK((safeckpt::scan::exit_code({rep}) == 0) == loaded.has_value());
    if (clean == loaded.has_value()) ++agree;
    // PyTorch itself refused everything the scan flags as unsafe
    if (meta.value("weights_only_ok", false)) CHECK(rep.verdict != Verdict::kUnsafe);
    // torch-1.13 files list every global their pickle names: all must be reported as events
    if (meta.contains("pickle_globals") && rep.complete) {
      std::set<std::string> names;
      for (const auto& e : rep.events) names.insert(e.name);
      for (const auto& g : meta["pickle_globals"]) {
        // listed as written (py2 spellings): compare after the loader's fix_imports mapping
        std::string raw = g.get<std::string>();
        std::size_t dot = raw.rfind('.');
        std::string canon = safeckpt::canonical_global_name(raw.substr(0, dot), raw.substr(dot + 1), 2);
        CAPTURE(raw);
        CHECK(names.count(canon) == 1);
      }
    }
    if (meta.contains("unsafe_globals")) {
      std::set<std::string> seen;
      for (const auto& f : rep.findings)
        if (!f.global.empty()) seen.insert(f.global);
      for (const auto& e : rep.events)
        if (!e.allowed) seen.insert(e.name);
      for (const auto& g : meta["unsafe_globals"]) {
        CAPTURE(g.get<std::string>());
        CHECK(seen.count(g.get<std::string>()) == 1);
      }
    }
  }
  MESSAGE("scan and load agree on " << agree << " of " << cases.size() << " corpus files");
}

TEST_CASE("scan/corpus: malicious corpus files name their payload with the right rule") {
  struct Want {
    const char* file;
    const char* global;
    safeckpt::scan::Rule rule;
  };
  using safeckpt::scan::Rule;
  const Want wants[] = {
      {"mal_os_system.pt", "os.system", Rule::kImportDangerous},
      {"mal_posix_system.pt", "posix.system", Rule::kImportDangerous},
      {"mal_builtins_eval.pt", "builtins.eval", Rule::kCall},
      {"mal_builtins_exec.pt", "builtins.exec", Rule::kCall},
      {"mal_runpy.pt", "runpy._run_code", Rule::kImportDangerous},
      {"mal_subprocess.pt", "subprocess.Popen", Rule::kImportDangerous},
      {"mal_webbrowser.pt", "webbrowser.open", Rule::kImportDangerous},
      {"mal_torch_load_nested.pt", "torch.load", Rule::kImportDangerous},
      {"mal_functools_partial.pt", "functools.partial", Rule::kImportDangerous},
      {"mal_getattr_chain.pt", "builtins.getattr", Rule::kImportDangerous},
      {"mal_hidden_in_state_dict.pt", "os.system", Rule::kCall},
      {"mal_inst.pt", "os.system", Rule::kRefusedOpcode},
      {"mal_obj.pt", "os.system", Rule::kRefusedOpcode},
      {"mal_stack_global.pt", "os.system", Rule::kImportDangerous},
      {"mal_broken_after_call.pt", "os.system", Rule::kCall},
      {"mal_raw_pickle.pkl", "", Rule::kImportDangerous},
      {"mal_ext1.pt", "", Rule::kImportExtension},
  };
  fs::path d = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";
  for (const Want& w : wants) {
    CAPTURE(w.file);
    auto rep = safeckpt::scan::scan_file(d / w.file);
    INFO(scantest::dump(rep));
    CHECK(rep.verdict == Verdict::kUnsafe);
    CHECK(scantest::has(rep, w.rule, w.global));
  }
  auto broken = safeckpt::scan::scan_file(d / "mal_broken_after_call.pt");
  CHECK(scantest::has(broken, safeckpt::scan::Rule::kMalformed));
  CHECK_FALSE(broken.complete);
}

TEST_CASE("scan/corpus: truncations and byte flips never crash, and are clean only when the loader loads") {
  // Default scan vs load(verify_storage_crc=false), and --verify-data vs the
  // default load (the one documented difference: tensor-byte CRCs).
  fs::path d = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";
  int checked = 0, disagreements = 0, not_clean = 0;
  for (bool verify : {false, true}) {
    safeckpt::scan::ScanOptions so;
    so.keep_events = false;
    so.verify_data = verify;
    safeckpt::LoadOptions lo;
    lo.verify_storage_crc = verify;
    for (const char* name : {"mlp_state_dict.pt", "legacy_format.pt", "mal_stack_global.pt", "protocol_4.pt"}) {
      std::ifstream in(d / name, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      REQUIRE(!bytes.empty());
      std::vector<std::string> variants;
      for (std::size_t n = 0; n < bytes.size(); n += 7) variants.push_back(bytes.substr(0, n));
      for (std::size_t i = 0; i < bytes.size(); i += 3) {
        std::string v = bytes;
        v[i] = static_cast<char>(v[i] ^ 0x5A);
        variants.push_back(std::move(v));
      }
      for (const std::string& v : variants) {
        auto rep = safeckpt::scan::scan_bytes(scantest::span(v), name, so);
        auto loaded = safeckpt::load_bytes(scantest::span(v), lo);
        ++checked;
        if (rep.verdict != Verdict::kClean) ++not_clean;
        // a clean verdict always means the loader accepted the very same bytes
        if (rep.verdict == Verdict::kClean && !loaded.has_value()) {
          ++disagreements;
          if (disagreements <= 3) {
            INFO(scantest::dump(rep) << "loader: " << loaded.error().to_string());
            CHECK(loaded.has_value());
          }
        }
        // and a file the loader refuses on policy is never clean
        if (!loaded.has_value() && safeckpt::is_policy_error(loaded.error().code()))
          CHECK(rep.verdict == Verdict::kUnsafe);
      }
    }
  }
  CHECK(disagreements == 0);
  MESSAGE(checked << " mutated files scanned, " << not_clean << " not clean; clean-but-refused: " << disagreements);
}
