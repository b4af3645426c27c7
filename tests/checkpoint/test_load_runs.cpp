// Issue 12: a load runs the pickle machine once per stream, refused streams
// included: the message that names every refused global comes from the same
// run (the loader used to parse a refused stream a second time for it).
// Counted with the machine's per-thread run counter (src/pickle/run_count.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "pickle/run_count.hpp"
#include "safeckpt/checkpoint.hpp"

using safeckpt::detail::pickle_runs_on_this_thread;

namespace {

safeckpt::Bytes as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace

TEST_CASE("load: a stream importing two refused globals is run once and both are named") {
  // PROTO 2, GLOBAL os system, GLOBAL subprocess Popen, TUPLE2, STOP.
  const std::string p =
      "\x80\x02"
      "cos\nsystem\n"
      "csubprocess\nPopen\n"
      "\x86.";
  const std::uint64_t before = pickle_runs_on_this_thread();
  auto r = safeckpt::load_bytes(as_bytes(p));
  const std::uint64_t runs = pickle_runs_on_this_thread() - before;
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == safeckpt::ErrorCode::kDisallowedGlobal);
  const std::string msg = r.error().message();
  CAPTURE(msg);
  // The first refusal leads, located at its opcode (offset 2: the first GLOBAL).
  CHECK(msg.find("os.system") < msg.find("subprocess.Popen"));
  CHECK(r.error().where().offset == 2);
  CHECK(msg.find("Every global this file imports that is not allowlisted: os.system, subprocess.Popen") !=
        std::string::npos);
  CHECK(runs == 1);
}

TEST_CASE("load: a malformed stream after a refused global still reports the refusal, in one run") {
  // GLOBAL os system, then a truncated BININT: a stop-at-first run refuses at
  // the GLOBAL and never sees the truncation; the one continue-mode run must
  // give the same answer.
  const std::string p =
      "\x80\x02"
      "cos\nsystem\n"
      "J\x01";
  const std::uint64_t before = pickle_runs_on_this_thread();
  auto r = safeckpt::load_bytes(as_bytes(p));
  const std::uint64_t runs = pickle_runs_on_this_thread() - before;
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == safeckpt::ErrorCode::kDisallowedGlobal);
  CHECK(r.error().where().offset == 2);
  CHECK(runs == 1);
}
