// Helpers for tests over the real PyTorch 2.11 programs of tests/data/pt2-2.11
// (see its PROVENANCE.md): paths, the records of an archive, archives crafted
// from a real one by editing records, loading + validating a program, and the
// tensors of a <model>.io.safetensors file (PyTorch's inputs and eager outputs).
// Header-only, doctest assertions: include from test files only.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "safeckpt/graph.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/zip.hpp"
#include "support/zip_builder.hpp"

namespace test_support {

// tests/data/<dir>/ (SAFECKPT_TEST_DATA_DIR overrides the data root, for the
// device machine where the binary runs from another tree).
inline std::string test_data_dir(const std::string& dir = "pt2-2.11") {
  const char* env = std::getenv("SAFECKPT_TEST_DATA_DIR");
  return std::string(env != nullptr ? env : SAFECKPT_TEST_DATA) + "/" + dir + "/";
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Records of a real archive at `path`: name under the root -> bytes, in file order.
inline std::vector<std::pair<std::string, std::string>> archive_records(const std::string& path) {
  auto mf = safeckpt::MappedFile::open(path);
  REQUIRE(mf.has_value());
  auto zip = safeckpt::ZipArchive::open(mf->bytes(), safeckpt::Limits{});
  REQUIRE(zip.has_value());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : zip->entries()) {
    auto rb = zip->read(e, true);
    REQUIRE(rb.has_value());
    out.emplace_back(e.name.substr(zip->root().size() + 1),
                     std::string(reinterpret_cast<const char*>(rb->bytes.data()), rb->bytes.size()));
  }
  return out;
}

// One record (name under the root, e.g. "models/model.json") of the archive at `path`.
inline std::string archive_record(const std::string& path, const std::string& name) {
  for (auto& [n, data] : archive_records(path))
    if (n == name) return data;
  FAIL("no record " << name << " in " << path);
  return {};
}

// pt2-2.11/mlp.core.pt2 re-zipped with `edits` (record -> new bytes, nullopt
// drops it) and `extra` records appended.
inline std::vector<std::uint8_t> crafted_mlp(const std::map<std::string, std::optional<std::string>>& edits,
                                             const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  ZipBuilder zb("mlp.core");
  for (auto& [name, data] : archive_records(test_data_dir() + "mlp.core.pt2")) {
    auto it = edits.find(name);
    if (it == edits.end())
      zb.add(name, data);
    else if (it->second)
      zb.add(name, *it->second);
  }
  for (auto& [name, data] : extra) zb.add(name, data);
  return zb.finish();
}

// pt2-2.11/mlp.core's program JSON with two nodes added, full([], 1.0) ->
// s0 and transpose.int(s0, 0, -1) -> s1, s1 returned as a second user
// output: PyTorch returns a 0-d tensor from transpose unchanged. (A review of
// 2026-12-06 crashed validate, run and scan with it: SIGSEGV.)
inline nlohmann::json mlp_with_scalar_transpose() {
  using nlohmann::json;
  json j = json::parse(archive_record(test_data_dir() + "mlp.core.pt2", "models/model.json"));
  json& g = j["graph_module"]["graph"];
  const std::string out = g["outputs"][0]["as_tensor"]["name"];
  auto node = [](const std::string& target, json inputs, const std::string& name) {
    return json{{"target", target},
                {"inputs", std::move(inputs)},
                {"outputs", json::array({{{"as_tensor", {{"name", name}}}}})},
                {"metadata", json::object()},
                {"is_hop_single_tensor_return", nullptr},
                {"name", name}};
  };
  auto pos = [](const std::string& name, json arg) {
    return json{{"name", name}, {"arg", std::move(arg)}, {"kind", 1}};
  };
  json scalar_meta = g["tensor_values"][out];
  scalar_meta["sizes"] = json::array();
  scalar_meta["strides"] = json::array();
  g["tensor_values"]["s0"] = scalar_meta;
  g["tensor_values"]["s1"] = scalar_meta;
  g["nodes"].push_back(
      node("torch.ops.aten.full.default",
           json::array({pos("size", {{"as_ints", json::array()}}), pos("fill_value", {{"as_float", 1.0}})}), "s0"));
  g["nodes"].push_back(node("torch.ops.aten.transpose.int",
                            json::array({pos("self", {{"as_tensor", {{"name", "s0"}}}}), pos("dim0", {{"as_int", 0}}),
                                         pos("dim1", {{"as_int", -1}})}),
                            "s1"));
  j["graph_module"]["signature"]["output_specs"].push_back(
      {{"user_output", {{"arg", {{"as_tensor", {{"name", "s1"}}}}}}}});
  g["outputs"].push_back({{"as_tensor", {{"name", "s1"}}}});
  return j;
}

// A program of tests/data/<dir>/, opened, its model "model" validated;
// `weights` read from the archive when asked.
struct LoadedProgram {
  safeckpt::graph::Pt2Archive archive;
  safeckpt::graph::Program program;
  safeckpt::graph::WeightMap weights;
};

// The same for an archive anywhere (`path`: e.g. a program made on the GPU
// machine, not committed).
inline LoadedProgram load_program_at(const std::string& path, bool with_weights) {
  using namespace safeckpt::graph;
  auto a = Pt2Archive::open_file(path);
  REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.error().to_string()));
  auto p = a->program("model");
  REQUIRE(p.has_value());
  Program prog = **p;
  auto st = validate(prog);
  REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
  WeightMap weights;
  if (with_weights) {
    auto w = archive_weights(*a);
    REQUIRE_MESSAGE(w.has_value(), (w ? "" : w.error().to_string()));
    weights = std::move(w).value();
  }
  return LoadedProgram{std::move(a).value(), std::move(prog), std::move(weights)};
}

inline LoadedProgram load_program(const std::string& file, bool with_weights = false,
                                  const std::string& dir = "pt2-2.11") {
  return load_program_at(test_data_dir(dir) + file, with_weights);
}

// The tensor `name` of an io.safetensors file as a HostTensor (a copy).
inline safeckpt::graph::HostTensor tensor_of(const safeckpt::SafetensorsFile& f, const std::string& name) {
  const safeckpt::SafetensorsTensor* t = f.find(name);
  REQUIRE_MESSAGE(t != nullptr, name);
  auto dt = safeckpt::dtype_from_safetensors(t->dtype);
  REQUIRE(dt.has_value());
  std::vector<std::int64_t> shape(t->shape.begin(), t->shape.end());
  auto h = safeckpt::graph::make_host_tensor(*dt, shape, t->data);
  REQUIRE_MESSAGE(h.has_value(), (h ? "" : h.error().to_string()));
  return *h;
}

}  // namespace test_support
