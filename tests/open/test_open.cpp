// safeckpt::open (include/safeckpt/open.hpp): one entry point for every
// format we read, by content, over ONE open of the file (issue 12; issue 11
// item 3 for the host half). Real files: tests/data/corpus (torch 2.11 and
// Debian's 1.13), tests/data/safetensors-ref (written by the reference
// implementation, a sharded checkpoint among them), tests/data/open
// (tests/data/gen_open.py). Hostile indexes are crafted from the reference
// shards.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "safeckpt/json.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/safetensors.hpp"
#include "support/save_util.hpp"
#include "support/tree_json.hpp"
#include "support/zip_builder.hpp"

namespace fs = std::filesystem;
using namespace safeckpt;
using safeckpt::save_test::read_file;
using safeckpt::save_test::TempDir;
using test_support::ZipBuilder;

namespace {

fs::path data(const std::string& rel) {
  return fs::path(SAFECKPT_TEST_DATA) / rel;
}

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

std::vector<std::vector<std::uint8_t>> storage_bytes(const Checkpoint& c) {
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& s : c.storages()) out.emplace_back(s.bytes.begin(), s.bytes.end());
  return out;
}

std::vector<std::string> names(const Checkpoint& c) {
  std::vector<std::string> out;
  for (const auto& n : c.state_dict()) out.push_back(n.name);
  return out;
}

// The same file with every byte of every storage that lies in the file
// flipped: same size and layout, other tensor bytes (what an attacker would
// rename over the path between the parse and a reopen).
std::vector<std::uint8_t> with_storages_flipped(const std::vector<std::uint8_t>& file, const Checkpoint& c) {
  std::vector<std::uint8_t> out = file;
  for (const auto& s : c.storages()) {
    if (s.file_offset == Location::kNoOffset) continue;
    for (std::uint64_t i = 0; i < s.nbytes; ++i) out[s.file_offset + i] ^= 0x5A;
  }
  return out;
}

Result<Checkpoint> reference_reader(const fs::path& p, FileFormat f) {
  if (f == FileFormat::kSafetensors) {
    if (p.string().ends_with(".json")) return load_safetensors_index(p);
    return load_safetensors(p);
  }
  return load(p);
}

struct Case {
  const char* file;
  FileFormat format;
};
// One real file per format the dispatcher reads.
constexpr Case kCases[] = {
    {"corpus/torch-2.11/mlp_state_dict.pt", FileFormat::kTorchZip},
    {"corpus/torch-1.13/transformer_state_dict.pt", FileFormat::kTorchZip},
    {"corpus/torch-1.13/legacy_format.pt", FileFormat::kLegacyPickle},
    {"open/bare_pickle.pkl", FileFormat::kBarePickle},
    {"safetensors-ref/basic.safetensors", FileFormat::kSafetensors},
    {"safetensors-ref/model.safetensors.index.json", FileFormat::kSafetensors},
};

}  // namespace

TEST_CASE("open: every format by content, the same checkpoint as its own reader") {
  for (const Case& k : kCases) {
    CAPTURE(k.file);
    const fs::path p = data(k.file);
    auto c = safeckpt::open(p);
    REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
    CHECK(c->format() == k.format);
    auto ref = reference_reader(p, k.format);
    REQUIRE_MESSAGE(ref.has_value(), (ref ? "" : ref.error().to_string()));
    CHECK(c->format() == ref->format());
    CHECK(names(*c) == names(*ref));
    CHECK(c->tensors().size() == ref->tensors().size());
    CHECK(storage_bytes(*c) == storage_bytes(*ref));
    // One open: the Checkpoint holds the file it parsed (descriptor + path).
    CHECK(c->file().fd() >= 0);
    CHECK(c->file().path() == p);
  }
}

TEST_CASE("open: names do not matter, content does") {
  TempDir dir;
  fs::copy_file(data("safetensors-ref/basic.safetensors"), dir.path / "weights.pt");
  fs::copy_file(data("corpus/torch-1.13/legacy_format.pt"), dir.path / "model.safetensors");
  fs::copy_file(data("safetensors-ref/model.safetensors.index.json"), dir.path / "shards.txt");
  for (const char* s : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    fs::copy_file(data(std::string("safetensors-ref/") + s), dir.path / s);
  auto a = safeckpt::open(dir.path / "weights.pt");
  REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.error().to_string()));
  CHECK(a->format() == FileFormat::kSafetensors);
  auto b = safeckpt::open(dir.path / "model.safetensors");
  REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
  CHECK(b->format() == FileFormat::kLegacyPickle);
  auto c = safeckpt::open(dir.path / "shards.txt");
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  auto ref = load_safetensors_index(data("safetensors-ref/model.safetensors.index.json"));
  REQUIRE_MESSAGE(ref.has_value(), (ref ? "" : ref.error().to_string()));
  CHECK(names(*c) == names(*ref));
  CHECK(storage_bytes(*c) == storage_bytes(*ref));
}

TEST_CASE("open: sniffing a sharded index") {
  auto sniff = [](std::string_view s) {
    return sniff_format(Bytes(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
  };
  auto idx = read_file(data("safetensors-ref/model.safetensors.index.json"));
  CHECK(sniff_format(Bytes(idx.data(), idx.size())) == FileFormat::kSafetensorsIndex);
  CHECK(sniff(" \n\t{\"weight_map\": {}}") == FileFormat::kSafetensorsIndex);
  CHECK(sniff("{\"a\": 1}") == FileFormat::kUnknown);  // JSON, but no weight_map
  CHECK(sniff("[\"weight_map\"]") == FileFormat::kUnknown);
  CHECK(file_format_name(FileFormat::kSafetensorsIndex) == "safetensors_index");
}

TEST_CASE("open: PT2 programs, TorchScript and other files are refused by content") {
  TempDir dir;
  auto write_zip = [&](const char* name, std::vector<std::pair<std::string, std::string>> entries) {
    ZipBuilder z("a");
    for (const auto& [n, d] : entries) z.add(n, d);
    write_bytes(dir.path / name, z.finish());
    return dir.path / name;
  };
  auto pt2 = safeckpt::open(write_zip("model.pt", {{"archive_format", "pt2"}, {"version", "3"}, {"data.pkl", "x"}}));
  REQUIRE_FALSE(pt2.has_value());
  CHECK(pt2.error().code() == ErrorCode::kUnsupported);
  CHECK(pt2.error().message().find("safeckpt::graph::Pt2Archive") != std::string::npos);
  auto ts = safeckpt::open(write_zip("script.pt", {{"constants.pkl", "x"}, {"version", "3"}, {"data.pkl", "x"}}));
  REQUIRE_FALSE(ts.has_value());
  CHECK(ts.error().code() == ErrorCode::kUnsupported);
  write_text(dir.path / "config.json", "{\"hidden_size\": 8}");
  auto js = safeckpt::open(dir.path / "config.json");
  REQUIRE_FALSE(js.has_value());
  CHECK(js.error().code() == ErrorCode::kUnsupported);
  auto missing = safeckpt::open(dir.path / "absent.pt");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code() == ErrorCode::kIo);
}

// User test finding: the Hugging Face cache keeps a revision as
// <repo>/snapshots/<rev>/<file> -> ../../blobs/<sha> (huggingface_hub
// file_download.py); such shards load, links anywhere else stay refused.
TEST_CASE("open: a sharded index in the Hugging Face cache layout; links out of blobs/ refused") {
  TempDir dir;
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  const fs::path repo = dir.path / "models--org--name";
  const fs::path snap = repo / "snapshots" / "0123abc";
  fs::create_directories(repo / "blobs");
  fs::create_directories(snap);
  fs::copy_file(data("safetensors-ref/" + s1), repo / "blobs" / "sha-one");
  fs::copy_file(data("safetensors-ref/" + s2), repo / "blobs" / "sha-two");
  write_text(repo / "blobs" / "sha-index", "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": \"" + s2 +
                                               "\", \"model.embed.weight\": \"" + s1 + "\", \"model.norm.weight\": \"" +
                                               s1 + "\"}}");
  fs::create_symlink("../../blobs/sha-index", snap / "model.safetensors.index.json");
  fs::create_symlink("../../blobs/sha-two", snap / s2);
  fs::create_symlink("../../blobs/sha-one", snap / s1);
  {
    auto r = safeckpt::open(snap / "model.safetensors.index.json");
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
    CHECK(r->state_dict().size() == 3);
  }
  // Out of the repository, or inside it but not in blobs/: refused.
  fs::create_directories(dir.path / "elsewhere");
  fs::create_directories(repo / "refs");
  fs::copy_file(data("safetensors-ref/" + s1), dir.path / "elsewhere" / "sha-one");
  fs::copy_file(data("safetensors-ref/" + s1), repo / "refs" / "sha-one");
  for (const char* target : {"../../../elsewhere/sha-one", "../../refs/sha-one", "/etc/hostname"}) {
    CAPTURE(target);
    fs::remove(snap / s1);
    fs::create_symlink(target, snap / s1);
    auto r = safeckpt::open(snap / "model.safetensors.index.json");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kMalformed);
    CHECK(r.error().message().find("symlink") != std::string::npos);
  }
  // The same links from a directory that is not snapshots/<rev>: refused.
  const fs::path other = repo / "snapshot-copy" / "0123abc";
  fs::create_directories(other);
  fs::copy_file(repo / "blobs" / "sha-index", other / "model.safetensors.index.json");
  fs::create_symlink("../../blobs/sha-one", other / s1);
  fs::create_symlink("../../blobs/sha-two", other / s2);
  auto r = safeckpt::open(other / "model.safetensors.index.json");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::kMalformed);
}

TEST_CASE("open: hostile sharded indexes") {
  TempDir dir;
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  fs::copy_file(data("safetensors-ref/" + s1), dir.path / s1);
  fs::copy_file(data("safetensors-ref/" + s2), dir.path / s2);
  const fs::path index = dir.path / "model.safetensors.index.json";
  // The reference index: lm_head.weight in shard 2, model.embed.weight and
  // model.norm.weight in shard 1.
  auto map = [&](const std::string& entries) {
    write_text(index, "{\"metadata\": {}, \"weight_map\": {" + entries + "}}");
    return safeckpt::open(index);
  };
  const std::string good = "\"lm_head.weight\": \"" + s2 + "\", \"model.embed.weight\": \"" + s1 +
                           "\", \"model.norm.weight\": \"" + s1 + "\"";
  {
    auto ok = map(good);
    REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
    CHECK(ok->state_dict().size() == 3);
  }
  struct Bad {
    std::string entries;
    ErrorCode code;
  };
  const Bad bad[] = {
      // shard names: plain file names in the index's directory only
      {"\"lm_head.weight\": \"../" + s2 + "\"", ErrorCode::kMalformed},
      {"\"lm_head.weight\": \"/etc/passwd\"", ErrorCode::kMalformed},
      {"\"lm_head.weight\": \"sub/" + s2 + "\"", ErrorCode::kMalformed},
      {"\"lm_head.weight\": \"..\"", ErrorCode::kMalformed},
      {"\"lm_head.weight\": \"\"", ErrorCode::kMalformed},
      // a shard that is not there
      {"\"lm_head.weight\": \"model-00003-of-00002.safetensors\"", ErrorCode::kIo},
      // shard 1 holds model.norm.weight, which the index does not list
      {"\"lm_head.weight\": \"" + s2 + "\", \"model.embed.weight\": \"" + s1 + "\"", ErrorCode::kMalformed},
      // a name the index maps to a shard that does not hold it
      {good + ", \"extra.weight\": \"" + s1 + "\"", ErrorCode::kMalformed},
      // listed for the wrong shard
      {"\"lm_head.weight\": \"" + s1 + "\", \"model.embed.weight\": \"" + s1 + "\", \"model.norm.weight\": \"" + s1 +
           "\"",
       ErrorCode::kMalformed},
      // the same name twice in weight_map
      {good + ", \"lm_head.weight\": \"" + s2 + "\"", ErrorCode::kMalformed},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.entries);
    auto r = map(b.entries);
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.error().code() == b.code, r.error().to_string());
  }
  // A tensor held by two shards: a copy of shard 2 listed for another name.
  fs::copy_file(dir.path / s2, dir.path / "copy.safetensors");
  {
    auto r = map(good + ", \"other\": \"copy.safetensors\"");
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.error().code() == ErrorCode::kMalformed, r.error().to_string());
  }
  fs::remove(dir.path / "copy.safetensors");
  // Symlinks: inside the directory followed, out of it refused.
  fs::create_symlink(s1, dir.path / "alias.safetensors");
  {
    auto r = map("\"lm_head.weight\": \"" + s2 + "\", \"model.embed.weight\": \"alias.safetensors\", " +
                 "\"model.norm.weight\": \"alias.safetensors\"");
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  }
  fs::create_directory(dir.path / "elsewhere");
  fs::copy_file(dir.path / s1, dir.path / "elsewhere" / s1);
  fs::create_symlink(fs::path("elsewhere") / s1, dir.path / "out.safetensors");
  fs::create_symlink("/etc/hostname", dir.path / "etc.safetensors");
  for (const char* link : {"out.safetensors", "etc.safetensors"}) {
    CAPTURE(link);
    auto r = map("\"lm_head.weight\": \"" + s2 + "\", \"model.embed.weight\": \"" + link + "\", " +
                 "\"model.norm.weight\": \"" + link + "\"");
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.error().code() == ErrorCode::kMalformed, r.error().to_string());
    CHECK(r.error().message().find("symlink") != std::string::npos);
  }
  // Limits: JSON size and distinct shards.
  const std::string text = "{\"weight_map\": {" + good + "}}";
  SafetensorsOptions small;
  small.max_shards = 1;
  auto many = parse_safetensors_index(text, small);
  REQUIRE_FALSE(many.has_value());
  CHECK(many.error().code() == ErrorCode::kLimitExceeded);
  small = {};
  small.max_header_bytes = 16;
  auto big = parse_safetensors_index(text, small);
  REQUIRE_FALSE(big.has_value());
  CHECK(big.error().code() == ErrorCode::kLimitExceeded);
}

// Issue 11 item 3, host half: after open() parsed the file, renaming another
// file over the path changes nothing the Checkpoint gives out (storages,
// conversion): it reads the one mapping it validated, never the path again.
TEST_CASE("open: a file renamed over the path after open() is never read") {
  for (const char* which : {"corpus/torch-2.11/mlp_state_dict.pt", "corpus/torch-1.13/legacy_format.pt",
                            "safetensors-ref/basic.safetensors"}) {
    CAPTURE(which);
    TempDir dir;
    const fs::path orig = dir.path / "orig", path = dir.path / "ckpt", other = dir.path / "other";
    fs::copy_file(data(which), orig);
    fs::copy_file(data(which), path);
    auto c = safeckpt::open(path);
    REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
    struct stat before {};
    REQUIRE(::fstat(c->file().fd(), &before) == 0);
    const auto file = read_file(orig);
    write_bytes(other, with_storages_flipped(file, *c));
    REQUIRE(std::rename(other.c_str(), path.c_str()) == 0);

    // What a reopen of the path would now read: other tensor bytes.
    LoadOptions no_crc;
    no_crc.verify_storage_crc = false;
    auto reopened = safeckpt::open(path, no_crc);
    REQUIRE_MESSAGE(reopened.has_value(), (reopened ? "" : reopened.error().to_string()));
    auto expect = safeckpt::open(orig);
    REQUIRE_MESSAGE(expect.has_value(), (expect ? "" : expect.error().to_string()));
    REQUIRE(storage_bytes(*reopened) != storage_bytes(*expect));

    // What the opened Checkpoint gives: the validated bytes.
    CHECK(storage_bytes(*c) == storage_bytes(*expect));
    struct stat after {};
    REQUIRE(::fstat(c->file().fd(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);
    ToSafetensorsOptions conv;
    conv.drop_non_tensors = true;
    auto st = checkpoint_to_safetensors(*c, conv);
    auto st_expect = checkpoint_to_safetensors(*expect, conv);
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    REQUIRE_MESSAGE(st_expect.has_value(), (st_expect ? "" : st_expect.error().to_string()));
    CHECK(*st == *st_expect);
  }
}

TEST_CASE("open: a torch.distributed.checkpoint directory is its consolidated state dict") {
  const std::filesystem::path dir = std::filesystem::path(SAFECKPT_TEST_DATA) / "dcp-2.11" / "fsdp2-adamw-ws2";
  auto c = safeckpt::open(dir / "dcp");
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  auto ref = safeckpt::load(dir / "consolidated.pt");  // PyTorch's dcp_to_torch_save
  REQUIRE(ref.has_value());
  auto a = nlohmann::json::parse(*safeckpt::to_json(*c));
  auto b = nlohmann::json::parse(*safeckpt::to_json(*ref));
  test_support::normalize(a);
  test_support::normalize(b);
  CHECK_MESSAGE(a == b, test_support::first_diff(a, b));
  // A directory that is not one.
  auto none = safeckpt::open(dir / "ranks");
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().code() == safeckpt::ErrorCode::kUnsupported);
}
