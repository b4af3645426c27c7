// fuzz/generic_hooks.hpp — a permissive PickleHooks for fuzzing the pickle
// machine on its own: every global resolves to a kGlobal node, every call to
// a kObject node holding its arguments, BUILD stores the state. Nothing is
// executed. A "deny" mask refuses some operations with policy errors so the
// machine's policy / continue-after-policy-error paths run too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "safeckpt/pickle.hpp"

namespace safeckpt::fuzz {

class GenericHooks final : public PickleHooks {
 public:
  // deny bits: 1 globals whose name has an odd length, 2 every call,
  // 4 BUILD, 8 persistent ids, 16 implicit builtins (set/frozenset/bytearray).
  GenericHooks(ValueArena& arena, std::uint8_t deny) : arena_(arena), deny_(deny) {}

  Result<NodeId> resolve_global(std::string_view qualname, const OpContext& ctx) override {
    check_ctx(ctx);
    if ((deny_ & 1) && qualname.size() % 2 == 1)
      return make_error(ErrorCode::kDisallowedGlobal, "fuzz hooks refuse '" + std::string(qualname) + "'");
    Node n;
    n.kind = Kind::kGlobal;
    n.text = std::string(qualname);
    return add(std::move(n));
  }
  Result<NodeId> call(NodeId callable, NodeId args, const OpContext& ctx) override {
    return object(callable, args, ctx);
  }
  Result<NodeId> new_object(NodeId cls, NodeId args, const OpContext& ctx) override { return object(cls, args, ctx); }
  Status build(NodeId obj, NodeId state, const OpContext& ctx) override {
    check_ctx(ctx);
    check_id(obj);
    check_id(state);
    if (deny_ & 4) return make_error(ErrorCode::kDisallowedOperation, "fuzz hooks refuse BUILD");
    Node& o = arena_[obj];
    if (o.kind == Kind::kObject && o.items.size() == 2)
      o.items[1] = state;
    else if (o.kind == Kind::kOrderedDict)
      o.attrs = state;
    return {};
  }
  Result<NodeId> persistent_load(NodeId pid, const OpContext& ctx) override {
    check_ctx(ctx);
    check_id(pid);
    if (deny_ & 8) return make_error(ErrorCode::kDisallowedOperation, "fuzz hooks refuse persistent ids");
    Node n;
    n.kind = Kind::kObject;
    n.text = "<persistent>";
    n.items = {pid, kNoNode};
    return add(std::move(n));
  }
  Status require_builtin(std::string_view qualname, const OpContext& ctx) override {
    check_ctx(ctx);
    if (deny_ & 16) return make_error(ErrorCode::kDisallowedGlobal, "fuzz hooks refuse " + std::string(qualname));
    return {};
  }

  std::uint64_t calls() const noexcept { return calls_; }
  std::uint64_t adds() const noexcept { return adds_; }

 private:
  void check_ctx(const OpContext& ctx) const {
    FUZZ_REQUIRE(!ctx.opcode.empty(), "hook called without an opcode name");
    FUZZ_REQUIRE(ctx.protocol >= 0 && ctx.protocol <= 5, "hook called with protocol " + std::to_string(ctx.protocol));
  }
  void check_id(NodeId id) const {
    FUZZ_REQUIRE(id < arena_.size(), "hook got node " + std::to_string(id) + " outside the arena");
  }
  Result<NodeId> object(NodeId callable, NodeId args, const OpContext& ctx) {
    check_ctx(ctx);
    check_id(callable);
    check_id(args);
    FUZZ_REQUIRE(arena_[args].kind == Kind::kTuple, "call/new_object arguments are not a tuple");
    ++calls_;
    if (deny_ & 2) return make_error(ErrorCode::kDisallowedOperation, "fuzz hooks refuse calls");
    Node n;
    n.kind = Kind::kObject;
    n.text = arena_[callable].kind == Kind::kGlobal ? arena_[callable].text : "<call>";
    n.items = {args, kNoNode};
    return add(std::move(n));
  }
  Result<NodeId> add(Node n) {
    // Mirrors what a real policy must do: hooks respect max_nodes too; the
    // machine checks its own adds, the harness checks the total afterwards.
    ++adds_;
    return arena_.add(std::move(n));
  }

  ValueArena& arena_;
  std::uint8_t deny_;
  std::uint64_t calls_ = 0;
  std::uint64_t adds_ = 0;
};

// Records events and checks their shape.
class CheckingObserver final : public PickleObserver {
 public:
  void on_event(const PickleEvent& e) override {
    FUZZ_REQUIRE(static_cast<unsigned>(e.type) <= static_cast<unsigned>(PickleEvent::Type::kPersistentId),
                 "event with an invalid type");
    FUZZ_REQUIRE(!e.opcode.empty(), "event without an opcode name");
    if (e.type == PickleEvent::Type::kImport) FUZZ_REQUIRE(!e.name.empty(), "import event without a name");
    if (e.dynamic) FUZZ_REQUIRE(e.name == "<dynamic>", "dynamic import event not named <dynamic>");
    FUZZ_REQUIRE(e.offset >= last_offset_, "events out of stream order");
    last_offset_ = e.offset;
    ++events_;
  }
  std::uint64_t events() const noexcept { return events_; }

 private:
  std::uint64_t last_offset_ = 0;
  std::uint64_t events_ = 0;
};

}  // namespace safeckpt::fuzz
