// DTensors inside ordinary torch.save files: tests/data/dcp-2.11/*/ranks/
// rank<r>.pt, written by PyTorch 2.11 (gen_dcp.py: torch.save of each rank's
// state dict of DTensors; FSDP2: model.state_dict()). What PyTorch had on each
// rank is in rank<r>.local.json (local shape, global shape, placements, mesh);
// what DTensor.full_tensor() gave is full.safetensors. The loader reads them
// with allowlist/dtensor.allow (src/torch/dtensor.cpp), gather_dtensor_ranks
// puts the shards together (src/dcp/gather.cpp).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/dcp.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/save.hpp"
#include "safeckpt/zip.hpp"
#include "support/dcp_cases.hpp"
#include "support/run_cli.hpp"
#include "support/save_util.hpp"
#include "support/zip_builder.hpp"

using namespace safeckpt;
namespace fs = std::filesystem;
using dcp_test::case_dir;
using dcp_test::kCases;
using save_test::TempDir;
using test_support::run_cli;
using test_support::ZipBuilder;

namespace {

const Allowlist& dtensor_allow() {
  static const Allowlist a = [] {
    Allowlist x = Allowlist::default_policy();
    auto st = x.add_file(fs::path(SAFECKPT_SOURCE_DIR) / "allowlist" / "dtensor.allow");
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    return x;
  }();
  return a;
}

Result<Checkpoint> load_rank(const fs::path& file) {
  LoadOptions o;
  o.allowlist = &dtensor_allow();
  return load(file, o);
}

Result<Checkpoint> load_rank_bytes(const std::vector<std::uint8_t>& bytes) {
  LoadOptions o;
  o.allowlist = &dtensor_allow();
  return load_bytes(Bytes{bytes.data(), bytes.size()}, o);
}

std::vector<fs::path> rank_files(const std::string& name) {
  std::vector<fs::path> out;
  for (int r = 0;; ++r) {
    fs::path p = case_dir(name) / "ranks" / ("rank" + std::to_string(r) + ".pt");
    if (!fs::exists(p)) break;
    out.push_back(p);
  }
  return out;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), p.string());
  return nlohmann::json::parse(in);
}

std::vector<std::int64_t> mesh_shape_of(const nlohmann::json& mesh) {
  std::vector<std::int64_t> s;
  const nlohmann::json* m = &mesh;
  while (m->is_array()) {
    s.push_back(static_cast<std::int64_t>(m->size()));
    if (m->empty()) break;
    m = &(*m)[0];
  }
  return s;
}

std::string placement_text(const DTensorPlacement& p) {
  if (p.kind == DTensorPlacement::Kind::kShard) return "Shard(dim=" + std::to_string(p.dim) + ")";
  if (p.kind == DTensorPlacement::Kind::kReplicate) return "Replicate()";
  return "Partial(" + p.reduce_op + ")";
}

// name -> contiguous bytes of every tensor of a loaded checkpoint.
std::map<std::string, std::vector<std::uint8_t>> tensor_bytes(const Checkpoint& c) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const auto& nt : c.state_dict()) {
    auto b = c.contiguous_bytes(nt.tensor);
    REQUIRE_MESSAGE(b.has_value(), nt.name);
    out.emplace(nt.name, std::move(*b));
  }
  return out;
}

// The rank file's key in full.safetensors: the same FQN, or under "model."
// (gen_dcp.py saved sd["model"] / model.state_dict() per rank; DCP's FQNs
// carry the prefix).
std::string full_key(const std::map<std::string, std::vector<std::uint8_t>>& full, const std::string& k) {
  if (full.count(k)) return k;
  return "model." + k;
}

// The bytes of rank0.pt with data.pkl passed through `edit` (stored zip, real CRCs).
std::vector<std::uint8_t> edited_rank0(const std::string& name, const std::function<void(std::string&)>& edit) {
  auto mf = MappedFile::open(case_dir(name) / "ranks" / "rank0.pt");
  REQUIRE(mf.has_value());
  auto zip = ZipArchive::open(mf->bytes(), Limits{});
  REQUIRE(zip.has_value());
  ZipBuilder out(zip->root());
  for (const auto& e : zip->entries()) {
    auto rec = zip->read(e, true);
    REQUIRE(rec.has_value());
    std::string data(reinterpret_cast<const char*>(rec->bytes.data()), rec->bytes.size());
    if (e.name.size() >= 8 && e.name.compare(e.name.size() - 8, 8, "data.pkl") == 0) edit(data);
    out.add(e.name, data, true);
  }
  return out.finish();
}

}  // namespace

TEST_CASE("dtensor files: without allowlist/dtensor.allow they are refused, naming the remedy") {
  // PyTorch 2.11 refuses them too until `import torch.distributed.tensor` (weights_only.json).
  for (const char* name : kCases) {
    CAPTURE(name);
    auto r = load(case_dir(name) / "ranks" / "rank0.pt");
    REQUIRE(!r.has_value());
    CHECK(r.error().code() == ErrorCode::kDisallowedGlobal);
    const std::string msg = r.error().to_string();
    CAPTURE(msg);
    CHECK(msg.find("is part of a DTensor") != std::string::npos);
    CHECK(msg.find("--allow dtensor") != std::string::npos);
  }
}

TEST_CASE("dtensor files: each DTensor loads as PyTorch's local shard with its mesh and placements") {
  for (const char* name : kCases) {
    const auto files = rank_files(name);
    REQUIRE(files.size() >= 2);
    for (std::size_t r = 0; r < files.size(); ++r) {
      CAPTURE(name);
      CAPTURE(r);
      auto ck = load_rank(files[r]);
      REQUIRE_MESSAGE(ck.has_value(), (ck ? "" : ck.error().to_string()));
      const auto local = read_json(case_dir(name) / "ranks" / ("rank" + std::to_string(r) + ".local.json"));
      std::map<std::string, std::uint32_t> by_name;
      for (const auto& nt : ck->state_dict()) by_name.emplace(nt.name, nt.tensor);
      // Exactly the tensors PyTorch had as DTensors are DTensors (expected.json:
      // kind per DCP FQN; the rank file's names lack the "model." prefix).
      const auto expected = read_json(case_dir(name) / "expected.json")["items"];
      for (const auto& nt : ck->state_dict()) {
        CAPTURE(nt.name);
        const std::string fqn = expected.contains(nt.name) ? nt.name : "model." + nt.name;
        REQUIRE(expected.contains(fqn));
        CHECK((ck->tensors()[nt.tensor].dtensor != nullptr) == (expected[fqn]["kind"] == "dtensor"));
      }
      for (const auto& [key, want] : local.items()) {
        CAPTURE(key);
        REQUIRE(by_name.count(key) == 1);
        const TensorInfo& t = ck->tensors()[by_name.at(key)];
        REQUIRE(t.dtensor != nullptr);
        const DTensorInfo& d = *t.dtensor;
        CHECK(t.shape == want["local_shape"].get<std::vector<std::int64_t>>());
        CHECK(d.local_shape == t.shape);
        CHECK(d.global_shape == want["shape"].get<std::vector<std::int64_t>>());
        CHECK(d.mesh_shape == mesh_shape_of(want["mesh"]));
        std::vector<std::string> pl;
        for (const auto& p : d.placements) pl.push_back(placement_text(p));
        CHECK(pl == want["placements"].get<std::vector<std::string>>());
        CHECK(d.rank == static_cast<std::int64_t>(r));
        CHECK(d.mesh_device_type == "cpu");
      }
    }
  }
}

TEST_CASE("dtensor files: gathering every rank's file gives DTensor.full_tensor() byte for byte") {
  for (const char* name : kCases) {
    CAPTURE(name);
    auto full_ck = open(case_dir(name) / "full.safetensors");
    REQUIRE(full_ck.has_value());
    const auto full = tensor_bytes(*full_ck);
    std::vector<Checkpoint> loaded;
    for (const auto& f : rank_files(name)) {
      auto ck = load_rank(f);
      REQUIRE(ck.has_value());
      loaded.push_back(std::move(*ck));
    }
    // Any order: each file says its coordinate.
    std::vector<const Checkpoint*> ptrs;
    for (auto it = loaded.rbegin(); it != loaded.rend(); ++it) ptrs.push_back(&*it);
    std::vector<std::string> notes;
    auto g = gather_dtensor_ranks(ptrs, {}, &notes);
    REQUIRE_MESSAGE(g.has_value(), (g ? "" : g.error().to_string()));
    const auto got = tensor_bytes(*g);
    REQUIRE(got.size() == loaded[0].state_dict().size());
    for (const auto& [k, bytes] : got) {
      CAPTURE(k);
      const std::string fk = full_key(full, k);
      REQUIRE(full.count(fk) == 1);
      CHECK(bytes == full.at(fk));
    }
    // Shapes and dtypes as PyTorch's full tensors.
    std::map<std::string, const TensorInfo*> full_info;
    for (const auto& nt : full_ck->state_dict()) full_info[nt.name] = &full_ck->tensors()[nt.tensor];
    for (const auto& nt : g->state_dict()) {
      const TensorInfo& t = g->tensors()[nt.tensor];
      const TensorInfo& f = *full_info.at(full_key(full, nt.name));
      CHECK(t.shape == f.shape);
      CHECK(t.dtype == f.dtype);
      CHECK(t.dtensor == nullptr);
    }
    // Saved and read back: a plain checkpoint with the full tensors.
    TempDir tmp;
    SaveOptions so;
    so.fsync = false;
    REQUIRE(save(tmp.path / "full.pt", *g, so).has_value());
    auto back = load(tmp.path / "full.pt");
    REQUIRE(back.has_value());
    CHECK(tensor_bytes(*back) == got);
  }
}

TEST_CASE("dtensor files: a local shard is never written as a whole tensor") {
  auto ck = load_rank(case_dir("placements-ws2") / "ranks" / "rank0.pt");
  REQUIRE(ck.has_value());
  TempDir tmp;
  SaveOptions so;
  so.fsync = false;
  auto st = save(tmp.path / "shard.pt", *ck, so);
  REQUIRE(!st.has_value());
  CHECK(st.error().code() == ErrorCode::kUnsupported);
  CHECK(st.error().message().find("local shard") != std::string::npos);
  CHECK(!fs::exists(tmp.path / "shard.pt"));
}

TEST_CASE("dtensor files: rank sets that do not make the tensor are refused, naming the tensor") {
  std::vector<Checkpoint> ws2;
  for (const auto& f : rank_files("placements-ws2")) {
    auto ck = load_rank(f);
    REQUIRE(ck.has_value());
    ws2.push_back(std::move(*ck));
  }
  SUBCASE("one rank missing") {
    auto g = gather_dtensor_ranks({&ws2[0]});
    REQUIRE(!g.has_value());
    CHECK(g.error().code() == ErrorCode::kInvalidArgument);
    CHECK(g.error().message().find("1 rank files given") != std::string::npos);
  }
  SUBCASE("the same rank twice") {
    auto g = gather_dtensor_ranks({&ws2[0], &ws2[0]});
    REQUIRE(!g.has_value());
    CHECK(g.error().code() == ErrorCode::kInvalidArgument);
    CHECK(g.error().message().find("mesh coordinate") != std::string::npos);
  }
  SUBCASE("files of another job") {
    std::vector<Checkpoint> ws4;
    for (const auto& f : rank_files("uneven-ws4")) {
      auto ck = load_rank(f);
      REQUIRE(ck.has_value());
      ws4.push_back(std::move(*ck));
    }
    auto g = gather_dtensor_ranks({&ws2[0], &ws4[1]});
    REQUIRE(!g.has_value());
    CHECK(g.error().code() == ErrorCode::kInvalidArgument);
  }
  SUBCASE("a rank file claiming another rank's coordinate") {
    // rank0.pt with every DeviceMesh._coordinate_on_dim (0,) rewritten to
    // (1,): rank 1's boxes are 1 row shorter for the uneven "layers.0" (9
    // rows: 5 + 4), so the loader refuses the file.
    auto bytes = edited_rank0("placements-ws2", [](std::string& pkl) {
      const std::string key = std::string("X\x12\x00\x00\x00_coordinate_on_dim", 23);
      std::size_t n = 0;
      for (std::size_t at = pkl.find(key); at != std::string::npos; at = pkl.find(key, at + 1)) {
        std::size_t k = pkl.find(std::string("K\x00\x85", 3), at + key.size());  // BININT1 0, TUPLE1
        REQUIRE(k != std::string::npos);
        REQUIRE(k - at < key.size() + 8);
        pkl[k + 1] = '\x01';
        ++n;
      }
      REQUIRE(n >= 1);
    });
    auto moved = load_rank_bytes(bytes);
    REQUIRE(!moved.has_value());
    CHECK(moved.error().code() == ErrorCode::kMalformed);
    CHECK(moved.error().message().find("the local tensor has shape [5], the placements give [4] at mesh coordinate "
                                       "[1]") != std::string::npos);
  }
}

TEST_CASE("dtensor files: a local tensor that disagrees with its placements is refused by the loader") {
  // "a" is Shard(0) of a [12, 5] tensor over 2 ranks: local [6, 5]. The file
  // edited to say the global tensor is [14, 5] (wrapper size and TensorMeta)
  // makes the placements give [7, 5].
  auto bytes = edited_rank0("placements-ws2", [](std::string& pkl) {
    const std::string size = std::string(
        "K\x0c"
        "K\x05\x86",
        5);
    std::size_t n = 0;
    for (std::size_t at = pkl.find(size); at != std::string::npos && n < 2; at = pkl.find(size, at + 1), ++n)
      pkl[at + 1] = '\x0e';
    REQUIRE(n == 2);
  });
  auto r = load_rank_bytes(bytes);
  REQUIRE(!r.has_value());
  CHECK(r.error().code() == ErrorCode::kMalformed);
  CHECK(r.error().message().find("the local tensor has shape [6, 5], the placements give [7, 5]") != std::string::npos);
}

TEST_CASE("safeckpt convert --rank: per-rank DTensor files into one safetensors file") {
  TempDir tmp;
  const fs::path out = tmp.path / "full.safetensors";
  std::string args = "convert";
  for (const auto& f : rank_files("mesh2d-ws4")) args += " --rank '" + f.string() + "'";
  args += " '" + out.string() + "'";
  auto res = run_cli(args, true);
  CAPTURE(res.out);
  REQUIRE(res.code == 0);
  auto mine = open(out);
  REQUIRE(mine.has_value());
  auto ref = open(case_dir("mesh2d-ws4") / "full.safetensors");
  REQUIRE(ref.has_value());
  CHECK(tensor_bytes(*mine) == tensor_bytes(*ref));
  // Without --rank the same file is refused with the remedy.
  auto one = run_cli("convert '" + (case_dir("mesh2d-ws4") / "ranks" / "rank0.pt").string() + "' '" +
                         (tmp.path / "one.safetensors").string() + "'",
                     true);
  CHECK(one.code == 1);
  CHECK(one.out.find("--allow dtensor") != std::string::npos);
}
