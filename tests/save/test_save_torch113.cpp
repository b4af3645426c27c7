// Differential: files safeckpt writes, read back by a real PyTorch.
//
// Uses Debian's PyTorch 1.13 (/usr/bin/python3; the python3 on PATH has no
// torch) through tests/interop/check_torch_load.py, which loads each file
// with torch.load (weights_only=True, or weights_only=False where 1.13's
// restricted unpickler lacks BINFLOAT/torch.device/dtype globals — the
// script records which) and prints the typed tree of tests/data/corpus. The
// tree must equal safeckpt::to_json of what we saved. Skips cleanly when
// /usr/bin/python3 or its torch is missing. The same script runs on the GPU
// machine against PyTorch 2.11 with --require-weights-only.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>

#include "safeckpt/builder.hpp"
#include "safeckpt/hash.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"
#include "support/save_util.hpp"

using namespace safeckpt;
using namespace safeckpt::save_test;

namespace {

const char* kPython = "/usr/bin/python3";

bool have_torch() {
  if (!fs::exists(kPython)) return false;
  std::string cmd = std::string(kPython) + " -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// What PyTorch 1.13 cannot rebuild at all (not a defect of the file):
// dtypes without a legacy storage class (_rebuild_tensor_v3 came in 2.x) and
// compressed sparse layouts (1.13's _rebuild_sparse_tensor is COO only).
std::string needs_newer_torch(const Checkpoint& c) {
  for (const auto& t : c.tensors()) {
    if (storage_class_for(t.dtype).empty()) return "dtype " + std::string(dtype_name(t.dtype));
    if (t.layout != Layout::kStrided && t.layout != Layout::kSparseCoo) return "compressed sparse layout";
    if (t.conj || t.neg) return "conj/neg metadata";
  }
  return "";
}

}  // namespace

TEST_CASE("save: PyTorch 1.13 reads what we write (torch.load, typed trees compared)") {
  if (!have_torch()) {
    MESSAGE("SKIP: /usr/bin/python3 with torch not available");
    return;
  }
  TempDir dir;
  struct Case {
    std::string name;
    fs::path file;
    json tree;  // our view
  };
  std::vector<Case> cases;
  std::vector<std::string> skipped;
  int legacy_cases = 0;
  for (const auto& [name, path] : corpus_files()) {
    auto r = load(path);
    if (!r) continue;
    std::string why = needs_newer_torch(*r);
    if (!why.empty()) {
      skipped.push_back(name + " (" + why + ")");
      continue;
    }
    std::string stem = name;
    for (auto& ch : stem)
      if (ch == '/' || ch == '.' || ch == '-') ch = '_';
    fs::path out = dir.path / (stem + ".pt");
    auto st = save(out, *r);
    REQUIRE_MESSAGE(st.has_value(), name << ": " << (st ? "" : st.error().to_string()));
    cases.push_back({name, out, tree_json(*r)});
    // The legacy (pre-1.6) layout too, where it can hold the file (one
    // typed storage class per storage, as torch's _legacy_save requires).
    fs::path out_legacy = dir.path / (stem + ".legacy.pt");
    SaveOptions lo;
    lo.legacy_format = true;
    auto sl = save(out_legacy, *r, lo);
    if (sl) {
      cases.push_back({name + " (legacy)", out_legacy, tree_json(*r)});
      ++legacy_cases;
    } else {
      REQUIRE_MESSAGE(sl.error().code() == ErrorCode::kUnsupported, sl.error().to_string());
    }
  }
  {
    CheckpointBuilder b;
    std::vector<std::uint8_t> w(24);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::uint8_t>(i * 13);
    REQUIRE(b.add_state_dict_tensor("fc.weight", DType::kFloat32, {2, 3}, w).has_value());
    REQUIRE(b.add_state_dict_tensor("fc.idx", DType::kInt64, {3}, std::vector<std::uint8_t>(w)).has_value());
    REQUIRE(b.add_state_dict_tensor("p", DType::kFloat16, {4}, std::vector<std::uint8_t>(8, 1), true).has_value());
    REQUIRE(b.add_state_dict_value("step", b.integer(1 << 20)).has_value());
    auto c = std::move(b).finish();
    REQUIRE(c.has_value());
    fs::path out = dir.path / "built.pt";
    REQUIRE(save(out, *c).has_value());
    cases.push_back({"built", out, tree_json(*c)});
  }
  REQUIRE(cases.size() >= 20);
  fs::path result = dir.path / "result.json";
  std::string cmd = std::string(kPython) + " " +
                    (fs::path(SAFECKPT_SOURCE_DIR) / "tests/interop/check_torch_load.py").string() + " --out " +
                    result.string();
  for (const auto& c : cases) cmd += " " + c.file.string();
  cmd += " 2>" + (dir.path / "stderr.txt").string();
  int rc = std::system(cmd.c_str());
  std::ifstream in(result);
  REQUIRE_MESSAGE(in.good(), "check_torch_load.py wrote no result (rc " << rc << ")");
  json res = json::parse(in);
  int weights_only = 0;
  for (const auto& c : cases) {
    const json& r = res.at(c.file.string());
    REQUIRE_MESSAGE(r.value("ok", false), c.name << ": torch 1.13 failed: " << r.value("error", std::string()));
    if (r.value("weights_only", false)) ++weights_only;
    json theirs = r.at("tree");
    normalize(theirs);
    std::string d = first_diff(theirs, c.tree);
    CHECK_MESSAGE(d.empty(), c.name << ": torch 1.13 sees " << d);
  }
  MESSAGE("torch 1.13 loaded " << cases.size() << " files we wrote (" << legacy_cases << " in the legacy format, "
                               << weights_only << " with weights_only=True); skipped " << skipped.size()
                               << " that need a newer torch");
  CHECK(weights_only >= 5);
  CHECK(legacy_cases >= 20);
}

TEST_CASE("safetensors: files we write read back in Python (safetensors, or an independent reader)") {
  if (!have_torch()) {
    MESSAGE("SKIP: /usr/bin/python3 with torch not available");
    return;
  }
  TempDir dir;
  std::vector<std::pair<fs::path, const Checkpoint*>> files;
  std::vector<Checkpoint> keep;
  for (const char* n : {"mlp_state_dict.pt", "training_checkpoint.pt", "views_shared_storage.pt",
                        "scalars_and_empty.pt", "conv_bn_state_dict.pt"}) {
    auto r = load(corpus_dir("torch-2.11") / n);
    REQUIRE(r.has_value());
    keep.push_back(std::move(*r));
  }
  for (std::size_t i = 0; i < keep.size(); ++i) {
    fs::path out = dir.path / ("f" + std::to_string(i) + ".safetensors");
    ToSafetensorsOptions to;
    to.drop_non_tensors = true;
    REQUIRE(save_checkpoint_as_safetensors(out, keep[i], to).has_value());
    files.emplace_back(out, &keep[i]);
  }
  fs::path result = dir.path / "result.json";
  std::string cmd = std::string(kPython) + " " +
                    (fs::path(SAFECKPT_SOURCE_DIR) / "tests/interop/check_torch_load.py").string() + " --out " +
                    result.string();
  for (const auto& f : files) cmd += " " + f.first.string();
  cmd += " 2>/dev/null";
  (void)std::system(cmd.c_str());
  std::ifstream in(result);
  REQUIRE(in.good());
  json res = json::parse(in);
  for (const auto& [path, ckpt] : files) {
    const json& r = res.at(path.string());
    REQUIRE_MESSAGE(r.value("ok", false), path << ": " << r.value("error", std::string()));
    const json& ts = r.at("tensors");
    auto sd = ckpt->state_dict();
    CHECK(ts.size() == sd.size());
    for (const auto& nt : sd) {
      std::string key = nt.name.empty() ? "tensor" : nt.name;
      REQUIRE_MESSAGE(ts.contains(key), key);
      auto bytes = ckpt->contiguous_bytes(nt.tensor);
      REQUIRE(bytes.has_value());
      CHECK_MESSAGE(ts[key]["sha256"].get<std::string>() == sha256_hex(*bytes), key);
      CHECK(ts[key]["dtype"].get<std::string>() == dtype_name(ckpt->tensors()[nt.tensor].dtype));
    }
  }
}
