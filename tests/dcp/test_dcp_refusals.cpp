// DCP refusals: hand-written .metadata pickles (a small protocol-2 writer,
// tests/support/dcp_metadata.hpp: the shapes of PyTorch 2.11's pickle: NEWOBJ + BUILD dataclasses,
// TensorProperties' 5-tuple state) and damaged copies of a real directory.
// Each case is one error code naming what and where.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "safeckpt/dcp.hpp"
#include "support/dcp_metadata.hpp"

using namespace safeckpt;
namespace fs = std::filesystem;

namespace {

using dcp_test::Chunk;
using dcp_test::metadata;
using dcp_test::Tensor;

Result<DcpCheckpoint> parse(const std::string& md) {
  return DcpCheckpoint::parse_metadata(Bytes(reinterpret_cast<const std::uint8_t*>(md.data()), md.size()));
}

Tensor two_rows(std::vector<Chunk> chunks) {
  return Tensor{"w", {4, 3}, std::move(chunks)};
}

void expect_error(const Result<DcpCheckpoint>& r, ErrorCode code, const std::string& needle) {
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == code);
  CHECK_MESSAGE(r.error().message().find(needle) != std::string::npos, r.error().to_string());
}

fs::path real_dir() {
  return fs::path(SAFECKPT_TEST_DATA) / "dcp-2.11" / "placements-ws2" / "dcp";
}

fs::path copy_real(const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("safeckpt_dcp_bad_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(real_dir())) fs::copy_file(e.path(), dir / e.path().filename());
  return dir;
}

}  // namespace

TEST_CASE("dcp refusals: the hand-written well-formed metadata is accepted (the cases below differ in one thing)") {
  auto r = parse(metadata({two_rows({Chunk{{0, 0}, {2, 3}}, Chunk{{2, 0}, {2, 3}, "__1_0.distcp"}})}));
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  REQUIRE(r->tensors().size() == 1);
  CHECK(r->tensors()[0].chunks.size() == 2);
  CHECK(r->files().size() == 2);
}

TEST_CASE("dcp refusals: a foreign global in .metadata") {
  auto r = parse(metadata({two_rows({Chunk{{0, 0}, {4, 3}}})}, "os.system"));
  expect_error(r, ErrorCode::kDisallowedGlobal, "os.system");
  auto r2 = parse(metadata({two_rows({Chunk{{0, 0}, {4, 3}}})}, "torch.distributed.checkpoint.metadata.Evil"));
  expect_error(r2, ErrorCode::kDisallowedGlobal, "Evil");
}

TEST_CASE("dcp refusals: chunks that overlap, leave a gap, or lie outside") {
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {3, 3}}, Chunk{{2, 0}, {2, 3}, "__1_0.distcp"}})})),
               ErrorCode::kMalformed, "overlap");
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {1, 3}}, Chunk{{2, 0}, {2, 3}, "__1_0.distcp"}})})),
               ErrorCode::kMalformed, "gap");
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {2, 3}}, Chunk{{2, 0}, {3, 3}, "__1_0.distcp"}})})),
               ErrorCode::kMalformed, "outside");
  // The same chunk twice: its two storage entries collide first (MetadataIndex = fqn + offset).
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {4, 3}}, Chunk{{0, 0}, {4, 3}}})})), ErrorCode::kMalformed,
               "two storage entries for 'w' at [0, 0]");
}

TEST_CASE("dcp refusals: a chunk stored in fewer bytes than its elements, refused before any buffer is sized") {
  // Review 2026-12-06: metadata declaring a [2^37] chunk on a 1577-byte
  // payload made `convert` allocate for it (std::bad_alloc, SIGABRT); a
  // [2^30] one, 4 GiB of RSS from a 40 KB directory. A torch.save payload
  // (an uncompressed zip) is never smaller than its elements.
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {4, 3}, "__0_0.distcp", 0, 47}})})), ErrorCode::kMalformed,
               "fewer than its [4, 3] elements need");
  CHECK(parse(metadata({two_rows({Chunk{{0, 0}, {4, 3}, "__0_0.distcp", 0, 48}})})).has_value());
}

TEST_CASE("dcp refusals: two items stored in one byte range, or in overlapping ones") {
  // Review 2026-12-06: N chunks naming one large range made every consumer
  // assemble N times the bytes the directory stores. PyTorch's writer never
  // shares a range; adjacent ranges in one file are its layout.
  const std::string f = "__0_0.distcp";
  CHECK(parse(metadata({two_rows({Chunk{{0, 0}, {2, 3}, f, 0, 64}, Chunk{{2, 0}, {2, 3}, f, 64, 64}})})).has_value());
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {2, 3}, f, 0, 64}, Chunk{{2, 0}, {2, 3}, f, 0, 64}})})),
               ErrorCode::kMalformed, "overlapping bytes of __0_0.distcp");
  expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {2, 3}, f, 0, 64}, Chunk{{2, 0}, {2, 3}, f, 63, 64}})})),
               ErrorCode::kMalformed, "overlapping bytes");
  // Across tensors too, and a range inside another.
  expect_error(parse(metadata({Tensor{"a", {4, 3}, {Chunk{{0, 0}, {4, 3}, f, 0, 200}}},
                               Tensor{"b", {2, 3}, {Chunk{{0, 0}, {2, 3}, f, 100, 50}}}})),
               ErrorCode::kMalformed, "'b' and 'a'");
  // The same offsets in different files do not overlap.
  CHECK(parse(metadata({two_rows({Chunk{{0, 0}, {2, 3}, f, 0, 64}, Chunk{{2, 0}, {2, 3}, "__1_0.distcp", 0, 64}})}))
            .has_value());
}

TEST_CASE("dcp refusals: file names that leave the directory") {
  for (const char* bad : {"../x.distcp", "/etc/passwd", "a/b.distcp", "..", ".metadata", ""}) {
    CAPTURE(bad);
    expect_error(parse(metadata({two_rows({Chunk{{0, 0}, {4, 3}, bad}})})), ErrorCode::kMalformed,
                 "not a plain file name");
  }
}

TEST_CASE("dcp refusals: damaged copies of a real directory") {
  SUBCASE("missing shard file") {
    const fs::path d = copy_real("missing");
    fs::remove(d / "__1_0.distcp");
    auto r = DcpCheckpoint::open(d);
    expect_error(r, ErrorCode::kIo, "__1_0.distcp");
    fs::remove_all(d);
  }
  SUBCASE("byte range past the end of a .distcp") {
    const fs::path d = copy_real("short");
    fs::resize_file(d / "__1_0.distcp", fs::file_size(d / "__1_0.distcp") - 1);
    auto r = DcpCheckpoint::open(d);
    expect_error(r, ErrorCode::kMalformed, "past the end of __1_0.distcp");
    fs::remove_all(d);
  }
  SUBCASE("bytes in a .distcp that no item names") {
    // Review 2026-12-06: a pickle after (or ahead of) the chunks ran under
    // torch.load of the data file while the directory scanned clean.
    const fs::path d = copy_real("gap");
    std::ofstream(d / "__1_0.distcp", std::ios::binary | std::ios::app) << "\x80\x02N.";
    auto r = DcpCheckpoint::open(d);
    expect_error(r, ErrorCode::kMalformed, "the metadata's items cover");
    fs::remove_all(d);
  }
  SUBCASE("a shard file that is a symlink") {
    const fs::path d = copy_real("symlink");
    fs::rename(d / "__0_0.distcp", d / "elsewhere");
    fs::create_symlink(d / "elsewhere", d / "__0_0.distcp");
    auto r = DcpCheckpoint::open(d);
    expect_error(r, ErrorCode::kMalformed, "symlink");
    fs::remove_all(d);
  }
  SUBCASE("a chunk whose bytes are not its tensor") {
    // Swap two equal-length payloads inside __0_0.distcp (model.layers.1, a
    // float16 [6, 2] chunk at 0, and model.layers.0, an int64 [5] chunk at
    // 1577: metadata_repr.txt): every range still lies inside the file.
    const fs::path d = copy_real("swapped");
    std::string bytes;
    {
      std::ifstream in(d / "__0_0.distcp", std::ios::binary);
      bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    REQUIRE(bytes.size() > 3154);
    bytes = bytes.substr(1577, 1577) + bytes.substr(0, 1577) + bytes.substr(3154);
    {
      std::ofstream out(d / "__0_0.distcp", std::ios::binary | std::ios::trunc);
      out << bytes;
    }
    auto c = DcpCheckpoint::open(d);
    REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
    auto r = load_dcp(*c, DcpPlan::full(*c));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kMalformed);
    CHECK_MESSAGE(r.error().message().find("__0_0.distcp") != std::string::npos, r.error().to_string());
    CHECK_MESSAGE(r.error().message().find("dtype") != std::string::npos, r.error().to_string());
    fs::remove_all(d);
  }
  SUBCASE("the real .metadata is accepted") {
    auto r = DcpCheckpoint::open(real_dir());
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  }
}

TEST_CASE("dcp refusals: truncated metadata never crashes") {
  std::ifstream f(real_dir() / ".metadata", std::ios::binary);
  const std::string md((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(parse(md).has_value());
  for (std::size_t n = 0; n < md.size(); n += 7) {
    auto r = parse(md.substr(0, n));
    CHECK_FALSE(r.has_value());
  }
}

TEST_CASE("dcp refusals: 2-D tilings (grid check)") {
  // A 2x2 grid of [2,2] blocks over [4,4]: accepted.
  Tensor grid{
      "g", {4, 4}, {Chunk{{0, 0}, {2, 2}}, Chunk{{0, 2}, {2, 2}}, Chunk{{2, 0}, {2, 2}}, Chunk{{2, 2}, {2, 2}}}};
  auto ok = parse(metadata({grid}));
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  // Same element count, but one block shifted: an overlap and a gap.
  Tensor bad{"g", {4, 4}, {Chunk{{0, 0}, {2, 2}}, Chunk{{0, 2}, {2, 2}}, Chunk{{2, 0}, {2, 2}}, Chunk{{1, 1}, {2, 2}}}};
  expect_error(parse(metadata({bad})), ErrorCode::kMalformed, "overlaps");
  // L-shaped cover with a hole at [2..4, 2..4] and a [4,2] column elsewhere: element count equal, gap.
  Tensor hole{"g", {4, 4}, {Chunk{{0, 0}, {2, 4}}, Chunk{{2, 0}, {2, 2}}}};
  expect_error(parse(metadata({hole})), ErrorCode::kMalformed, "gap");
  // A grid finer than the cap.
  DcpOptions tiny;
  tiny.dcp.max_grid_cells = 3;
  const std::string md = metadata({grid});
  auto capped = DcpCheckpoint::parse_metadata(Bytes(reinterpret_cast<const std::uint8_t*>(md.data()), md.size()), tiny);
  expect_error(capped, ErrorCode::kLimitExceeded, "too fine");
}
