// save(): round trips over the real corpus, determinism, the zip layout
// torch's readers assume, atomic replacement, and what is refused.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "safeckpt/builder.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"
#include "safeckpt/save.hpp"
#include "safeckpt/zip.hpp"
#include "support/save_util.hpp"

using nlohmann::json;
namespace fs = std::filesystem;
using namespace safeckpt;
using namespace safeckpt::save_test;

namespace {

std::vector<std::uint8_t> f32(std::initializer_list<float> v) {
  std::vector<std::uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

Checkpoint small_state_dict() {
  CheckpointBuilder b;
  REQUIRE(b.add_state_dict_tensor("fc.weight", DType::kFloat32, {2, 3}, f32({1, 2, 3, 4, 5, 6})).has_value());
  REQUIRE(b.add_state_dict_tensor("fc.bias", DType::kFloat32, {2}, f32({0.5f, -1})).has_value());
  REQUIRE(b.add_state_dict_value("step", b.integer(7)).has_value());
  auto c = std::move(b).finish();
  REQUIRE(c.has_value());
  return std::move(*c);
}

}  // namespace

TEST_CASE("save: a built state_dict loads back identically") {
  Checkpoint c = small_state_dict();
  auto bytes = save_to_bytes(c);
  REQUIRE_MESSAGE(bytes.has_value(), (bytes ? "" : bytes.error().to_string()));
  auto back = load_buffer(*bytes);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  CHECK(tree_diff(c, *back).empty());
  auto sd = back->state_dict();
  REQUIRE(sd.size() == 2);
  CHECK(sd[0].name == "fc.weight");
  CHECK(back->tensors()[sd[0].tensor].shape == std::vector<std::int64_t>{2, 3});
  auto cb = back->contiguous_bytes(sd[1].tensor);
  REQUIRE(cb.has_value());
  CHECK(*cb == f32({0.5f, -1}));
}

TEST_CASE("save: every loadable corpus file round-trips and saves byte-identically twice") {
  int n = 0;
  for (const auto& [name, path] : corpus_files()) {
    CorpusLoad opt;
    auto r = load_any(path, opt);
    if (!r) continue;  // refused files are the loader's business
    SaveOptions so;
    so.weights_only_compatible = opt.weights_only_compatible;
    auto b1 = save_to_bytes(*r, so);
    if (!b1 && !opt.weights_only_compatible && b1.error().code() == ErrorCode::kUnsupported) {
      // Files that need extra allowlists (numpy, argparse) may hold objects
      // the loader keeps opaque; they are outside weights-only saving.
      MESSAGE(name << ": not re-savable: " << b1.error().message());
      continue;
    }
    REQUIRE_MESSAGE(b1.has_value(), name << ": " << (b1 ? "" : b1.error().to_string()));
    auto b2 = save_to_bytes(*r, so);
    REQUIRE(b2.has_value());
    CHECK_MESSAGE(*b1 == *b2, name << ": saving twice gave different bytes");
    auto back = load_bytes(Bytes(b1->data(), b1->size()), opt.load);
    REQUIRE_MESSAGE(back.has_value(), name << ": " << (back ? "" : back.error().to_string()));
    std::string d = tree_diff(*r, *back);
    CHECK_MESSAGE(d.empty(), name << ": " << d);
    // And re-saving what we loaded is a fixed point.
    auto b3 = save_to_bytes(*back, so);
    REQUIRE(b3.has_value());
    CHECK_MESSAGE(*b3 == *b1, name << ": save(load(save(x))) != save(x)");
    ++n;
  }
  CHECK(n >= 30);
  MESSAGE("round-tripped " << n << " corpus files");
}

TEST_CASE("save: zip layout is PyTorchStreamWriter's") {
  auto r = load(corpus_dir("torch-2.11") / "views_shared_storage.pt");
  REQUIRE(r.has_value());
  SaveOptions so;
  so.root_name = "views_shared_storage";
  auto bytes = save_to_bytes(*r, so);
  REQUIRE(bytes.has_value());
  Bytes file(bytes->data(), bytes->size());
  auto zip = ZipArchive::open(file, Limits{});
  REQUIRE_MESSAGE(zip.has_value(), (zip ? "" : zip.error().to_string()));
  CHECK(zip->anomalies().empty());
  CHECK(zip->root() == "views_shared_storage");
  std::vector<std::string> names;
  for (const auto& e : zip->entries()) {
    names.push_back(e.name.substr(e.name.find('/') + 1));
    CHECK(e.data_offset % 64 == 0);
    CHECK(e.method == 0);
    CHECK(e.flags == (e.uncompressed_size ? 0x0808 : 0x0800));
    auto rb = zip->read(e, true);  // CRCs are real
    CHECK(rb.has_value());
  }
  CHECK(names == std::vector<std::string>{"data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/0",
                                          "data/1", "data/2", "version"});
  // torch >= 2.7 calculate_storage_offsets (serialization.py _get_offset):
  // from the offset of data/0, every next record's data offset is computed
  // from sizes alone.
  const ZipEntry* first = zip->find("data/0");
  REQUIRE(first);
  std::uint64_t cur = first->data_offset;
  for (int k = 0;; ++k) {
    const ZipEntry* e = zip->find("data/" + std::to_string(k));
    if (!e) break;
    std::uint64_t expect =
        k == 0 ? e->data_offset : zip_record_data_offset(cur, e->name.size(), e->uncompressed_size, 64);
    CHECK(e->data_offset == expect);
    cur = expect + e->uncompressed_size;
    if (e->uncompressed_size > 0)
      cur += (e->local_header_offset >= 0xFFFFFFFFu || e->uncompressed_size >= 0xFFFFFFFFu) ? 24 : 16;
  }
  // The version record is "3\n".
  auto v = zip->read(*zip->find("version"), true);
  REQUIRE(v.has_value());
  CHECK(std::string(reinterpret_cast<const char*>(v->bytes.data()), v->bytes.size()) == "3\n");
}

TEST_CASE("save: the same offsets PyTorch's corpus files have") {
  // A torch 2.11 file re-saved under its own root name has every record at the
  // offsets torch chose (the pickles differ in memo numbering only, so compare
  // the layout formula on torch's own file instead).
  fs::path p = corpus_dir("torch-2.11") / "mlp_state_dict.pt";
  auto mf = MappedFile::open(p);
  REQUIRE(mf.has_value());
  auto zip = ZipArchive::open(mf->bytes(), Limits{});
  REQUIRE(zip.has_value());
  for (const auto& e : zip->entries())
    CHECK(zip_record_data_offset(e.local_header_offset, e.name.size(), e.uncompressed_size, 64) == e.data_offset);
  // zip64 forms: header beyond 4 GiB, record of 4 GiB or more.
  CHECK(zip_record_data_offset(0x100000000ull, 10, 5, 64) % 64 == 0);
  CHECK(zip_record_data_offset(0x100000000ull, 10, 5, 64) >= 0x100000000ull + 30 + 10 + 4 + 12 + 4);
  CHECK(zip_record_data_offset(0, 10, 0x100000000ull, 64) == 64);  // 30 + 10 + (4 + 16) + 4
}

TEST_CASE("save: zip64 record offsets") {
  // 30 + 10 + (4 + 16) + 4 = 64 -> already aligned.
  CHECK(zip_record_data_offset(0, 10, 0xFFFFFFFFull, 64) == 64);
  // header past 4 GiB: + 4 + 8
  CHECK(zip_record_data_offset(0x100000000ull, 10, 1, 64) == 0x100000000ull + 64);
  // both: 30 + 10 + 4 + 16 + 8 + 4 = 72 -> 128
  CHECK(zip_record_data_offset(0x100000000ull, 10, 0x100000000ull, 64) == 0x100000000ull + 128);
}

TEST_CASE("save: root folder follows torch.save's rule") {
  CHECK(torch_archive_root("dir/model.pt") == "model");
  CHECK(torch_archive_root("model.tar.pt") == "model.tar");
  CHECK(torch_archive_root("noext") == "noext");
  CHECK(torch_archive_root(".pt") == "archive");
  CHECK(torch_archive_root("d/mod\xc3\xa8le.pt") == "archive");
}

TEST_CASE("save: files are replaced atomically and never clobbered by accident") {
  TempDir dir;
  fs::path p = dir.path / "sd.pt";
  Checkpoint c = small_state_dict();
  REQUIRE(save(p, c).has_value());
  auto first = read_file(p);
  CHECK(first.size() > 0);
  // Refuse to overwrite without the flag; the file is untouched.
  auto again = save(p, c);
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error().code() == ErrorCode::kExists);
  CHECK(read_file(p) == first);
  // A failing save leaves the old file and no temporary behind.
  CheckpointBuilder b;
  NodeId fs_node = b.container(Kind::kFrozenSet, {b.integer(1)});
  b.set_root(fs_node);
  auto bad = std::move(b).finish();
  REQUIRE(bad.has_value());
  SaveOptions ow;
  ow.overwrite = true;
  auto st = save(p, *bad, ow);
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code() == ErrorCode::kUnsupported);
  CHECK(read_file(p) == first);
  CHECK(dir.entries() == std::vector<std::string>{"sd.pt"});
  // Overwrite when asked; the root folder comes from the file name.
  REQUIRE(save(p, small_state_dict(), ow).has_value());
  auto mf = MappedFile::open(p);
  REQUIRE(mf.has_value());
  auto zip = ZipArchive::open(mf->bytes(), Limits{});
  REQUIRE(zip.has_value());
  CHECK(zip->root() == "sd");
  CHECK(dir.entries() == std::vector<std::string>{"sd.pt"});
  // A missing directory is an I/O error, not a crash.
  auto io = save(dir.path / "missing" / "x.pt", c);
  REQUIRE_FALSE(io.has_value());
  CHECK(io.error().code() == ErrorCode::kIo);
}

TEST_CASE("save: values torch's weights-only unpickler refuses are refused, unless asked") {
  CheckpointBuilder b;
  NodeId sl = b.container(Kind::kSlice, {b.integer(1), b.integer(2), b.none()});
  b.set_root(b.container(Kind::kList, {sl}));
  auto c = std::move(b).finish();
  REQUIRE(c.has_value());
  auto r = save_to_bytes(*c);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::kUnsupported);
  CHECK(r.error().message().find("slice") != std::string::npos);
  SaveOptions so;
  so.weights_only_compatible = false;
  CHECK(save_to_bytes(*c, so).has_value());
}

TEST_CASE("save: a list that contains itself is fine; a tuple cycle is refused") {
  {
    CheckpointBuilder b;
    NodeId l = b.container(Kind::kList, {});
    b.values()[l].items.push_back(l);
    b.set_root(l);
    auto c = std::move(b).finish();
    REQUIRE(c.has_value());
    auto bytes = save_to_bytes(*c);
    REQUIRE(bytes.has_value());
    auto back = load_buffer(*bytes);
    REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
    const Node& root = back->values()[back->root()];
    REQUIRE(root.kind == Kind::kList);
    REQUIRE(root.items.size() == 1);
    CHECK(root.items[0] == back->root());
  }
  {
    CheckpointBuilder b;
    NodeId l = b.container(Kind::kList, {});
    NodeId t = b.container(Kind::kTuple, {l});
    b.values()[l].items.push_back(t);
    b.set_root(t);
    auto c = std::move(b).finish();
    REQUIRE(c.has_value());
    auto bytes = save_to_bytes(*c);
    REQUIRE_FALSE(bytes.has_value());
    CHECK(bytes.error().code() == ErrorCode::kUnsupported);
  }
}

TEST_CASE("save: builder values of every plain kind round-trip") {
  CheckpointBuilder b;
  std::vector<NodeId> items;
  items.push_back(b.none());
  items.push_back(b.boolean(true));
  items.push_back(b.integer(-5));
  items.push_back(b.integer(300));
  items.push_back(b.integer(70000));
  items.push_back(b.integer(-3000000000LL));
  items.push_back(b.integer(INT64_MIN));
  Node big;
  big.kind = Kind::kBigInt;
  big.text = "-123456789012345678901234567890";
  items.push_back(b.add(big));
  items.push_back(b.floating(0.1));
  Node cx;
  cx.kind = Kind::kComplex;
  cx.re = 1.5;
  cx.im = -2;
  items.push_back(b.add(cx));
  items.push_back(b.str("h\xc3\xa9llo"));
  const std::uint8_t raw[] = {0, 0xff, 'a', 0x80};
  items.push_back(b.bytes(Bytes(raw, 4)));
  items.push_back(b.bytes(Bytes()));
  Node ba;
  ba.kind = Kind::kByteArray;
  ba.text = std::string("\x01\xfe", 2);
  items.push_back(b.add(ba));
  items.push_back(b.container(Kind::kSet, {b.integer(1), b.str("x")}));
  items.push_back(b.container(Kind::kCounter, {b.str("a"), b.integer(3)}));
  items.push_back(b.container(Kind::kSize, {b.integer(2), b.integer(3)}));
  items.push_back(b.dtype(DType::kBFloat16));
  items.push_back(b.device("cuda:1"));
  items.push_back(b.device("cpu"));
  items.push_back(b.container(Kind::kTuple, {b.integer(1), b.integer(2), b.integer(3), b.integer(4)}));
  std::vector<NodeId> many;
  for (int i = 0; i < 2500; ++i) many.push_back(b.integer(i));
  items.push_back(b.container(Kind::kList, many));
  NodeId shared = b.container(Kind::kDict, {b.str("k"), b.floating(-0.0)});
  items.push_back(shared);
  items.push_back(shared);
  b.set_root(b.container(Kind::kList, items));
  auto c = std::move(b).finish();
  REQUIRE(c.has_value());
  auto bytes = save_to_bytes(*c);
  REQUIRE_MESSAGE(bytes.has_value(), (bytes ? "" : bytes.error().to_string()));
  auto back = load_buffer(*bytes);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  std::string d = tree_diff(*c, *back);
  CHECK_MESSAGE(d.empty(), d);
  // Shared references stay shared.
  const Node& root = back->values()[back->root()];
  CHECK(root.items[root.items.size() - 1] == root.items[root.items.size() - 2]);
}

TEST_CASE("save: views, dtypes the legacy storages lack, and mixed-dtype storages") {
  CheckpointBuilder b;
  std::vector<std::uint8_t> bytes(64);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 7);
  auto s = b.add_storage(DType::kFloat32, bytes);
  REQUIRE(s.has_value());
  auto full = b.add_tensor(DType::kFloat32, {4, 4}, *s);
  auto tr = b.add_tensor(DType::kFloat32, {4, 4}, *s, 0, {1, 4});
  auto row = b.add_tensor(DType::kFloat32, {3}, *s, 5, {1});
  auto exp = b.add_tensor(DType::kFloat32, {3, 4}, *s, 0, {0, 1});
  REQUIRE((full && tr && row && exp));
  auto s8 = b.add_storage(DType::kUInt8, std::vector<std::uint8_t>(16, 3));
  auto f8 = b.add_tensor(DType::kFloat8_e4m3fn, {4, 4}, *s8);
  auto u16 = b.add_tensor(DType::kUInt16, {8}, *s8);  // same storage, other dtype
  auto s2 = b.add_storage(DType::kUInt8, std::vector<std::uint8_t>(8, 1));
  auto i16 = b.add_tensor(DType::kInt16, {2}, *s2);  // int16 + int32 views of one storage: untyped (v3)
  auto i32 = b.add_tensor(DType::kInt32, {2}, *s2);
  REQUIRE((f8 && u16 && i16 && i32));
  b.set_root(b.container(Kind::kDict, {b.str("full"), *full, b.str("t"), *tr, b.str("row"), *row, b.str("exp"), *exp,
                                       b.str("f8"), *f8, b.str("u16"), *u16, b.str("i16"), *i16, b.str("i32"), *i32}));
  auto c = std::move(b).finish();
  REQUIRE(c.has_value());
  auto out = save_to_bytes(*c);
  REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.error().to_string()));
  auto back = load_buffer(*out);
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  std::string d = tree_diff(*c, *back);
  CHECK_MESSAGE(d.empty(), d);
  CHECK(back->storages().size() == 3);
}

TEST_CASE("save: container batching is CPython's C pickler's (1 to 2001 items)") {
  // torch.save pickles with the C _pickle.Pickler: exact lists and dicts use
  // APPEND/SETITEM only for a one-item container; a trailing batch of one is
  // MARK ... APPENDS (batch_list_exact). Compared with what Debian's Python writes.
  const char* python = "/usr/bin/python3";
  if (!fs::exists(python)) {
    MESSAGE("SKIP: /usr/bin/python3 not available");
    return;
  }
  TempDir dir;
  for (int n : {1, 2, 999, 1000, 1001, 2000, 2001}) {
    CAPTURE(n);
    CheckpointBuilder b;
    std::vector<NodeId> ints, kv;
    for (int i = 0; i < n; ++i) {
      ints.push_back(b.integer(i));
      kv.push_back(b.str("k" + std::to_string(i)));
      kv.push_back(b.integer(i));
    }
    b.set_root(b.container(Kind::kTuple, {b.container(Kind::kList, ints), b.container(Kind::kDict, kv)}));
    auto c = std::move(b).finish();
    REQUIRE(c.has_value());
    auto bytes = save_to_bytes(*c);
    REQUIRE(bytes.has_value());
    auto zip = ZipArchive::open(Bytes(bytes->data(), bytes->size()), Limits{});
    REQUIRE(zip.has_value());
    auto pkl = zip->read(*zip->find("data.pkl"), true);
    REQUIRE(pkl.has_value());
    const fs::path theirs = dir.path / "theirs.pkl";
    const std::string cmd = std::string(python) +
                            " -c 'import pickle,sys; n=int(sys.argv[1]); "
                            "open(sys.argv[2],\"wb\").write(pickle.dumps((list(range(n)), "
                            "{\"k%d\" % i: i for i in range(n)}), protocol=2))' " +
                            std::to_string(n) + " " + theirs.string();
    REQUIRE(std::system(cmd.c_str()) == 0);
    const auto want = read_file(theirs);
    CHECK(std::vector<std::uint8_t>(pkl->bytes.begin(), pkl->bytes.end()) == want);
    auto back = load_buffer(*bytes);  // incl. the empty trailing MARK SETITEMS of 1000k-item dicts
    REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
    CHECK(tree_diff(*c, *back).empty());
  }
}
