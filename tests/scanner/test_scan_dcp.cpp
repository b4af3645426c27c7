// torch.distributed.checkpoint directories in the scanner (scan.hpp
// "torch.distributed.checkpoint directories"): one report per directory,
// in every format, with the findings of `.metadata` and of every payload;
// found inside a walked directory; sharded safetensors indexes followed.
// Real directories: tests/data/dcp-2.11 (PyTorch 2.11, gen_dcp.py); hostile
// ones are copies with one thing changed.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safeckpt/scan.hpp"
#include "support/dcp_cases.hpp"
#include "support/dcp_metadata.hpp"

using namespace safeckpt;
namespace fs = std::filesystem;

namespace {

const fs::path kCorpus = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";

fs::path fresh(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("safeckpt_scan_dcp_" + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

fs::path copy_case(const std::string& name, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(dcp_test::case_dir(name) / "dcp"))
    fs::copy_file(e.path(), to / e.path().filename());
  return to;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<const scan::Finding*> with_rule(const scan::FileReport& r, scan::Rule rule) {
  std::vector<const scan::Finding*> out;
  for (const auto& f : r.findings)
    if (f.rule == rule) out.push_back(&f);
  return out;
}

bool has_global(const scan::FileReport& r, const std::string& g, const std::string& member_prefix) {
  return std::any_of(r.findings.begin(), r.findings.end(),
                     [&](const scan::Finding& f) { return f.global == g && f.member.rfind(member_prefix, 0) == 0; });
}

std::size_t countable(const scan::FileReport& r) {
  return static_cast<std::size_t>(std::count_if(r.findings.begin(), r.findings.end(), [](const scan::Finding& f) {
    return f.severity != scan::Severity::kInfo;
  }));
}

}  // namespace

TEST_CASE("scan dcp: every real directory is one clean report, decided by the DCP reader") {
  for (const char* c : dcp_test::kCases) {
    CAPTURE(c);
    const fs::path dir = dcp_test::case_dir(c) / "dcp";
    std::vector<fs::path> covered;
    const scan::FileReport r = scan::scan_dcp_dir(dir, {}, &covered);
    CHECK(r.verdict == scan::Verdict::kClean);
    CHECK(r.format == "dcp_directory");
    CHECK(r.loader.ran);
    CHECK(r.loader.ok);
    CHECK(countable(r) == 0);
    CHECK(r.pickle_streams > 1);  // .metadata and the payloads' data.pkl
    // .metadata and every data file, nothing else.
    std::size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
    CHECK(covered.size() == files);
    std::uint64_t bytes = 0;
    for (const auto& p : covered) bytes += fs::file_size(p);
    CHECK(r.size == bytes);
    // The JSON report says who decided.
    const auto j = nlohmann::json::parse(scan::to_json({r}));
    CHECK(j["files"][0]["loader"]["by"] == "dcp");
    CHECK(j["files"][0]["format"] == "dcp_directory");
  }
}

TEST_CASE("scan dcp: an os.system pickle as .metadata is a critical finding on .metadata") {
  // PyTorch reads .metadata with plain pickle (weights_only=False): this one
  // runs os.system on dcp.load. The DCP reader refuses it; the scan names it.
  const fs::path d = copy_case("placements-ws2", fresh("meta") / "dcp");
  fs::copy_file(kCorpus / "mal_raw_pickle.pkl", d / ".metadata", fs::copy_options::overwrite_existing);
  std::vector<fs::path> covered;
  const scan::FileReport r = scan::scan_dcp_dir(d, {}, &covered);
  CHECK(r.verdict == scan::Verdict::kUnsafe);
  CHECK(has_global(r, "os.system", ".metadata"));
  CHECK_FALSE(r.loader.ok);
  CHECK(r.loader.code == ErrorCode::kDisallowedGlobal);
  CHECK(scan::exit_code({r}) == 1);
  scan::ReportOptions critical;
  critical.fail_on = scan::Severity::kCritical;
  CHECK(scan::exit_code({r}, critical) == 1);
  // Refused: the report covers what it scanned (.metadata), not the data files.
  CHECK(covered == std::vector<fs::path>{d / ".metadata"});
  fs::remove_all(d.parent_path());
}

TEST_CASE("scan dcp: a refused directory leaves its data files to the file scan, so a payload there is found") {
  // Review 2026-12-06: .metadata naming a missing data file made the report
  // cover every .distcp, and the os.system pickle in one was never scanned.
  const fs::path root = fresh("refused");
  const fs::path d = root / "dcp";
  fs::create_directories(d);
  write(d / ".metadata",
        dcp_test::metadata({dcp_test::Tensor{"w", {4, 3}, {dcp_test::Chunk{{0, 0}, {4, 3}, "__9_0.distcp"}}}}));
  fs::copy_file(kCorpus / "mal_os_system.pt", d / "__0_0.distcp");
  const auto reports = scan::scan_walk(scan::expand_paths({root}, {}));
  REQUIRE(reports.size() == 2);
  const scan::FileReport& dir = reports[0];
  CHECK(dir.format == "dcp_directory");
  // The missing data file is an io-error (high, never ignorable), not a damage to accept.
  REQUIRE(with_rule(dir, scan::Rule::kIo).size() == 1);
  CHECK(with_rule(dir, scan::Rule::kIo)[0]->message.find("__9_0.distcp") != std::string::npos);
  CHECK(reports[1].path == (d / "__0_0.distcp").string());
  CHECK(reports[1].verdict == scan::Verdict::kUnsafe);
  scan::ReportOptions high;
  high.fail_on = scan::Severity::kHigh;
  CHECK(scan::exit_code(reports, high) == 1);
  CHECK_FALSE(scan::parse_ignore("* SCK190", "t").has_value());
  fs::remove_all(root);
}

TEST_CASE("scan dcp: bytes of a data file that no item names are refused; a named covered file is still reported") {
  // Review 2026-12-06: a pickle ahead of (or after) the chunks of a data
  // file ran under torch.load(file) while the directory scanned clean.
  const fs::path root = fresh("gap");
  const fs::path d = copy_case("placements-ws2", root / "dcp");
  {
    std::ifstream in(kCorpus / "mal_raw_pickle.pkl", std::ios::binary);
    std::ofstream out(d / "__1_0.distcp", std::ios::binary | std::ios::app);
    out << in.rdbuf();
  }
  const scan::FileReport r = scan::scan_dcp_dir(d);
  CHECK(r.verdict != scan::Verdict::kClean);
  const auto refused = with_rule(r, scan::Rule::kLoaderRefused);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0]->message.find("__1_0.distcp holds") != std::string::npos);
  // The whole walk: the refused directory's data files are scanned as files.
  const auto reports = scan::scan_walk(scan::expand_paths({root}, {}));
  CHECK(scan::exit_code(reports) == 1);
  CHECK(std::any_of(reports.begin(), reports.end(),
                    [&](const scan::FileReport& x) { return x.path == (d / "__1_0.distcp").string(); }));
  // An intact directory with one of its data files also named: that file gets its own report.
  const fs::path ok = copy_case("placements-ws2", root / "ok");
  const auto named = scan::scan_walk(scan::expand_paths({ok, ok / "__0_0.distcp"}, {}));
  REQUIRE(named.size() == 2);
  CHECK(named[0].format == "dcp_directory");
  CHECK(named[1].path == (ok / "__0_0.distcp").string());
  // ... however it is spelled (found first by the walk as ok/__0_0.distcp).
  const auto spelled = scan::scan_walk(scan::expand_paths({ok, ok / "." / "__0_0.distcp"}, {}));
  REQUIRE(spelled.size() == 2);
  CHECK(fs::path(spelled[1].path).lexically_normal() == (ok / "__0_0.distcp").lexically_normal());
  // `d` and `d/`: one report.
  CHECK(scan::scan_walk(scan::expand_paths({ok, fs::path(ok.string() + "/")}, {})).size() == 1);
  fs::remove_all(root);
}

TEST_CASE("scan dcp: a chunk payload that runs code is found inside its data file") {
  // Hand-written metadata: one float32 [4, 3] tensor whose one chunk is the
  // whole of __0_0.distcp, here PyTorch's torch.save of an os.system call.
  const fs::path d = fresh("chunk");
  const std::string payload = [] {
    std::ifstream in(kCorpus / "mal_os_system.pt", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  REQUIRE(payload.size() >= 48);
  write(d / ".metadata",
        dcp_test::metadata({dcp_test::Tensor{
            "w",
            {4, 3},
            {dcp_test::Chunk{{0, 0}, {4, 3}, "__0_0.distcp", 0, static_cast<std::int64_t>(payload.size())}}}}));
  write(d / "__0_0.distcp", payload);
  const scan::FileReport r = scan::scan_dcp_dir(d);
  CHECK(r.verdict == scan::Verdict::kUnsafe);
  CHECK(has_global(r, "os.system", "__0_0.distcp@0!"));
  const auto refused = with_rule(r, scan::Rule::kLoaderRefused);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0]->member == "__0_0.distcp@0");
  CHECK(refused[0]->severity == scan::Severity::kHigh);
  // The same file scanned alone says the same about its pickle.
  const scan::FileReport alone = scan::scan_file(kCorpus / "mal_os_system.pt");
  CHECK(alone.verdict == scan::Verdict::kUnsafe);
  fs::remove_all(d);
}

TEST_CASE("scan dcp: a damaged data file is incomplete, and --fail-on applies as for files") {
  const fs::path d = copy_case("placements-ws2", fresh("short") / "dcp");
  fs::resize_file(d / "__0_0.distcp", fs::file_size(d / "__0_0.distcp") - 100);
  const scan::FileReport r = scan::scan_dcp_dir(d);
  CHECK(r.verdict == scan::Verdict::kIncomplete);
  const auto refused = with_rule(r, scan::Rule::kLoaderRefused);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0]->severity == scan::Severity::kMedium);
  CHECK(refused[0]->message.find("__0_0.distcp") != std::string::npos);
  CHECK(scan::exit_code({r}) == 1);
  scan::ReportOptions high;
  high.fail_on = scan::Severity::kHigh;
  CHECK(scan::exit_code({r}, high) == 0);
  fs::remove_all(d.parent_path());
}

TEST_CASE("scan dcp: a walk finds DCP directories at any depth; their files are not scanned again, others are") {
  // Review 2026-12-06: `scan PARENT` reported every .distcp as INCOMPLETE.
  const fs::path root = fresh("walk");
  copy_case("uneven-ws4", root / "runs" / "step100");
  copy_case("mesh2d-ws4", root / "step200");
  fs::copy_file(kCorpus / "mal_os_system.pt", root / "runs" / "step100" / "evil.pt");
  fs::copy_file(kCorpus / "mlp_state_dict.pt", root / "model.pt");
  const scan::WalkResult w = scan::expand_paths({root}, {});
  CHECK(w.dcp_dirs.size() == 2);
  const auto reports = scan::scan_walk(w);
  std::vector<std::string> paths;
  paths.reserve(reports.size());
  for (const auto& r : reports) paths.push_back(fs::path(r.path).lexically_relative(root).generic_string());
  std::sort(paths.begin(), paths.end());
  CHECK(paths == std::vector<std::string>{"model.pt", "runs/step100", "runs/step100/evil.pt", "step200"});
  for (const auto& r : reports) {
    CAPTURE(r.path);
    const bool evil = r.path.find("evil.pt") != std::string::npos;
    CHECK((r.verdict == scan::Verdict::kUnsafe) == evil);
  }
  // A glob that leaves a DCP directory out leaves its files to the globs too.
  scan::WalkOptions only_pt;
  only_pt.include = {"*.pt"};
  const scan::WalkResult w2 = scan::expand_paths({root}, only_pt);
  CHECK(w2.dcp_dirs.empty());
  CHECK(scan::scan_walk(w2).size() == 2);  // model.pt, evil.pt
  // Named twice (itself and its parent): one report.
  CHECK(scan::scan_walk(scan::expand_paths({root / "step200", root}, {})).size() == 4);
  // A file spelled twice, or named and found under a named directory: one report each.
  const fs::path model = root / "model.pt";
  CHECK(scan::scan_walk(scan::expand_paths({model, root / "." / "model.pt", model}, {})).size() == 1);
  CHECK(scan::scan_walk(scan::expand_paths({model, root}, {})).size() == 4);
  fs::remove_all(root);
}

TEST_CASE("scan: a sharded safetensors index is followed to its shards") {
  // Review 2026-12-06: scanning only model.safetensors.index.json said "not a
  // model" without opening a shard.
  const fs::path ref = fs::path(SAFECKPT_TEST_DATA) / "safetensors-ref";
  const scan::FileReport ok = scan::scan_file(ref / "model.safetensors.index.json");
  CHECK(ok.format == "safetensors_index");
  CHECK(ok.verdict == scan::Verdict::kClean);
  CHECK(ok.loader.ok);
  const fs::path d = fresh("index");
  for (const char* f : {"model.safetensors.index.json", "model-00001-of-00002.safetensors"})
    fs::copy_file(ref / f, d / f);
  // The second shard is missing: the index cannot load.
  const scan::FileReport missing = scan::scan_file(d / "model.safetensors.index.json");
  CHECK(missing.verdict != scan::Verdict::kClean);
  CHECK(scan::exit_code({missing}) == 1);
  // Not readable: an io-error (high, never ignorable), naming the shard.
  REQUIRE(with_rule(missing, scan::Rule::kIo).size() == 1);
  CHECK(with_rule(missing, scan::Rule::kIo)[0]->message.find("model-00002-of-00002.safetensors") != std::string::npos);
  // A shard that is a pickle, not safetensors, under a .safetensors name:
  // scanned by content, named as the member.
  fs::copy_file(kCorpus / "mal_os_system.pt", d / "model-00002-of-00002.safetensors");
  const scan::FileReport swapped = scan::scan_file(d / "model.safetensors.index.json");
  CHECK(swapped.verdict == scan::Verdict::kUnsafe);
  CHECK(has_global(swapped, "os.system", "model-00002-of-00002.safetensors"));
  fs::remove_all(d);
}

TEST_CASE("scan: an index of .bin shards (pytorch_model.bin.index.json) scans every shard it names") {
  // Review 2026-12-06: any non-safetensors shard made the index "not a
  // model", exit 0, while transformers torch.loads each shard.
  const fs::path d = fresh("bin_index");
  write(d / "pytorch_model.bin.index.json",
        R"({"metadata": {"total_size": 1}, "weight_map": {"a": "pytorch_model-00001-of-00002.bin",)"
        R"( "b": "pytorch_model-00002-of-00002.bin"}})");
  fs::copy_file(kCorpus / "mlp_state_dict.pt", d / "pytorch_model-00001-of-00002.bin");
  fs::copy_file(kCorpus / "mlp_state_dict.pt", d / "pytorch_model-00002-of-00002.bin");
  const scan::FileReport ok = scan::scan_file(d / "pytorch_model.bin.index.json");
  CHECK(ok.format == "safetensors_index");
  CHECK(ok.verdict == scan::Verdict::kClean);
  CHECK(ok.loader.ok);
  fs::copy_file(kCorpus / "mal_os_system.pt", d / "pytorch_model-00002-of-00002.bin",
                fs::copy_options::overwrite_existing);
  const scan::FileReport bad = scan::scan_file(d / "pytorch_model.bin.index.json");
  CHECK(bad.verdict == scan::Verdict::kUnsafe);
  CHECK(has_global(bad, "os.system", "pytorch_model-00002-of-00002.bin"));
  scan::ReportOptions critical;
  critical.fail_on = scan::Severity::kCritical;
  CHECK(scan::exit_code({bad}, critical) == 1);
  // A shard named outside the directory is refused by the index rules, not read.
  write(d / "pytorch_model.bin.index.json", R"({"weight_map": {"a": "../x.bin"}})");
  const scan::FileReport out = scan::scan_file(d / "pytorch_model.bin.index.json");
  CHECK(out.verdict != scan::Verdict::kClean);
  CHECK(out.members == 0);  // nothing was opened
  // Not examined, so never an ignorable damage: SCK190, high (transformers would load ../x.bin).
  REQUIRE(with_rule(out, scan::Rule::kIo).size() == 1);
  CHECK(with_rule(out, scan::Rule::kIo)[0]->severity == scan::Severity::kHigh);
  fs::remove_all(d);
}
