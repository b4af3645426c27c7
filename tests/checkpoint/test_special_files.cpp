// Special files named where a regular file is expected (a FIFO a hostile
// archive unpacked as model.pt, a device): every reader refuses them at
// once. Opening a FIFO for reading blocks until a writer comes, so a reader
// without O_NONBLOCK hung `safeckpt scan` and the loaders (found by a review
// of the compile cache, 2026-12-06); support/fifo.hpp turns such a hang into
// a failure.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/sign.hpp"
#include "support/fifo.hpp"
#include "support/save_util.hpp"

namespace fs = std::filesystem;
using safeckpt::save_test::TempDir;
using test_support::FifoWatchdog;

TEST_CASE("special files: a FIFO named as a checkpoint, allowlist, bundle or key is refused without waiting") {
  TempDir t;
  const fs::path fifo = t.path / "model.pt";
  FifoWatchdog w(fifo);
  REQUIRE(w.ok());
  auto mf = safeckpt::MappedFile::open(fifo);
  REQUIRE(!mf.has_value());
  CHECK(mf.error().message().find("not a regular file") != std::string::npos);
  auto ck = safeckpt::load(fifo);
  REQUIRE(!ck.has_value());
  CHECK(ck.error().message().find("not a regular file") != std::string::npos);
  auto al = safeckpt::Allowlist::load_file(fifo);
  REQUIRE(!al.has_value());
  CHECK(al.error().code() == safeckpt::ErrorCode::kIo);
  auto b = safeckpt::sign::read_bundle(fifo);
  REQUIRE(!b.has_value());
  CHECK(b.error().message().find("not a regular file") != std::string::npos);
  auto k = safeckpt::sign::trust_from_public_key_file(fifo);
  REQUIRE(!k.has_value());
  CHECK(k.error().message().find("not a regular file") != std::string::npos);
  CHECK_FALSE(w.had_to_unblock());
}
