// fuzz/fuzz_pickle.cpp — the pickle machine with permissive generic hooks
// (fuzz/generic_hooks.hpp): every opcode path, independent of torch policy.
//
// Option byte: bit 0 tiny limits (max_nodes 256, stack 64, memo 16, ...) to
// exercise every limit path; bits 1-5 the hooks' deny mask (refuse odd-length
// globals, calls, BUILD, persistent ids, implicit builtins); bit 7 run the
// bytes after STOP as a second stream into the same arena (legacy files).
//
// Each input runs twice, without and with continue_after_policy_error, and
// the two must agree (this is the loader/scanner differential at the pickle
// level): same success and end offset; the same first non-policy error; a
// policy error in the continue run equal to the plain run's first one.
// Plus: documented error codes only, every node id inside the arena, the
// result ends at a STOP byte, memory within a multiple of the input size.
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "generic_hooks.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/pickle.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

namespace {

struct Run {
  sc::ValueArena arena;
  sc::Result<sc::PickleResult> result = sc::make_error(sc::ErrorCode::kInternal, "not run");
};

void run_once(Run& r, sc::Bytes data, const sc::PickleOptions& opt, std::uint8_t deny, bool second_stream) {
  fz::GenericHooks hooks(r.arena, deny);
  fz::CheckingObserver obs;
  r.result = sc::run_pickle(data, r.arena, hooks, &obs, opt);
  const std::string mode = opt.continue_after_policy_error ? "run_pickle(continue)" : "run_pickle";
  if (!r.result) {
    fz::check_error(r.result.error(),
                    {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported,
                     sc::ErrorCode::kDisallowedGlobal, sc::ErrorCode::kDisallowedOperation},
                    mode);
    const auto& w = r.result.error().where();
    FUZZ_REQUIRE(
        w.offset == sc::Location::kNoOffset || w.offset <= data.size(),
        mode + ": error offset " + std::to_string(w.offset) + " past the stream of " + std::to_string(data.size()));
    fz::check_arena(r.arena, sc::kNoNode, true);
    return;
  }
  const sc::PickleResult& p = *r.result;
  FUZZ_REQUIRE(p.end_offset >= 1 && p.end_offset <= data.size(), mode + ": end_offset outside the stream");
  FUZZ_REQUIRE(data[p.end_offset - 1] == '.', mode + ": end_offset does not follow a STOP byte");
  FUZZ_REQUIRE(p.protocol >= 0 && p.protocol <= 5, mode + ": protocol " + std::to_string(p.protocol));
  fz::check_arena(r.arena, p.root, false);
  // The machine checks max_nodes before each of its own adds; only hook
  // nodes made after the cap was reached may exceed it.
  FUZZ_REQUIRE(r.arena.size() <= opt.limits.max_nodes + hooks.adds(),
               mode + ": arena of " + std::to_string(r.arena.size()) + " nodes exceeds max_nodes");

  if (second_stream && p.end_offset < data.size()) {
    // The legacy format: several pickles back to back sharing nothing but
    // the arena. The second run must not disturb the first's nodes.
    const sc::Node first_root = r.arena[p.root];
    const std::size_t before = r.arena.size();
    // Event offsets are relative to the stream passed in: a fresh observer.
    fz::CheckingObserver obs2;
    auto r2 = sc::run_pickle(data.subspan(p.end_offset), r.arena, hooks, &obs2, opt);
    if (!r2) {
      fz::check_error(r2.error(),
                      {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported,
                       sc::ErrorCode::kDisallowedGlobal, sc::ErrorCode::kDisallowedOperation},
                      mode + " (second stream)");
    } else {
      FUZZ_REQUIRE(r2->root < r.arena.size(), "second stream root outside the arena");
    }
    FUZZ_REQUIRE(r.arena.size() >= before, "arena shrank");
    FUZZ_REQUIRE(r.arena[p.root].kind == first_root.kind, "second stream changed the first stream's root kind");
    fz::check_arena(r.arena, p.root, false);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  sc::PickleOptions opt;
  opt.limits = sc::fuzz_limits();
  opt.record = "fuzz/data.pkl";
  if (in.bit(0)) {
    opt.limits.max_nodes = 256;
    opt.limits.max_stack_depth = 64;
    opt.limits.max_mark_depth = 8;
    opt.limits.max_memo_entries = 16;
    opt.limits.max_container_items = 32;
    opt.limits.max_string_bytes = 64;
    opt.limits.max_long_bytes = 9;
    opt.limits.max_pickle_ops = 512;
  }
  const auto deny = static_cast<std::uint8_t>((in.flags >> 1) & 0x1F);
  const bool second = in.bit(7);

  Run plain, cont;
  const fz::HeapProbe heap;
  run_once(plain, in.data, opt, deny, second);
  fz::check_memory(fz::check_arena(plain.arena, sc::kNoNode, true), in.data.size(), "run_pickle arena");
  heap.check(in.data.size(), "run_pickle");
  opt.continue_after_policy_error = true;
  run_once(cont, in.data, opt, deny, false);

  // Differential: the scanner mode must see the same stream the loader sees.
  // A continue run that reaches STOP succeeds and carries the first policy
  // error (PickleResult::policy_error) with the end of the stream.
  FUZZ_REQUIRE(!cont.result || !cont.result->policy_error || sc::is_policy_error(cont.result->policy_error->code()),
               "continue run carries a policy_error that is not a policy error");
  if (plain.result) {
    FUZZ_REQUIRE(cont.result.has_value(),
                 "plain run succeeded, continue run failed: " + cont.result.error().to_string());
    FUZZ_REQUIRE(!cont.result->policy_error,
                 "plain run succeeded, continue run reports a policy error: " + cont.result->policy_error->to_string());
    FUZZ_REQUIRE(cont.result->end_offset == plain.result->end_offset, "continue run stopped at a different STOP");
    FUZZ_REQUIRE(cont.result->protocol == plain.result->protocol, "continue run saw a different protocol");
    FUZZ_REQUIRE(cont.arena[cont.result->root].kind == plain.arena[plain.result->root].kind,
                 "continue run built a different root");
    return 0;
  }
  const sc::Error& pe = plain.result.error();
  if (cont.result) {
    FUZZ_REQUIRE(cont.result->policy_error.has_value(),
                 "plain run failed (" + pe.to_string() + ") but the continue run succeeded without a policy error");
    const sc::Error& ce = *cont.result->policy_error;
    FUZZ_REQUIRE(sc::is_policy_error(pe.code()) && ce.code() == pe.code() && ce.where().offset == pe.where().offset,
                 "first policy error differs between modes: plain " + pe.to_string() + " / continue " + ce.to_string());
    return 0;
  }
  const sc::Error& ce = cont.result.error();
  if (!sc::is_policy_error(pe.code())) {
    FUZZ_REQUIRE(ce.code() == pe.code() && ce.where().offset == pe.where().offset,
                 "non-policy error differs between modes: plain " + pe.to_string() + " / continue " + ce.to_string());
  } else if (sc::is_policy_error(ce.code())) {
    FUZZ_REQUIRE(ce.code() == pe.code() && ce.where().offset == pe.where().offset,
                 "first policy error differs between modes: plain " + pe.to_string() + " / continue " + ce.to_string());
  }
  return 0;
}
