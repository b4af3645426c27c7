// safetensors: byte-exact reference outputs, strict validation (one case per
// rule of the grammar in safetensors.hpp), shards, and conversions.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "safeckpt/builder.hpp"
#include "safeckpt/hash.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"
#include "support/fifo.hpp"
#include "support/save_util.hpp"

using namespace safeckpt;
using namespace safeckpt::save_test;

namespace {

std::vector<std::uint8_t> f32_bytes(std::initializer_list<float> v) {
  std::vector<std::uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

// A file from a header text and data bytes (header length computed).
std::vector<std::uint8_t> raw_file(const std::string& header, std::size_t data_bytes, std::uint64_t declared = ~0ull) {
  std::vector<std::uint8_t> out(8);
  std::uint64_t n = declared == ~0ull ? header.size() : declared;
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data_bytes, 0);
  return out;
}

ErrorCode parse_code(const std::vector<std::uint8_t>& f, const SafetensorsOptions& o = {}) {
  auto r = SafetensorsFile::parse(Bytes(f.data(), f.size()), o);
  return r ? ErrorCode::kOk : r.error().code();
}

}  // namespace

TEST_CASE("safetensors: byte-exact outputs of the reference implementation (tensor.rs tests)") {
  // test_serialization: {"attn.0": F32 [1,2,3] = 0..5}
  auto data = f32_bytes({0, 1, 2, 3, 4, 5});
  auto out = serialize_safetensors({{"attn.0", "F32", {1, 2, 3}, Bytes(data.data(), data.size())}});
  REQUIRE(out.has_value());
  const std::vector<std::uint8_t> expect1 = {
      64,  0,  0,   0,  0,   0,  0,   0,   123, 34,  97,  116, 116, 110, 46,  48, 34, 58, 123, 34, 100, 116, 121, 112,
      101, 34, 58,  34, 70,  51, 50,  34,  44,  34,  115, 104, 97,  112, 101, 34, 58, 91, 49,  44, 50,  44,  51,  93,
      44,  34, 100, 97, 116, 97, 95,  111, 102, 102, 115, 101, 116, 115, 34,  58, 91, 48, 44,  50, 52,  93,  125, 125,
      0,   0,  0,   0,  0,   0,  128, 63,  0,   0,   0,   64,  0,   0,   64,  64, 0,  0,  128, 64, 0,   0,   160, 64};
  CHECK(*out == expect1);
  // test_empty, without and with {"framework": "pt"}.
  auto empty = serialize_safetensors({});
  REQUIRE(empty.has_value());
  CHECK(*empty == std::vector<std::uint8_t>{8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32});
  auto md = serialize_safetensors({}, {{"framework", "pt"}}, true);
  REQUIRE(md.has_value());
  const std::vector<std::uint8_t> expect_md = {
      40,  0,  0,   0,   0,  0,   0,   0,   123, 34,  95,  95, 109, 101, 116, 97,  100, 97,  116, 97, 95, 95, 34, 58,
      123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58,  34,  112, 116, 34,  125, 125, 32, 32, 32, 32, 32};
  CHECK(*md == expect_md);
  // test_serialization_forced_alignement: "attn0", shape [1,1,2,3].
  auto al = serialize_safetensors({{"attn0", "F32", {1, 1, 2, 3}, Bytes(data.data(), data.size())}});
  REQUIRE(al.has_value());
  CHECK((*al)[0] == 72);
  CHECK(al->size() == 8 + 72 + 24);
  CHECK(std::string(al->begin() + 8 + 65, al->begin() + 80) == "       ");
  // All of them parse back.
  for (const auto* f : {&*out, &*empty, &*md, &*al}) CHECK(parse_code(*f) == ErrorCode::kOk);
  auto p = SafetensorsFile::parse(Bytes(out->data(), out->size()));
  REQUIRE(p.has_value());
  REQUIRE(p->tensors().size() == 1);
  CHECK(p->tensors()[0].name == "attn.0");
  CHECK(p->tensors()[0].file_offset == 72);
  CHECK(std::vector<std::uint8_t>(p->tensors()[0].data.begin(), p->tensors()[0].data.end()) == data);
}

TEST_CASE("safetensors: writer order is dtype (largest first), then name; deterministic") {
  std::vector<std::uint8_t> b8(8), b4(4), b2(2), b1(1);
  std::vector<SafetensorsEntry> es = {
      {"z", "U8", {1}, Bytes(b1.data(), 1)},   {"a", "BF16", {1}, Bytes(b2.data(), 2)},
      {"b", "F32", {1}, Bytes(b4.data(), 4)},  {"a32", "F32", {1}, Bytes(b4.data(), 4)},
      {"c", "C64", {1}, Bytes(b8.data(), 8)},  {"d", "F64", {1}, Bytes(b8.data(), 8)},
      {"e", "BOOL", {1}, Bytes(b1.data(), 1)}, {"f", "F8_E4M3", {1}, Bytes(b1.data(), 1)},
  };
  auto out = serialize_safetensors(es, {{"b", "2"}, {"a", "1"}}, true);
  REQUIRE(out.has_value());
  auto again = serialize_safetensors(es, {{"b", "2"}, {"a", "1"}}, true);
  CHECK(*again == *out);
  CHECK_FALSE(serialize_safetensors(es, {{"a", "1"}, {"a", "2"}}, true).has_value());
  auto p = SafetensorsFile::parse(Bytes(out->data(), out->size()));
  REQUIRE_MESSAGE(p.has_value(), (p ? "" : p.error().to_string()));
  std::vector<std::string> names;
  for (const auto& t : p->tensors()) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"d", "c", "a32", "b", "a", "f", "z", "e"});
  CHECK(p->metadata() == std::vector<std::pair<std::string, std::string>>{{"b", "2"}, {"a", "1"}});  // caller's order
  // Bad entries are refused.
  CHECK_FALSE(serialize_safetensors({{"x", "F32", {2}, Bytes(b4.data(), 4)}}).has_value());
  CHECK_FALSE(serialize_safetensors({{"x", "F33", {1}, Bytes(b4.data(), 4)}}).has_value());
  CHECK_FALSE(serialize_safetensors({{"x", "U8", {1}, Bytes(b1.data(), 1)}, {"x", "U8", {1}, Bytes(b1.data(), 1)}})
                  .has_value());
  CHECK_FALSE(serialize_safetensors({{"__metadata__", "U8", {1}, Bytes(b1.data(), 1)}}).has_value());
}

TEST_CASE("safetensors: every grammar rule has a refusal") {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(parse_code(raw_file(ok, 8)) == ErrorCode::kOk);
  // 1. header length
  CHECK(parse_code(std::vector<std::uint8_t>{1, 2, 3}) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(ok, 8, 1000)) == ErrorCode::kMalformed);
  SafetensorsOptions small;
  small.max_header_bytes = 16;
  CHECK(parse_code(raw_file(ok, 8), small) == ErrorCode::kLimitExceeded);
  CHECK(parse_code(raw_file("{", 0)) == ErrorCode::kMalformed);
  // 2. UTF-8 JSON object, nothing else; duplicates refused
  CHECK(parse_code(raw_file(" " + ok, 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a\u00e9":1})", 0)) == ErrorCode::kMalformed);  // valid UTF-8, bad entry
  CHECK(parse_code(raw_file("{\"\xff\":{}}", 0)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(ok + "   ", 8)) == ErrorCode::kOk);
  CHECK(parse_code(raw_file(ok + " x", 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(ok + "{}", 8)) == ErrorCode::kMalformed);
  CHECK(
      parse_code(raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
          8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)) ==
        ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"__metadata__":{"k":"1","k":"2"}})", 0)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":[[[[[[1]]]]]]})", 0)) == ErrorCode::kMalformed);
  // 3. metadata string -> string
  CHECK(parse_code(raw_file(R"({"__metadata__":{"k":"v"}})", 0)) == ErrorCode::kOk);
  CHECK(parse_code(raw_file(R"({"__metadata__":{"k":1}})", 0)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"__metadata__":"x"})", 0)) == ErrorCode::kMalformed);
  // 4. entries
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8)) ==
        ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8)) ==
        ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)) == ErrorCode::kMalformed);
  // 5. sizes (checked arithmetic; sub-byte dtypes fill whole bytes)
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8)) ==
        ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2)) == ErrorCode::kOk);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3)) == ErrorCode::kOk);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})", 0)) == ErrorCode::kOk);
  // 6. tiling: gap, overlap, trailing bytes, past the end, end < begin
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)) == ErrorCode::kMalformed);
  CHECK(
      parse_code(raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          8)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(ok, 9)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(ok, 4)) == ErrorCode::kMalformed);
  CHECK(parse_code(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8)) == ErrorCode::kMalformed);
  // 7. max_tensors
  SafetensorsOptions one;
  one.limits.max_tensors = 1;
  CHECK(
      parse_code(
          raw_file(
              R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
              2),
          one) == ErrorCode::kLimitExceeded);
}

TEST_CASE("safetensors: dtype names map to PyTorch dtypes") {
  CHECK(dtype_from_safetensors("BF16") == DType::kBFloat16);
  CHECK(dtype_from_safetensors("F8_E4M3") == DType::kFloat8_e4m3fn);
  CHECK(dtype_from_safetensors("F8_E5M2") == DType::kFloat8_e5m2);
  CHECK(dtype_from_safetensors("F8_E8M0") == DType::kFloat8_e8m0fnu);
  CHECK(dtype_from_safetensors("F8_E4M3FNUZ") == DType::kFloat8_e4m3fnuz);
  CHECK(dtype_from_safetensors("F8_E5M2FNUZ") == DType::kFloat8_e5m2fnuz);
  CHECK(dtype_from_safetensors("C64") == DType::kComplex64);
  CHECK_FALSE(dtype_from_safetensors("F6_E3M2").has_value());
  CHECK(safetensors_dtype_name(DType::kUInt64) == "U64");
  CHECK(safetensors_dtype_name(DType::kComplex128).empty());
  CHECK(safetensors_dtype_name(DType::kQInt8).empty());
}

TEST_CASE("safetensors: load as a checkpoint (zero-copy) and F4 packing") {
  const std::string h =
      R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"q":{"dtype":"F4","shape":[2,4],"data_offsets":[8,12]}})";
  auto f = raw_file(h, 12);
  for (std::size_t i = 0; i < 12; ++i) f[8 + h.size() + i] = static_cast<std::uint8_t>(i + 1);
  auto c = load_safetensors_bytes(Bytes(f.data(), f.size()));
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  CHECK(c->format() == FileFormat::kSafetensors);
  auto sd = c->state_dict();
  REQUIRE(sd.size() == 2);
  CHECK(sd[0].name == "w");
  const TensorInfo& q = c->tensors()[sd[1].tensor];
  CHECK(q.dtype == DType::kFloat4_e2m1fn_x2);
  CHECK(q.shape == std::vector<std::int64_t>{2, 2});
  CHECK(c->storages()[q.storage].bytes.data() == f.data() + 8 + h.size() + 8);  // a view, not a copy
  CHECK(c->storages()[q.storage].file_offset == 8 + h.size() + 8);
  // And back: the F4 shape is doubled again; the bytes are the same file.
  auto back = checkpoint_to_safetensors(*c);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  auto p = SafetensorsFile::parse(Bytes(back->data(), back->size()));
  REQUIRE(p.has_value());
  REQUIRE(p->find("q"));
  CHECK(p->find("q")->shape == std::vector<std::uint64_t>{2, 4});
  // F6 has no PyTorch dtype: readable, not convertible.
  auto f6 = raw_file(R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3);
  auto c6 = load_safetensors_bytes(Bytes(f6.data(), f6.size()));
  REQUIRE_FALSE(c6.has_value());
  CHECK(c6.error().code() == ErrorCode::kUnsupported);
}

TEST_CASE("safetensors: every corpus state_dict converts and reads back, twice identical") {
  int n = 0;
  for (const auto& [name, path] : corpus_files()) {
    CorpusLoad how;
    auto r = load_any(path, how);
    if (!r) continue;
    ToSafetensorsOptions to;
    to.drop_non_tensors = true;
    std::vector<std::string> notes;
    auto st = checkpoint_to_safetensors(*r, to, &notes);
    if (!st) {
      // Only what safetensors cannot hold is refused.
      CHECK_MESSAGE(st.error().code() == ErrorCode::kUnsupported, name << ": " << st.error().to_string());
      continue;
    }
    auto st2 = checkpoint_to_safetensors(*r, to);
    REQUIRE(st2.has_value());
    CHECK_MESSAGE(*st == *st2, name);
    auto back = load_safetensors_bytes(Bytes(st->data(), st->size()));
    REQUIRE_MESSAGE(back.has_value(), name << ": " << (back ? "" : back.error().to_string()));
    std::map<std::string, std::uint32_t> by_name;
    for (const auto& nt : back->state_dict()) by_name[nt.name] = nt.tensor;
    for (const auto& nt : r->state_dict()) {
      std::string key = nt.name.empty() ? "tensor" : nt.name;
      auto it = by_name.find(key);
      REQUIRE_MESSAGE(it != by_name.end(), name << ": missing " << key);
      auto a = r->contiguous_bytes(nt.tensor);
      auto b = back->contiguous_bytes(it->second);
      REQUIRE(a.has_value());
      REQUIRE(b.has_value());
      CHECK_MESSAGE(*a == *b, name << ": " << key);
      CHECK(r->tensors()[nt.tensor].shape == back->tensors()[it->second].shape);
      CHECK(r->tensors()[nt.tensor].dtype == back->tensors()[it->second].dtype);
    }
    ++n;
  }
  CHECK(n >= 25);
  MESSAGE("converted " << n << " corpus files to safetensors");
}

TEST_CASE("safetensors: non-tensor values go to __metadata__ or are refused") {
  auto r = load(corpus_dir("torch-2.11") / "training_checkpoint.pt");
  REQUIRE(r.has_value());
  std::vector<std::string> notes;
  auto st = checkpoint_to_safetensors(*r, {}, &notes);
  REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
  auto p = SafetensorsFile::parse(Bytes(st->data(), st->size()));
  REQUIRE(p.has_value());
  std::map<std::string, std::string> md(p->metadata().begin(), p->metadata().end());
  CHECK(md["format"] == "pt");
  CHECK(md["epoch"] == "3");
  CHECK(md.count("optimizer.param_groups") == 1);
  CHECK(p->find("optimizer.state.0.exp_avg"));
  // A value JSON cannot hold (bytes) is refused, unless dropped.
  CheckpointBuilder b;
  const std::uint8_t raw[] = {1, 2};
  REQUIRE(b.add_state_dict_value("blob", b.bytes(Bytes(raw, 2))).has_value());
  REQUIRE(b.add_state_dict_tensor("w", DType::kFloat32, {1}, std::vector<std::uint8_t>(4)).has_value());
  auto c = std::move(b).finish();
  REQUIRE(c.has_value());
  auto refused = checkpoint_to_safetensors(*c);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code() == ErrorCode::kUnsupported);
  CHECK(refused.error().message().find("blob") != std::string::npos);
  ToSafetensorsOptions drop;
  drop.drop_non_tensors = true;
  CHECK(checkpoint_to_safetensors(*c, drop).has_value());
}

TEST_CASE("safetensors -> PyTorch -> safetensors keeps every byte") {
  auto data = f32_bytes({1, 2, 3, 4, 5, 6});
  std::vector<std::uint8_t> u64(16, 7);
  auto st = serialize_safetensors({{"layer.weight", "F32", {2, 3}, Bytes(data.data(), data.size())},
                                   {"layer.count", "U64", {2}, Bytes(u64.data(), u64.size())}},
                                  {{"format", "pt"}}, true);
  REQUIRE(st.has_value());
  auto c = load_safetensors_bytes(Bytes(st->data(), st->size()));
  REQUIRE(c.has_value());
  auto pt = save_to_bytes(*c);
  REQUIRE_MESSAGE(pt.has_value(), (pt ? "" : pt.error().to_string()));
  auto back = load_buffer(*pt);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  CHECK(tree_diff(*c, *back).empty());
  auto st2 = checkpoint_to_safetensors(*back);
  REQUIRE(st2.has_value());
  CHECK(*st2 == *st);
}

TEST_CASE("safetensors: sharded checkpoints through an index") {
  TempDir dir;
  auto a = f32_bytes({1, 2});
  auto b = f32_bytes({3});
  REQUIRE(save_safetensors(dir.path / "m-00001.safetensors", {{"x", "F32", {2}, Bytes(a.data(), a.size())}}, {}, false)
              .has_value());
  REQUIRE(save_safetensors(dir.path / "m-00002.safetensors", {{"y", "F32", {1}, Bytes(b.data(), b.size())}}, {}, false)
              .has_value());
  auto write = [&](const std::string& text) { std::ofstream(dir.path / "m.safetensors.index.json") << text; };
  write(R"({"metadata":{"total_size":12},"weight_map":{"y":"m-00002.safetensors","x":"m-00001.safetensors"}})");
  auto c = load_safetensors_index(dir.path / "m.safetensors.index.json");
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  auto sd = c->state_dict();
  REQUIRE(sd.size() == 2);
  CHECK(sd[0].name == "y");
  auto yb = c->contiguous_bytes(sd[0].tensor);
  REQUIRE(yb.has_value());
  CHECK(*yb == b);
  // Index problems are refused.
  write(R"({"weight_map":{"x":"../m-00001.safetensors"}})");
  CHECK_FALSE(load_safetensors_index(dir.path / "m.safetensors.index.json").has_value());
  write(R"({"weight_map":{"x":"m-00002.safetensors","y":"m-00002.safetensors"}})");
  CHECK_FALSE(load_safetensors_index(dir.path / "m.safetensors.index.json").has_value());
  write(R"({"weight_map":{"x":"m-00001.safetensors"}})");  // shard 1 is fine, but y is unlisted? no: only shard 1 read
  CHECK(load_safetensors_index(dir.path / "m.safetensors.index.json").has_value());
  write(R"({"weight_map":{"x":"m-00001.safetensors","x":"m-00001.safetensors"}})");
  CHECK_FALSE(load_safetensors_index(dir.path / "m.safetensors.index.json").has_value());
  write(R"({"weight_map":{"x":"m-00001.safetensors","z":"m-00001.safetensors"}})");
  CHECK_FALSE(load_safetensors_index(dir.path / "m.safetensors.index.json").has_value());
}

TEST_CASE("safetensors: save refuses to overwrite unless asked") {
  TempDir dir;
  auto a = f32_bytes({1});
  std::vector<SafetensorsEntry> es = {{"x", "F32", {1}, Bytes(a.data(), a.size())}};
  REQUIRE(save_safetensors(dir.path / "a.safetensors", es, {}, false).has_value());
  auto again = save_safetensors(dir.path / "a.safetensors", es, {}, false);
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error().code() == ErrorCode::kExists);
  SaveOptions ow;
  ow.overwrite = true;
  CHECK(save_safetensors(dir.path / "a.safetensors", es, {}, false, ow).has_value());
  CHECK(dir.entries() == std::vector<std::string>{"a.safetensors"});
}

TEST_CASE("safetensors: files made by the reference implementation (tests/data/safetensors-ref)") {
  // Made on the GPU machine by tests/interop/make_safetensors.py (the
  // `safetensors` package is not installable here); skipped until committed.
  fs::path dir = fs::path(SAFECKPT_TEST_DATA) / "safetensors-ref";
  if (!fs::exists(dir / "expected.json")) {
    MESSAGE("SKIP: " << dir.string() << " not present (run tests/interop/make_safetensors.py on the GPU machine)");
    return;
  }
  std::ifstream in(dir / "expected.json");
  json expected = json::parse(in);
  int files = 0;
  for (auto& [fname, exp] : expected.items()) {
    if (!exp.is_object() || !exp.contains("tensors")) continue;
    auto f = SafetensorsFile::open(dir / fname);
    REQUIRE_MESSAGE(f.has_value(), fname << ": " << (f ? "" : f.error().to_string()));
    CHECK(f->tensors().size() == exp["tensors"].size());
    std::vector<SafetensorsEntry> entries;
    for (const auto& t : f->tensors()) {
      REQUIRE_MESSAGE(exp["tensors"].contains(t.name), fname << ": " << t.name);
      const json& e = exp["tensors"][t.name];
      CHECK_MESSAGE(sha256_hex(t.data) == e["sha256"].get<std::string>(), fname << ": " << t.name);
      auto d = dtype_from_safetensors(t.dtype);
      REQUIRE(d.has_value());
      CHECK(dtype_name(*d) == e["dtype"].get<std::string>());
      entries.push_back({t.name, t.dtype, t.shape, t.data});
    }
    // Our writer reproduces the reference bytes (tensor order, header,
    // padding) from the tensors in any order; metadata keeps the file's order
    // (the reference's own order of several keys comes from a hash map).
    std::reverse(entries.begin(), entries.end());
    auto ours = serialize_safetensors(entries, f->metadata(), f->has_metadata());
    REQUIRE(ours.has_value());
    CHECK_MESSAGE(*ours == std::vector<std::uint8_t>(f->bytes().begin(), f->bytes().end()),
                  fname << ": our writer's bytes differ from the reference");
    ++files;
  }
  auto idx = load_safetensors_index(dir / "model.safetensors.index.json");
  REQUIRE_MESSAGE(idx.has_value(), (idx ? "" : idx.error().to_string()));
  CHECK(idx->state_dict().size() == 3);
  CHECK(files >= 5);
}

TEST_CASE("safetensors: a FIFO shard of an index is refused at once, not waited on") {
  // Review 2026-12-06: `inspect model.safetensors.index.json` hung for good
  // on a shard that was a FIFO (or a link to one).
  TempDir dir;
  const fs::path ref = fs::path(SAFECKPT_TEST_DATA) / "safetensors-ref";
  for (const char* f : {"model.safetensors.index.json", "model-00001-of-00002.safetensors"})
    fs::copy_file(ref / f, dir.path / f);
  test_support::FifoWatchdog w(dir.path / "model-00002-of-00002.safetensors");
  REQUIRE(w.ok());
  auto c = load_safetensors_index(dir.path / "model.safetensors.index.json");
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().message().find("not a regular file") != std::string::npos);
  CHECK_FALSE(w.had_to_unblock());
}
