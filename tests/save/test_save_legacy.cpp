// save() with SaveOptions::legacy_format: the pre-1.6 sequential-pickle
// layout (torch/serialization.py _legacy_save). Checked against the legacy
// files real PyTorch wrote (both corpora), by round trips over the corpus,
// and by PyTorch 1.13 reading what we write (test_save_torch113.cpp).
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "safeckpt/builder.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/pickle.hpp"
#include "safeckpt/save.hpp"
#include "support/save_util.hpp"

using namespace safeckpt;
using namespace safeckpt::save_test;

namespace {

SaveOptions legacy(bool weights_only_compatible = true) {
  SaveOptions o;
  o.legacy_format = true;
  o.weights_only_compatible = weights_only_compatible;
  return o;
}

// Hooks that accept the header pickles' plain values only (no globals).
class PlainHooks final : public PickleHooks {
 public:
  Result<NodeId> resolve_global(std::string_view q, const OpContext&) override { return refuse(q); }
  Result<NodeId> call(NodeId, NodeId, const OpContext&) override { return refuse("REDUCE"); }
  Result<NodeId> new_object(NodeId, NodeId, const OpContext&) override { return refuse("NEWOBJ"); }
  Status build(NodeId, NodeId, const OpContext&) override { return refuse("BUILD"); }
  Result<NodeId> persistent_load(NodeId, const OpContext&) override { return refuse("BINPERSID"); }
  Status require_builtin(std::string_view q, const OpContext&) override { return refuse(q); }

 private:
  static Unexpected refuse(std::string_view what) {
    return make_error(ErrorCode::kDisallowedOperation, "header pickle uses " + std::string(what));
  }
};

// Offset just past the first `n` pickles of `file`.
std::uint64_t end_of_pickles(Bytes file, int n) {
  std::uint64_t pos = 0;
  for (int i = 0; i < n; ++i) {
    ValueArena arena;
    PlainHooks hooks;
    auto r = run_pickle(file.subspan(pos), arena, hooks, nullptr, PickleOptions{});
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
    pos += r->end_offset;
  }
  return pos;
}

// Why the legacy layout cannot hold this checkpoint, or "" if it can:
// torch's _legacy_save needs one typed storage class per storage.
std::string legacy_cannot_hold(const Checkpoint& c) {
  std::vector<std::vector<DType>> views(c.storages().size());
  for (const auto& t : c.tensors()) {
    if (t.layout != Layout::kStrided || t.is_meta || t.storage == kNoStorage) continue;
    if (storage_class_for(t.dtype).empty()) return "dtype " + std::string(dtype_name(t.dtype));
    auto& v = views[t.storage];
    if (std::find(v.begin(), v.end(), t.dtype) == v.end()) v.push_back(t.dtype);
  }
  for (const auto& v : views)
    if (v.size() > 1) return "storage viewed as several dtypes";
  return "";
}

}  // namespace

TEST_CASE("save legacy: the header pickles are the bytes PyTorch writes") {
  Checkpoint ours_src = [] {
    CheckpointBuilder b;
    REQUIRE(b.add_state_dict_tensor("w", DType::kFloat32, {1}, std::vector<std::uint8_t>(4, 0)).has_value());
    auto c = std::move(b).finish();
    REQUIRE(c.has_value());
    return std::move(*c);
  }();
  auto ours = save_to_bytes(ours_src, legacy());
  REQUIRE_MESSAGE(ours.has_value(), (ours ? "" : ours.error().to_string()));
  for (const char* which : {"torch-1.13", "torch-2.11"}) {
    CAPTURE(which);
    auto theirs = read_file(corpus_dir(which) / "legacy_format.pt");
    REQUIRE(theirs.size() > 100);
    // magic, protocol version, sys_info
    const std::uint64_t h = end_of_pickles(Bytes(theirs.data(), theirs.size()), 3);
    REQUIRE(ours->size() > h);
    CHECK(std::vector<std::uint8_t>(theirs.begin(), theirs.begin() + static_cast<std::ptrdiff_t>(h)) ==
          std::vector<std::uint8_t>(ours->begin(), ours->begin() + static_cast<std::ptrdiff_t>(h)));
  }
}

TEST_CASE("save legacy: every corpus file the layout can hold round-trips, deterministically") {
  int saved = 0, refused = 0;
  for (const auto& [name, path] : corpus_files()) {
    CAPTURE(name);
    CorpusLoad opt;
    auto r = load_any(path, opt);
    if (!r) continue;
    const SaveOptions so = legacy(opt.weights_only_compatible);
    auto b1 = save_to_bytes(*r, so);
    const std::string why = legacy_cannot_hold(*r);
    if (!why.empty()) {
      // Refused exactly when torch's _legacy_save would refuse too.
      REQUIRE_FALSE(b1.has_value());
      CHECK(b1.error().code() == ErrorCode::kUnsupported);
      CHECK(b1.error().message().find("legacy format") != std::string::npos);
      ++refused;
      continue;
    }
    if (!b1 && !opt.weights_only_compatible && b1.error().code() == ErrorCode::kUnsupported) continue;  // numpy etc.
    REQUIRE_MESSAGE(b1.has_value(), (b1 ? "" : b1.error().to_string()));
    auto back = load_bytes(Bytes(b1->data(), b1->size()), opt.load);
    REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
    CHECK(back->format() == FileFormat::kLegacyPickle);
    const std::string d = tree_diff(*r, *back);
    CHECK_MESSAGE(d.empty(), d);
    auto b2 = save_to_bytes(*r, so);
    REQUIRE(b2.has_value());
    CHECK_MESSAGE(*b1 == *b2, "saving twice gave different bytes");
    auto b3 = save_to_bytes(*back, so);
    REQUIRE(b3.has_value());
    CHECK_MESSAGE(*b3 == *b1, "save(load(save(x))) != save(x)");
    // The zip and legacy saves hold the same tree.
    auto z = save_to_bytes(*r, SaveOptions{.weights_only_compatible = opt.weights_only_compatible});
    REQUIRE(z.has_value());
    auto zback = load_bytes(Bytes(z->data(), z->size()), opt.load);
    REQUIRE(zback.has_value());
    CHECK(tree_diff(*zback, *back).empty());
    ++saved;
  }
  MESSAGE("legacy format: " << saved << " corpus files round-tripped, " << refused
                            << " refused as torch's _legacy_save refuses them");
  CHECK(saved >= 30);
  CHECK(refused >= 1);
}

TEST_CASE("save legacy: more than 10 storages (keys sorted as strings, data in that order)") {
  // torch writes the storage keys sorted as strings ("0", "1", "10", "11", "2", ...).
  CheckpointBuilder b;
  for (int i = 0; i < 12; ++i) {
    std::vector<std::uint8_t> w(static_cast<std::size_t>(4 * (i + 1)));
    for (std::size_t j = 0; j < w.size(); ++j) w[j] = static_cast<std::uint8_t>(i * 31 + static_cast<int>(j));
    REQUIRE(b.add_state_dict_tensor("t" + std::to_string(i), DType::kInt32, {i + 1}, std::move(w)).has_value());
  }
  auto c = std::move(b).finish();
  REQUIRE(c.has_value());
  auto out = save_to_bytes(*c, legacy());
  REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.error().to_string()));
  auto back = load_buffer(*out);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  CHECK(tree_diff(*c, *back).empty());
  REQUIRE(back->storages().size() == 12);
  // Storage data follows the key list in string order: "10" comes right after "1".
  std::uint64_t prev = 0;
  for (const char* key : {"0", "1", "10", "11", "2", "3", "4", "5", "6", "7", "8", "9"}) {
    const auto& st = back->storages();
    auto it = std::find_if(st.begin(), st.end(), [&](const StorageInfo& s) { return s.key == key; });
    REQUIRE(it != st.end());
    CHECK(it->file_offset > prev);
    prev = it->file_offset;
  }
}

TEST_CASE("save legacy: refusals leave no file behind") {
  CheckpointBuilder b;
  auto s = b.add_storage(DType::kUInt8, std::vector<std::uint8_t>(8, 1));
  REQUIRE(s.has_value());
  auto i16 = b.add_tensor(DType::kInt16, {2}, *s);
  auto i32 = b.add_tensor(DType::kInt32, {2}, *s);
  REQUIRE((i16 && i32));
  b.set_root(b.container(Kind::kList, {*i16, *i32}));
  auto mixed = std::move(b).finish();
  REQUIRE(mixed.has_value());
  CHECK(save_to_bytes(*mixed).has_value());  // the zip layout can hold it (untyped storage)
  TempDir dir;
  auto st = save(dir.path / "mixed.pt", *mixed, legacy());
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code() == ErrorCode::kUnsupported);
  CHECK(dir.entries().empty());

  CheckpointBuilder b2;
  REQUIRE(b2.add_state_dict_tensor("u", DType::kUInt16, {2}, std::vector<std::uint8_t>(4, 2)).has_value());
  auto u16 = std::move(b2).finish();
  REQUIRE(u16.has_value());
  auto r = save_to_bytes(*u16, legacy());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::kUnsupported);
}
