// DCP directories written by PyTorch 2.11 (tests/data/dcp-2.11, gen_dcp.py):
// the layout equals what PyTorch recorded, consolidation equals
// DTensor.full_tensor() byte for byte, non-tensor items equal PyTorch's
// values, and resharded loads equal slices of the full tensors.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safeckpt/dcp.hpp"
#include "safeckpt/json.hpp"
#include "safeckpt/safetensors.hpp"
#include "support/dcp_cases.hpp"
#include "support/tree_json.hpp"

using namespace safeckpt;
namespace fs = std::filesystem;
using dcp_test::case_dir;
using dcp_test::kCases;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

DcpCheckpoint open_case(const std::string& name) {
  auto r = DcpCheckpoint::open(case_dir(name) / "dcp");
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  return std::move(*r);
}

SafetensorsFile full_of(const std::string& name) {
  auto r = SafetensorsFile::open(case_dir(name) / "full.safetensors");
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  return std::move(*r);
}

// Python's repr() of bytes (what gen_dcp.py recorded for a bytes value).
std::string py_bytes_repr(const std::string& b) {
  std::string s = "b'";
  const char* hex = "0123456789abcdef";
  for (unsigned char c : b) {
    if (c == '\\' || c == '\'') {
      s += '\\';
      s += static_cast<char>(c);
    } else if (c == '\n') {
      s += "\\n";
    } else if (c == '\t') {
      s += "\\t";
    } else if (c == '\r') {
      s += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    } else {
      s += static_cast<char>(c);
    }
  }
  return s + "'";
}

// A loaded value as gen_dcp.py's jsonable() writes it.
nlohmann::json to_json(const ValueArena& a, NodeId id) {
  const Node& n = a[id];
  switch (n.kind) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return n.flag;
    case Kind::kInt: return n.i;
    case Kind::kFloat: return n.re;
    case Kind::kStr: return n.text;
    case Kind::kBytes: return nlohmann::json{{"repr", py_bytes_repr(n.text)}};
    case Kind::kList:
    case Kind::kTuple: {
      auto j = nlohmann::json::array();
      for (NodeId c : n.items) j.push_back(to_json(a, c));
      return j;
    }
    case Kind::kDict: {
      auto j = nlohmann::json::object();
      for (std::size_t i = 0; i + 1 < n.items.size(); i += 2) j[a[n.items[i]].text] = to_json(a, n.items[i + 1]);
      return j;
    }
    default: return nlohmann::json{{"kind", std::string(kind_name(n.kind))}};
  }
}

// The box of `full` (row-major, shape `shape`) copied element by element.
std::vector<std::uint8_t> slice(Bytes full, const std::vector<std::int64_t>& shape, const DcpBox& box,
                                std::uint32_t es) {
  std::uint64_t n = 1;
  for (auto s : box.sizes) n *= static_cast<std::uint64_t>(s);
  std::vector<std::uint8_t> out;
  out.reserve(n * es);
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::uint64_t k = 0; k < n; ++k) {
    std::uint64_t rem = k, flat = 0;
    for (std::size_t d = shape.size(); d-- > 0;) {
      idx[d] = box.offsets[d] + static_cast<std::int64_t>(rem % static_cast<std::uint64_t>(box.sizes[d]));
      rem /= static_cast<std::uint64_t>(box.sizes[d]);
    }
    std::uint64_t mul = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      flat += static_cast<std::uint64_t>(idx[d]) * mul;
      mul *= static_cast<std::uint64_t>(shape[d]);
    }
    out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(flat * es),
               full.begin() + static_cast<std::ptrdiff_t>((flat + 1) * es));
  }
  return out;
}

std::string torch_dtype(DType d) {
  return "torch." + std::string(dtype_name(d));
}

}  // namespace

TEST_CASE("dcp: layout of PyTorch 2.11 directories equals what PyTorch recorded") {
  for (const char* name : kCases) {
    CAPTURE(name);
    DcpCheckpoint c = open_case(name);
    const auto expected = read_json(case_dir(name) / "expected.json");
    CHECK(c.version() == "1.0.0");
    std::size_t n_tensors = 0, n_bytes = 0;
    for (const auto& [fqn, item] : expected["items"].items()) {
      CAPTURE(fqn);
      if (item["kind"] == "bytes") {
        ++n_bytes;
        continue;
      }
      ++n_tensors;
      const DcpTensor* t = c.find_tensor(fqn);
      REQUIRE(t != nullptr);
      CHECK(torch_dtype(t->dtype) == item["dtype"].get<std::string>());
      CHECK(t->shape == item["shape"].get<std::vector<std::int64_t>>());
      // planner_data: the nesting PyTorch flattened.
      std::vector<std::string> path;
      for (const auto& k : t->path) path.push_back(k.is_index ? std::to_string(k.index) : k.key);
      CHECK(path == expected["mapping"][fqn].get<std::vector<std::string>>());
    }
    CHECK(c.tensors().size() == n_tensors);
    CHECK(c.bytes_items().size() == n_bytes);
  }
}

TEST_CASE("dcp: consolidation equals DTensor.full_tensor() byte for byte") {
  for (const char* name : kCases) {
    CAPTURE(name);
    DcpCheckpoint c = open_case(name);
    SafetensorsFile full = full_of(name);
    auto r = load_dcp(c, DcpPlan::full(c));
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
    REQUIRE(r->size() == full.tensors().size());
    for (const auto& t : *r) {
      CAPTURE(t.fqn);
      const SafetensorsTensor* ref = full.find(t.fqn);
      REQUIRE(ref != nullptr);
      CHECK(std::vector<std::uint8_t>(ref->data.begin(), ref->data.end()) == t.data);
    }
    // The streaming safetensors writer gives the same tensors.
    const fs::path out = fs::temp_directory_path() / (std::string("safeckpt_dcp_") + name + ".safetensors");
    DcpConvertOptions co;
    co.overwrite = true;
    co.fsync = false;
    std::vector<std::string> skipped;
    auto st = dcp_to_safetensors(c, out, co, &skipped);
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    CHECK(skipped.size() == c.bytes_items().size());
    auto written = SafetensorsFile::open(out);
    REQUIRE_MESSAGE(written.has_value(), (written ? "" : written.error().to_string()));
    REQUIRE(written->tensors().size() == full.tensors().size());
    for (const auto& w : written->tensors()) {
      const SafetensorsTensor* ref = full.find(w.name);
      REQUIRE(ref != nullptr);
      CHECK(w.dtype == ref->dtype);
      CHECK(w.shape == ref->shape);
      CHECK(std::vector<std::uint8_t>(w.data.begin(), w.data.end()) ==
            std::vector<std::uint8_t>(ref->data.begin(), ref->data.end()));
    }
    fs::remove(out);
  }
}

TEST_CASE("dcp: non-tensor items equal PyTorch's values") {
  std::size_t checked = 0;
  for (const char* name : kCases) {
    CAPTURE(name);
    DcpCheckpoint c = open_case(name);
    const auto expected = read_json(case_dir(name) / "expected.json");
    for (const auto& b : c.bytes_items()) {
      CAPTURE(b.fqn);
      const auto& item = expected["items"][b.fqn];
      REQUIRE(item["kind"] == "bytes");
      auto v = c.load_bytes_item(b);
      REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.error().to_string()));
      CHECK(to_json(v->values(), v->root()) == item["value"]);
      ++checked;
    }
  }
  CHECK(checked == 6 * 3 + 12);  // placements x3 (step, config.*x4, blob) + fsdp2 param_groups
}

TEST_CASE("dcp: dtensor_box gives the local shapes PyTorch's DTensors had on every rank") {
  std::size_t checked = 0;
  for (const char* name : kCases) {
    CAPTURE(name);
    const auto expected = read_json(case_dir(name) / "expected.json");
    const std::int64_t ws = expected["world_size"];
    for (std::int64_t r = 0; r < ws; ++r) {
      const auto local = read_json(case_dir(name) / "ranks" / ("rank" + std::to_string(r) + ".local.json"));
      for (const auto& [key, v] : local.items()) {
        CAPTURE(key);
        CAPTURE(r);
        // Mesh: a list of ranks (1-D) or a list of lists (2-D); this rank's coordinate.
        std::vector<std::int64_t> mesh, coord;
        const auto& m = v["mesh"];
        if (m[0].is_number()) {
          mesh = {static_cast<std::int64_t>(m.size())};
          for (std::size_t i = 0; i < m.size(); ++i)
            if (m[i] == r) coord = {static_cast<std::int64_t>(i)};
        } else {
          mesh = {static_cast<std::int64_t>(m.size()), static_cast<std::int64_t>(m[0].size())};
          for (std::size_t i = 0; i < m.size(); ++i)
            for (std::size_t j = 0; j < m[i].size(); ++j)
              if (m[i][j] == r) coord = {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)};
        }
        std::vector<DcpPlacement> pl;
        for (const auto& p : v["placements"]) {
          const std::string s = p;
          pl.push_back(DcpPlacement{s == "Replicate()" ? -1 : s.at(10) - '0'});  // "Shard(dim=N)"
        }
        auto box = dtensor_box(v["shape"].get<std::vector<std::int64_t>>(), mesh, coord, pl);
        REQUIRE_MESSAGE(box.has_value(), (box ? "" : box.error().to_string()));
        CHECK(box->sizes == v["local_shape"].get<std::vector<std::int64_t>>());
        ++checked;
      }
    }
  }
  CHECK(checked > 40);
}

TEST_CASE("dcp: resharded loads (N simulated ranks, Shard(0)/Shard(1)/Replicate) equal slices of the full tensors") {
  for (const char* name : {"placements-ws2", "placements-ws3", "uneven-ws4", "mesh2d-ws4", "fsdp2-adamw-ws2"}) {
    CAPTURE(name);
    DcpCheckpoint c = open_case(name);
    SafetensorsFile full = full_of(name);
    for (int dim : {-1, 0, 1}) {
      for (std::int64_t ws : {1, 2, 3, 5}) {
        for (std::int64_t rank = 0; rank < ws; ++rank) {
          CAPTURE(dim);
          CAPTURE(ws);
          CAPTURE(rank);
          DcpPlan plan = DcpPlan::uniform(c, DcpPlacement{dim}, rank, ws);
          auto r = load_dcp(c, plan);
          REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
          for (const auto& t : *r) {
            CAPTURE(t.fqn);
            const SafetensorsTensor* ref = full.find(t.fqn);
            REQUIRE(ref != nullptr);
            CHECK(t.data == slice(ref->data, t.global_shape, t.box, dtype_size(t.dtype)));
          }
        }
      }
    }
  }
}

TEST_CASE("dcp: a rank's load reads only the chunks its box needs") {
  // Copy placements-ws4 and destroy the last writer's file content (same size):
  // rank 0's Shard(0) slice of model.a lives in __0_0.distcp only.
  const fs::path src = case_dir("placements-ws4") / "dcp";
  const fs::path dir = fs::temp_directory_path() / "safeckpt_dcp_partial";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dir / e.path().filename());
  const auto size = fs::file_size(dir / "__3_0.distcp");
  {
    std::ofstream f(dir / "__3_0.distcp", std::ios::binary | std::ios::trunc);
    f << std::string(size, 'x');
  }
  auto c = DcpCheckpoint::open(dir);
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  DcpPlan mine;
  const DcpTensor* a = c->find_tensor("model.a");
  REQUIRE(a != nullptr);
  auto box = dtensor_box(a->shape, {4}, {0}, {DcpPlacement{0}});
  REQUIRE(box.has_value());
  mine.items.push_back({"model.a", *box});
  auto ok = load_dcp(*c, mine);
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  SafetensorsFile full = full_of("placements-ws4");
  CHECK(ok->at(0).data == slice(full.find("model.a")->data, a->shape, *box, 4));
  // The whole model needs __3_0.distcp and fails naming it.
  auto all = load_dcp(*c, DcpPlan::full(*c));
  REQUIRE_FALSE(all.has_value());
  CHECK(all.error().code() == ErrorCode::kUnsupported);  // load_bytes: not a torch.save file
  CHECK(all.error().message().find("__3_0.distcp") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("dcp: the nested checkpoint equals PyTorch's dcp_to_torch_save output") {
  for (const char* name : kCases) {
    CAPTURE(name);
    DcpCheckpoint c = open_case(name);
    auto ours = dcp_to_checkpoint(c, fs::temp_directory_path());
    REQUIRE_MESSAGE(ours.has_value(), (ours ? "" : ours.error().to_string()));
    auto ref = load(case_dir(name) / "consolidated.pt");
    REQUIRE_MESSAGE(ref.has_value(), (ref ? "" : ref.error().to_string()));
    auto a = to_json(*ours);
    auto b = to_json(*ref);
    REQUIRE(a.has_value());
    REQUIRE(b.has_value());
    auto ja = nlohmann::json::parse(*a);
    auto jb = nlohmann::json::parse(*b);
    test_support::normalize(ja);
    test_support::normalize(jb);
    CHECK_MESSAGE(ja == jb, test_support::first_diff(ja, jb));
    // Saved and loaded again: the same tree.
    const fs::path out = fs::temp_directory_path() / (std::string("safeckpt_dcp_") + name + ".pt");
    DcpConvertOptions co;
    co.overwrite = true;
    co.fsync = false;
    auto st = dcp_to_torch_save(c, out, co);
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    auto back = load(out);
    REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
    auto jc = nlohmann::json::parse(*to_json(*back));
    test_support::normalize(jc);
    CHECK_MESSAGE(jc == jb, test_support::first_diff(jc, jb));
    fs::remove(out);
  }
}
