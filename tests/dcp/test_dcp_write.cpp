// save_dcp (safeckpt/dcp.hpp "Writing a DCP directory"): real checkpoints
// (the PyTorch 2.11 DCP directories consolidated, the 2.11 corpus) written as
// DCP directories and read back with DcpCheckpoint: every tensor equals its
// source byte for byte, non-tensor items equal PyTorch's recorded values, and
// refusals leave nothing behind. That PyTorch 2.11's dcp.load reads what
// save_dcp writes is checked on the GPU machine (tests/gen/check_to_dcp.py,
// result in tests/data/dcp-2.11/README.md).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safeckpt/builder.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/dcp.hpp"
#include "safeckpt/safetensors.hpp"
#include "support/dcp_cases.hpp"
#include "support/save_util.hpp"

using namespace safeckpt;
namespace fs = std::filesystem;
using dcp_test::case_dir;
using dcp_test::kCases;
using save_test::TempDir;

namespace {

DcpCheckpoint open_dcp(const fs::path& dir) {
  auto r = DcpCheckpoint::open(dir);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  return std::move(*r);
}

std::vector<std::uint8_t> whole(const DcpCheckpoint& c, const DcpTensor& t) {
  DcpBox box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
  std::uint64_t n = dtype_size(t.dtype);
  for (auto s : t.shape) n *= static_cast<std::uint64_t>(s);
  std::vector<std::uint8_t> out(n);
  auto st = load_dcp_box(c, t, box, out.data(), n);
  REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
  return out;
}

std::string path_text(const std::vector<DcpPathKey>& p) {
  std::string s;
  for (const auto& k : p) s += (k.is_index ? "#" + std::to_string(k.index) : k.key) + "/";
  return s;
}

DcpWriteOptions fast() {
  DcpWriteOptions o;
  o.fsync = false;
  return o;
}

}  // namespace

TEST_CASE("dcp write: consolidated PyTorch 2.11 directories written back read the same") {
  for (const char* name : kCases) {
    CAPTURE(name);
    TempDir tmp;
    DcpCheckpoint src = open_dcp(case_dir(name) / "dcp");
    auto ck = dcp_to_checkpoint(src, tmp.path);
    REQUIRE_MESSAGE(ck.has_value(), (ck ? "" : ck.error().to_string()));
    const fs::path out = tmp.path / "out";
    auto w = save_dcp(*ck, out, fast());
    REQUIRE_MESSAGE(w.has_value(), (w ? "" : w.error().to_string()));
    CHECK(w->tensors == src.tensors().size());
    CHECK(w->bytes_items == src.bytes_items().size());
    DcpCheckpoint got = open_dcp(out);
    CHECK(got.version() == "1.0.0");
    REQUIRE(got.files().size() == 1);
    CHECK(got.files()[0].name == "__0_0.distcp");
    CHECK(got.files()[0].size == w->data_bytes);
    // The same items with the same nesting (planner_data). The order is not
    // compared: PyTorch's comes from merging several ranks' plans (replicated
    // items are written by one rank), ours is the flattening order.
    REQUIRE(got.items().size() == src.items().size());
    const auto listing = [](const DcpCheckpoint& c) {
      std::vector<std::string> lines;
      for (const DcpItemRef& r : c.items()) {
        const std::string& fqn = r.is_tensor ? c.tensors()[r.index].fqn : c.bytes_items()[r.index].fqn;
        const auto& path = r.is_tensor ? c.tensors()[r.index].path : c.bytes_items()[r.index].path;
        lines.push_back(fqn + (r.is_tensor ? " tensor " : " bytes ") + path_text(path));
      }
      std::sort(lines.begin(), lines.end());
      return lines;
    };
    CHECK(listing(got) == listing(src));
    // Tensors: one chunk each, bytes equal to PyTorch's full_tensor().
    auto full = SafetensorsFile::open(case_dir(name) / "full.safetensors");
    REQUIRE_MESSAGE(full.has_value(), (full ? "" : full.error().to_string()));
    for (const DcpTensor& t : got.tensors()) {
      CAPTURE(t.fqn);
      const DcpTensor* s = src.find_tensor(t.fqn);
      REQUIRE(s != nullptr);
      CHECK(t.dtype == s->dtype);
      CHECK(t.shape == s->shape);
      CHECK(t.chunks.size() == 1);
      const SafetensorsTensor* ref = full->find(t.fqn);
      REQUIRE(ref != nullptr);
      CHECK(whole(got, t) == std::vector<std::uint8_t>(ref->data.begin(), ref->data.end()));
    }
    // Non-tensor items: the same values as in PyTorch's directory.
    for (std::size_t i = 0; i < got.bytes_items().size(); ++i) {
      CAPTURE(got.bytes_items()[i].fqn);
      auto a = got.load_bytes_item(got.bytes_items()[i]);
      auto b = src.load_bytes_item(src.bytes_items()[i]);
      REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.error().to_string()));
      REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
      auto ja = to_json(*a), jb = to_json(*b);
      REQUIRE(ja.has_value());
      REQUIRE(jb.has_value());
      CHECK(*ja == *jb);
    }
    // Consolidating what we wrote gives PyTorch's consolidated tree again.
    auto again = dcp_to_checkpoint(got, tmp.path);
    REQUIRE_MESSAGE(again.has_value(), (again ? "" : again.error().to_string()));
    auto j1 = to_json(*ck), j2 = to_json(*again);
    REQUIRE(j1.has_value());
    REQUIRE(j2.has_value());
    CHECK(*j1 == *j2);
    // No temporary directory is left beside the output.
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp.path)) names.push_back(e.path().filename().string());
    CHECK(names == std::vector<std::string>{"out"});
  }
}

TEST_CASE("dcp write: PyTorch 2.11 corpus checkpoints round trip tensor by tensor") {
  const fs::path corpus = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";
  for (const char* name : {"mlp_state_dict", "conv_bn_state_dict", "training_checkpoint", "views_shared_storage",
                           "scalars_and_empty", "many_tensors"}) {
    CAPTURE(name);
    auto ck = load(corpus / (std::string(name) + ".pt"));
    REQUIRE_MESSAGE(ck.has_value(), (ck ? "" : ck.error().to_string()));
    TempDir tmp;
    auto w = save_dcp(*ck, tmp.path / "out", fast());
    REQUIRE_MESSAGE(w.has_value(), (w ? "" : w.error().to_string()));
    DcpCheckpoint got = open_dcp(tmp.path / "out");
    auto named = ck->named_tensors();
    REQUIRE(named.has_value());
    REQUIRE(!named->empty());
    CHECK(got.tensors().size() == named->size());
    for (const NamedTensor& nt : *named) {
      CAPTURE(nt.name);
      const DcpTensor* t = got.find_tensor(nt.name);
      REQUIRE(t != nullptr);
      const TensorInfo& info = ck->tensors()[nt.tensor];
      CHECK(t->dtype == info.dtype);
      CHECK(t->shape == info.shape);
      auto ref = ck->contiguous_bytes(nt.tensor);
      REQUIRE(ref.has_value());
      CHECK(whole(got, *t) == *ref);
    }
  }
}

TEST_CASE("dcp write: an existing output is refused and left as it was") {
  TempDir tmp;
  auto ck = load(fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt");
  REQUIRE(ck.has_value());
  fs::create_directory(tmp.path / "out");
  { std::ofstream(tmp.path / "out" / "keep") << "x"; }
  auto w = save_dcp(*ck, tmp.path / "out", fast());
  REQUIRE(!w.has_value());
  CHECK(w.error().code() == ErrorCode::kExists);
  CHECK(fs::exists(tmp.path / "out" / "keep"));
  CHECK(!fs::exists(tmp.path / "out" / ".metadata"));
  { std::ofstream(tmp.path / "file") << "x"; }
  auto w2 = save_dcp(*ck, tmp.path / "file", fast());
  REQUIRE(!w2.has_value());
  CHECK(w2.error().code() == ErrorCode::kExists);
  CHECK(tmp.entries() == std::vector<std::string>{"file", "out"});
  auto w3 = save_dcp(*ck, tmp.path / "missing" / "out", fast());
  REQUIRE(!w3.has_value());
  CHECK(w3.error().code() == ErrorCode::kIo);
}

TEST_CASE("dcp write: values DCP cannot flatten are refused and nothing is left behind") {
  // A real tensor to put into shapes save_dcp must refuse.
  auto src = load(fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt");
  REQUIRE(src.has_value());
  auto named = src->named_tensors();
  REQUIRE(named.has_value());
  const TensorInfo& ti = src->tensors()[(*named)[0].tensor];
  auto bytes = src->contiguous_bytes((*named)[0].tensor);
  REQUIRE(bytes.has_value());
  struct Case {
    const char* what;
    ErrorCode code;
  };
  for (const Case c :
       {Case{"root is a tensor", ErrorCode::kUnsupported}, Case{"tensor inside a tuple", ErrorCode::kUnsupported},
        Case{"shared list", ErrorCode::kUnsupported}, Case{"duplicate fqn", ErrorCode::kInvalidArgument},
        Case{"float key", ErrorCode::kUnsupported}}) {
    CAPTURE(c.what);
    CheckpointBuilder b;
    auto s = b.add_storage(ti.dtype, *bytes);
    REQUIRE(s.has_value());
    auto t = b.add_tensor(ti.dtype, ti.shape, *s);
    REQUIRE(t.has_value());
    const std::string what = c.what;
    NodeId root = kNoNode;
    if (what == "root is a tensor") {
      root = *t;
    } else if (what == "tensor inside a tuple") {
      // The plain tensor is written first, then the tuple fails mid-way.
      root = b.container(Kind::kDict, {b.str("w"), *t, b.str("t"), b.container(Kind::kTuple, {*t})});
    } else if (what == "shared list") {
      NodeId l = b.container(Kind::kList, {*t});
      root = b.container(Kind::kDict, {b.str("a"), l, b.str("b"), l});
    } else if (what == "duplicate fqn") {
      root = b.container(Kind::kDict, {b.str("a.b"), *t, b.str("a"), b.container(Kind::kDict, {b.str("b"), *t})});
    } else {
      root = b.container(Kind::kDict, {b.floating(1.5), *t});
    }
    b.set_root(root);
    auto ck = std::move(b).finish();
    REQUIRE_MESSAGE(ck.has_value(), (ck ? "" : ck.error().to_string()));
    TempDir tmp;
    auto w = save_dcp(*ck, tmp.path / "out", fast());
    REQUIRE(!w.has_value());
    CHECK(w.error().code() == c.code);
    CHECK(tmp.entries().empty());
  }
}

TEST_CASE("dcp write: hostile trees (a million lists deep, a memo-shared DAG) stay linear") {
  using namespace std::string_literals;
  // {"model": [[[...[tensor]...]]]}, a million lists: refused by the path cap, quickly.
  CheckpointBuilder b;
  auto s = b.add_storage(DType::kFloat32, std::vector<std::uint8_t>(8, 0));
  REQUIRE(s.has_value());
  auto t = b.add_tensor(DType::kFloat32, {2}, *s);
  REQUIRE(t.has_value());
  NodeId v = *t;
  for (int i = 0; i < 1000000; ++i) v = b.container(Kind::kList, {v});
  b.set_root(b.container(Kind::kDict, {b.str("model"), v}));
  auto deep = std::move(b).finish();
  REQUIRE(deep.has_value());
  TempDir tmp;
  auto w = save_dcp(*deep, tmp.path / "deep", fast());
  REQUIRE(!w.has_value());
  CHECK(w.error().code() == ErrorCode::kLimitExceeded);
  // {"x": L40} with L0 = [], L(i) = [L(i-1), L(i-1)] through the memo (2^40
  // paths): lists without tensors are one non-tensor item, pickled with the
  // memo (linear), and read back.
  std::string p = "\x80\x02}X\x01\x00\x00\x00x]q"s + '\0';
  for (int i = 1; i <= 40; ++i)
    p += "0(h"s + static_cast<char>(i - 1) + "h" + static_cast<char>(i - 1) + "lq" + static_cast<char>(i);
  p += "s.";
  auto dag = load_buffer(std::vector<std::uint8_t>(p.begin(), p.end()));
  REQUIRE_MESSAGE(dag.has_value(), (dag ? "" : dag.error().to_string()));
  auto wd = save_dcp(*dag, tmp.path / "dag", fast());
  REQUIRE_MESSAGE(wd.has_value(), (wd ? "" : wd.error().to_string()));
  CHECK(wd->bytes_items == 1);
  DcpCheckpoint got = open_dcp(tmp.path / "dag");
  REQUIRE(got.bytes_items().size() == 1);
  auto item = got.load_bytes_item(got.bytes_items()[0]);
  REQUIRE_MESSAGE(item.has_value(), (item ? "" : item.error().to_string()));
  CHECK(item->values().size() < 100);
}

namespace {

// Shard(0) rows of rank r of `world` for a dim of n (torch.chunk, as
// DTensor splits it): [r c, min((r + 1) c, n)), c = ceil(n / world).
std::pair<std::int64_t, std::int64_t> shard0(std::int64_t n, std::int64_t world, std::int64_t r) {
  const std::int64_t c = (n + world - 1) / world;
  const std::int64_t b = std::min(r * c, n);
  return {b, std::min(b + c, n) - b};
}

// Every input of the world-size round trips: the PyTorch 2.11 DCP cases
// consolidated, and corpus checkpoints (views, 0-dim, empty tensors).
std::vector<std::pair<std::string, Checkpoint>> world_inputs(const fs::path& scratch) {
  std::vector<std::pair<std::string, Checkpoint>> out;
  for (const char* name : kCases) {
    DcpCheckpoint src = open_dcp(case_dir(name) / "dcp");
    auto ck = dcp_to_checkpoint(src, scratch);
    REQUIRE_MESSAGE(ck.has_value(), (ck ? "" : ck.error().to_string()));
    out.emplace_back(name, std::move(*ck));
  }
  const fs::path corpus = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";
  for (const char* name : {"views_shared_storage", "scalars_and_empty", "training_checkpoint"}) {
    auto ck = load(corpus / (std::string(name) + ".pt"));
    REQUIRE_MESSAGE(ck.has_value(), (ck ? "" : ck.error().to_string()));
    out.emplace_back(name, std::move(*ck));
  }
  return out;
}

}  // namespace

TEST_CASE("dcp write: world size N = 1..4 lays every tensor out Shard(0), one file per rank, and reads back") {
  TempDir tmp;
  auto inputs = world_inputs(tmp.path);
  std::map<std::string, std::string> ws1_tree;
  for (std::uint32_t world = 1; world <= 4; ++world) {
    for (const auto& input : inputs) {
      const std::string& name = input.first;
      const Checkpoint& ck = input.second;
      CAPTURE(name);
      CAPTURE(world);
      const fs::path out = tmp.path / (name + "-ws" + std::to_string(world));
      DcpWriteOptions o = fast();
      o.world_size = world;
      auto w = save_dcp(ck, out, o);
      REQUIRE_MESSAGE(w.has_value(), (w ? "" : w.error().to_string()));
      CHECK(w->files == world);
      // Every rank's file exists (possibly empty), nothing else but .metadata.
      std::vector<std::string> names;
      std::uint64_t on_disk = 0;
      for (const auto& e : fs::directory_iterator(out)) {
        names.push_back(e.path().filename().string());
        if (names.back() != ".metadata") on_disk += fs::file_size(e.path());
      }
      std::sort(names.begin(), names.end());
      std::vector<std::string> want{".metadata"};
      for (std::uint32_t r = 0; r < world; ++r) want.push_back("__" + std::to_string(r) + "_0.distcp");
      std::sort(want.begin(), want.end());
      CHECK(names == want);
      CHECK(on_disk == w->data_bytes);
      DcpCheckpoint got = open_dcp(out);
      // The layout: chunk i of a tensor with dim 0 = n is rank i's Shard(0)
      // rows, in rank i's file; one empty chunk for the ranks past the end;
      // 0-dim tensors, dim 0 of 0 and non-tensor items once, on rank 0.
      std::uint64_t chunks = 0;
      for (const DcpTensor& t : got.tensors()) {
        CAPTURE(t.fqn);
        chunks += t.chunks.size();
        if (t.shape.empty() || t.shape[0] == 0) {
          REQUIRE(t.chunks.size() == 1);
          CHECK(got.files()[t.chunks[0].file].name == "__0_0.distcp");
          CHECK(t.chunks[0].sizes == t.shape);
          continue;
        }
        const std::int64_t n = t.shape[0];
        std::int64_t ranks_with_rows = 0;
        for (std::int64_t r = 0; r < world; ++r) ranks_with_rows += shard0(n, world, r).second > 0 ? 1 : 0;
        const std::size_t want_chunks = static_cast<std::size_t>(ranks_with_rows) + (ranks_with_rows < world ? 1 : 0);
        REQUIRE(t.chunks.size() == want_chunks);
        for (std::size_t i = 0; i < t.chunks.size(); ++i) {
          CAPTURE(i);
          const DcpChunk& c = t.chunks[i];
          const auto [row0, rows] = shard0(n, world, static_cast<std::int64_t>(i));
          CHECK(c.offsets[0] == row0);
          CHECK(c.sizes[0] == rows);
          for (std::size_t d = 1; d < t.shape.size(); ++d) {
            CHECK(c.offsets[d] == 0);
            CHECK(c.sizes[d] == t.shape[d]);
          }
          CHECK(got.files()[c.file].name == "__" + std::to_string(i) + "_0.distcp");
          CHECK(c.offset + c.length <= got.files()[c.file].size);
          // The chunk is its own torch.save zip holding exactly its rows.
          auto one = got.load_chunk(t, c);
          CHECK_MESSAGE(one.has_value(), (one ? "" : one.error().to_string()));
        }
      }
      CHECK(chunks == w->chunks);
      for (const DcpBytesItem& b : got.bytes_items()) CHECK(got.files()[b.file].name == "__0_0.distcp");
      // Consolidated: byte for byte the input (tensors) and equal values (the rest).
      for (const DcpTensor& t : got.tensors()) {
        CAPTURE(t.fqn);
        bool found = false;
        auto named = ck.named_tensors();
        REQUIRE(named.has_value());
        for (const NamedTensor& nt : *named) {
          if (nt.name != t.fqn) continue;
          found = true;
          auto ref = ck.contiguous_bytes(nt.tensor);
          REQUIRE(ref.has_value());
          const bool same = whole(got, t) == *ref;
          CHECK(same);
        }
        CHECK(found);
      }
      // The consolidated tree: for the DCP cases PyTorch's own (the input);
      // for corpus files (views become separate tensors, tuples stay items)
      // the one world size 1 gives, which the tests above compare with the source.
      auto back = dcp_to_checkpoint(got, tmp.path);
      REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
      auto j2 = to_json(*back);
      REQUIRE(j2.has_value());
      const bool from_dcp = std::find(std::begin(kCases), std::end(kCases), name) != std::end(kCases);
      if (from_dcp) {
        auto j1 = to_json(ck);
        REQUIRE(j1.has_value());
        const bool same_tree = *j1 == *j2;
        CHECK(same_tree);
      } else if (world == 1) {
        ws1_tree[name] = *j2;
      } else {
        const bool same_tree = ws1_tree[name] == *j2;
        CHECK(same_tree);
      }
      // A plan of another world size reads the same rows (load_dcp, Shard(0) boxes).
      auto plan = DcpPlan::uniform(got, DcpPlacement{0}, 1, 3);
      auto part = load_dcp(got, plan);
      REQUIRE_MESSAGE(part.has_value(), (part ? "" : part.error().to_string()));
      fs::remove_all(out);
    }
  }
}

TEST_CASE("dcp write: world size 0 and above DcpLimits::max_files are refused, nothing is written") {
  auto ck = load(fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt");
  REQUIRE(ck.has_value());
  TempDir tmp;
  DcpWriteOptions o = fast();
  o.world_size = 0;
  auto w0 = save_dcp(*ck, tmp.path / "out", o);
  REQUIRE(!w0.has_value());
  CHECK(w0.error().code() == ErrorCode::kInvalidArgument);
  o.world_size = static_cast<std::uint32_t>(o.limits.max_files + 1);
  auto w1 = save_dcp(*ck, tmp.path / "out", o);
  REQUIRE(!w1.has_value());
  CHECK(w1.error().code() == ErrorCode::kLimitExceeded);
  // More chunks than the reader's cap: refused before any file.
  o.world_size = 8;
  o.limits.max_chunks = 3;
  auto w2 = save_dcp(*ck, tmp.path / "out", o);
  REQUIRE(!w2.has_value());
  CHECK(w2.error().code() == ErrorCode::kLimitExceeded);
  CHECK(tmp.entries().empty());
  // A wide world (most ranks hold nothing: empty files) is written and read back.
  o = fast();
  o.world_size = 300;
  auto big = save_dcp(*ck, tmp.path / "wide", o);
  REQUIRE_MESSAGE(big.has_value(), (big ? "" : big.error().to_string()));
  CHECK(big->files == 300);
  CHECK(open_dcp(tmp.path / "wide").tensors().size() == big->tensors);
}
