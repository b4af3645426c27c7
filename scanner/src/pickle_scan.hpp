// Internal: scanning pickle streams with the loader's own machine.
//
// ScanHooks is a permissive PickleHooks: it never refuses (so run_pickle in
// scanner mode keeps going through every opcode) but models just enough
// (OrderedDict/Counter/set targets, _codecs.encode bytes, persistent ids)
// that the machine's container rules fire where the loader's would, and that
// embedded byte strings and storage layouts can be recovered. Whether a
// global is allowed is decided by the Allowlist, exactly as the loader does:
// refused globals become the machine's "refused" placeholders, so calls on
// them are reported and never reach the hooks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/pickle.hpp"
#include "safeckpt/scan.hpp"

namespace safeckpt::scan {

// Collects findings and events with caps (bounded memory on hostile files).
class Sink {
 public:
  static constexpr std::size_t kMaxFindings = 10000;
  static constexpr std::size_t kMaxEvents = 100000;
  explicit Sink(FileReport& rep, bool keep_events) : rep_(rep), keep_events_(keep_events) {}
  void add(Finding f);
  void event(Event e);
  // The event just recorded at `offset` (a BUILD the hooks refuse after the
  // observer listed it) is marked not allowed.
  void refuse_last_event(std::uint64_t offset);
  void finish();  // appends the "N more findings" note
  FileReport& report() { return rep_; }

 private:
  FileReport& rep_;
  bool keep_events_;
  std::uint64_t dropped_findings_ = 0, dropped_events_ = 0;
};

struct PidInfo {
  std::string key;
  std::string storage_type;  // canonical global name of the storage class, "" if not a global
  std::int64_t numel = -1;
  bool well_formed = false;  // ("storage", <global>, <str key>, <location>, <int numel>, ...)
};

class ScanHooks final : public PickleHooks {
 public:
  ScanHooks(ValueArena& arena, const Allowlist& allow, Sink* sink) : arena_(arena), allow_(allow), sink_(sink) {}
  void set_place(std::string member, int stream, std::uint64_t base) {
    member_ = std::move(member);
    stream_ = stream;
    base_ = base;
  }
  Result<NodeId> resolve_global(std::string_view qualname, const OpContext& ctx) override;
  Result<NodeId> call(NodeId callable, NodeId args, const OpContext& ctx) override;
  Result<NodeId> new_object(NodeId cls, NodeId args, const OpContext& ctx) override;
  Status build(NodeId obj, NodeId state, const OpContext& ctx) override;
  Result<NodeId> persistent_load(NodeId pid, const OpContext& ctx) override;
  Status require_builtin(std::string_view qualname, const OpContext& ctx) override;

  std::vector<PidInfo> pids;

 private:
  Result<NodeId> opaque(std::string what);
  Result<NodeId> do_call(NodeId callable, NodeId args, bool newobj);
  ValueArena& arena_;
  const Allowlist& allow_;
  Sink* sink_;
  std::string member_;
  int stream_ = 0;
  std::uint64_t base_ = 0;
  std::unordered_set<NodeId> numpy_objects_;  // numpy dtypes/arrays: BUILD states them (as TorchHooks)
};

bool is_allowed(const Allowlist& allow, std::string_view name);

// Turns PickleEvents into Events and Findings.
class ScanObserver final : public PickleObserver {
 public:
  ScanObserver(const Allowlist& allow, Sink& sink) : allow_(allow), sink_(sink) {}
  void set_place(std::string member, int stream, std::uint64_t base) {
    member_ = std::move(member);
    stream_ = stream;
    base_ = base;
  }
  void on_event(const PickleEvent& e) override;
  void on_text_operand(std::string_view opcode, std::uint64_t offset, std::string_view text,
                       std::string_view read_as) override;
  std::uint64_t events_seen = 0;
  bool nested_loader_called = false;
  bool unsafe_seen = false;

 private:
  void finding(Rule r, Severity s, const PickleEvent& e, std::string global, std::string msg, std::string why,
               std::string category = {});
  const Allowlist& allow_;
  Sink& sink_;
  std::string member_;
  int stream_ = 0;
  std::uint64_t base_ = 0;
};

}  // namespace safeckpt::scan
