// The restricted pickle machine. Grammar and rules: include/safeckpt/pickle.hpp.
// Semantics follow CPython's Modules/_pickle.c (the unpickler torch.load
// drives) where the pure-Python pickle.py and the C version differ, e.g. the
// stack "fence" at the last MARK.
#include <charconv>
#include <cmath>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pickle/key.hpp"
#include "pickle/opcodes.hpp"
#include "pickle/run_count.hpp"
#include "pickle/run_detail.hpp"
#include "pickle/text.hpp"
#include "safeckpt/pickle.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

using pickle_text::bigint_decimal;
using pickle_text::c_string;
using pickle_text::c_strtol_line;
using pickle_text::canonical_decimal;
using pickle_text::escape_decode;
using pickle_text::kMaxCPythonNumberText;
using pickle_text::parse_decimal_int;
using pickle_text::python_int;
using pickle_text::raw_unicode_escape_decode;
using pickle_text::shown_text;
using pickle_text::TextInt;
using pickle_text::valid_utf8;

constexpr std::string_view kRefusedObject = "<refused>";

// The unit costs charged to the budget must stay upper bounds of the real ones.
static_assert(2 * sizeof(Node) <= MemoryBudget::kNodeBytes);
static_assert(2 * sizeof(NodeId) <= MemoryBudget::kItemBytes);
static_assert(2 * sizeof(std::size_t) <= MemoryBudget::kMarkBytes);
static_assert(sizeof(std::string) <= MemoryBudget::kStringBytes);

// The wording of every refusal of an opcode that calls: the same as the
// GLOBAL/REDUCE refusals of known-dangerous callables (src/torch/messages.cpp),
// so a user reads one sentence for one risk. torch.save never writes these
// opcodes; torch.load(weights_only=True) refuses them ("Unsupported operand").
constexpr const char* kCodeRunWords =
    ": this file tries to run code when unpickled (torch.save never writes this opcode; "
    "torch.load(weights_only=True) refuses it too); refused. Do not load this file with "
    "torch.load(weights_only=False)";

class Machine {
 public:
  Machine(Bytes data, ValueArena& arena, PickleHooks& hooks, PickleObserver* obs, const PickleOptions& opt)
      : d_(data),
        arena_(arena),
        hooks_(hooks),
        obs_(obs),
        opt_(opt),
        lim_(opt.limits),
        own_budget_(opt.limits.max_memory_bytes),
        budget_(opt.budget != nullptr ? *opt.budget : own_budget_),
        charged_nodes_(arena.size()) {}

  Result<PickleResult> run();
  // After a failed run in continue mode: the first policy error met before
  // the failure, if any (src/pickle/run_detail.hpp).
  std::optional<Error>& first_policy_error() noexcept { return first_policy_error_; }

 private:
  // ---- errors -------------------------------------------------------------
  Unexpected fail(ErrorCode code, std::string msg) {
    return make_error(code, std::move(msg), Location{opt_.record, op_offset_, std::string(opcode_name(op_))});
  }
  Unexpected malformed(std::string msg) { return fail(ErrorCode::kMalformed, std::move(msg)); }
  // Ran out of bytes: malformed, or past the limit when the caller cut the
  // stream there (PickleOptions::input_cut_at_limit).
  Unexpected truncated(std::string msg) {
    if (!opt_.input_cut_at_limit) return malformed(std::move(msg));
    return fail(ErrorCode::kLimitExceeded,
                "pickle stream longer than max_pickle_bytes (" + std::to_string(lim_.max_pickle_bytes) + ")");
  }
  Error with_context(Error e) {
    e.at_record(opt_.record);
    e.at_offset(op_offset_);
    e.at_opcode(opcode_name(op_));
    return e;
  }
  // A policy error: in scanner mode remember the first and carry on.
  Status policy(Error e) {
    e = with_context(std::move(e));
    if (!opt_.continue_after_policy_error) return unexpected(std::move(e));
    if (!first_policy_error_) first_policy_error_ = std::move(e);
    return {};
  }
  OpContext ctx() { return OpContext{opt_.record, op_offset_, opcode_name(op_), protocol_, &budget_}; }

  // ---- memory budget --------------------------------------------------------
  Status charge(std::uint64_t bytes, const char* what) {
    auto st = budget_.charge(bytes, what);
    if (!st) return unexpected(with_context(std::move(st).error()));
    return {};
  }
  static std::uint64_t text_cost(const std::string& t) {
    return t.capacity() < sizeof(std::string) ? 0 : t.capacity() + MemoryBudget::kStringBytes;
  }
  static std::uint64_t node_cost(const Node& n, bool text_charged) {
    return MemoryBudget::kNodeBytes + (text_charged ? 0 : text_cost(n.text)) +
           n.items.capacity() * MemoryBudget::kItemBytes;
  }
  // Charges the nodes hooks added since the last call (the machine's own
  // nodes are charged before they are added).
  Status charge_hook_nodes() {
    for (; charged_nodes_ < arena_.size(); ++charged_nodes_)
      SAFECKPT_CHECK(
          charge(node_cost(arena_[static_cast<NodeId>(charged_nodes_)], false), "value nodes made by hooks"));
    return {};
  }
  // A string of `n` bytes about to be allocated.
  Status charge_text(std::uint64_t n, const char* what) {
    return charge(n < sizeof(std::string) ? 0 : n + MemoryBudget::kStringBytes, what);
  }

  // ---- reading --------------------------------------------------------------
  Result<Bytes> read(std::size_t n) {
    if (frame_end_ != 0) {
      if (pos_ == frame_end_) {
        frame_end_ = 0;  // frame fully consumed: continue with the stream
      } else if (n > frame_end_ - pos_) {
        return malformed("argument crosses the end of the current FRAME (frame ends at " + std::to_string(frame_end_) +
                         ")");
      }
    }
    if (n > d_.size() - pos_)
      return truncated("pickle data truncated: need " + std::to_string(n) + " bytes, " +
                       std::to_string(d_.size() - pos_) + " left");
    Bytes b = d_.subspan(pos_, n);
    pos_ += n;
    return b;
  }
  template <class T>
  Result<T> read_le() {
    SAFECKPT_TRY(Bytes b, read(sizeof(T)));
    return util::load_le<T>(b.data());
  }
  Result<std::string_view> read_line() {
    std::size_t limit = frame_end_ != 0 && pos_ != frame_end_ ? frame_end_ : d_.size();
    if (frame_end_ != 0 && pos_ == frame_end_) frame_end_ = 0;
    const void* nl = std::memchr(d_.data() + pos_, '\n', limit - pos_);
    if (nl == nullptr)
      return frame_end_ != 0 ? malformed("line crosses the end of the current FRAME")
                             : truncated("pickle data truncated in a text line");
    std::size_t end = static_cast<std::size_t>(static_cast<const std::uint8_t*>(nl) - d_.data());
    if (end - pos_ > lim_.max_string_bytes)
      return fail(ErrorCode::kLimitExceeded, "text argument longer than max_string_bytes");
    std::string_view s(reinterpret_cast<const char*>(d_.data() + pos_), end - pos_);
    pos_ = end + 1;
    return s;
  }
  Status check_len(std::uint64_t n, std::uint64_t cap, const char* what) {
    if (n > cap)
      return fail(ErrorCode::kLimitExceeded, std::string(what) + " of " + std::to_string(n) +
                                                 " bytes exceeds the limit of " + std::to_string(cap));
    if (n > d_.size() - pos_)
      return malformed(std::string(what) + " declares " + std::to_string(n) + " bytes but only " +
                       std::to_string(d_.size() - pos_) + " remain");
    return {};
  }

  // ---- nodes and stack ----------------------------------------------------
  // text_charged: the caller charged the node's text before building it.
  Result<NodeId> add(Node n, bool text_charged = false) {
    if (arena_.size() >= lim_.max_nodes)
      return fail(ErrorCode::kLimitExceeded, "more than max_nodes (" + std::to_string(lim_.max_nodes) + ") values");
    SAFECKPT_CHECK(charge_hook_nodes());
    SAFECKPT_CHECK(charge(node_cost(n, text_charged), "value node"));
    try {
      NodeId id = arena_.add(std::move(n));
      charged_nodes_ = arena_.size();
      return id;
    } catch (const std::bad_alloc&) {
      return fail(ErrorCode::kLimitExceeded, "out of memory building values");
    }
  }
  Status push(NodeId id) {
    if (stack_.size() >= lim_.max_stack_depth)
      return fail(ErrorCode::kLimitExceeded, "pickle stack deeper than max_stack_depth");
    if (stack_.size() >= stack_charged_) {
      SAFECKPT_CHECK(charge(MemoryBudget::kItemBytes, "pickle stack"));
      ++stack_charged_;
    }
    stack_.push_back(id);
    return {};
  }
  Status push_new(Node n, bool text_charged = false) {
    SAFECKPT_TRY(NodeId id, add(std::move(n), text_charged));
    return push(id);
  }
  std::size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  Result<NodeId> pop() {
    if (stack_.size() <= fence()) return malformed("stack underflow");
    NodeId v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Result<NodeId> top() {
    if (stack_.size() <= fence()) return malformed("stack underflow");
    return stack_.back();
  }
  Result<std::vector<NodeId>> pop_mark() {
    if (marks_.empty()) return malformed("could not find MARK");
    std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<NodeId> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Result<NodeId> make_container(Kind k, std::vector<NodeId> items) {
    if (items.size() > lim_.max_container_items)
      return fail(ErrorCode::kLimitExceeded, "container with more than max_container_items items");
    Node n;
    n.kind = k;
    n.items = std::move(items);
    return add(std::move(n));
  }
  Result<NodeId> refused_placeholder(std::string name) {
    Node n;
    n.kind = Kind::kObject;
    n.text = std::string(kRefusedObject);
    if (!name.empty()) n.text += ":" + name;
    return add(std::move(n));
  }
  bool is_refused(NodeId id) const {
    const Node& n = arena_[id];
    return (n.kind == Kind::kObject && n.text.rfind(kRefusedObject, 0) == 0) || (n.kind == Kind::kGlobal && n.i < 0);
  }
  std::string callee_name(NodeId id) const {
    const Node& n = arena_[id];
    if (n.kind == Kind::kGlobal) return n.text;
    if (n.kind == Kind::kObject && n.text.rfind(kRefusedObject, 0) == 0)
      return n.text.size() > kRefusedObject.size() ? n.text.substr(kRefusedObject.size() + 1) : "<refused>";
    return std::string("<") + std::string(kind_name(n.kind)) + ">";
  }

  // ---- events -------------------------------------------------------------
  void emit(PickleEvent::Type t, std::string name, std::string raw_module = {}, std::string raw_name = {},
            bool dynamic = false, bool dotted = false) {
    if (obs_ == nullptr) return;
    PickleEvent e;
    e.type = t;
    e.opcode = std::string(opcode_name(op_));
    e.offset = op_offset_;
    e.name = std::move(name);
    e.raw_module = std::move(raw_module);
    e.raw_name = std::move(raw_name);
    e.dynamic = dynamic;
    e.dotted = dotted;
    obs_->on_event(e);
  }

  // ---- operations -----------------------------------------------------------
  Status do_global(std::string_view module, std::string_view name);
  Status do_call(NodeId callable, NodeId args);
  Status do_setitems(NodeId target, const std::vector<NodeId>& kv);
  Status do_additems(NodeId target, const std::vector<NodeId>& items);
  Status do_append(NodeId target, const std::vector<NodeId>& items);
  Status push_int_text(std::string_view line, bool is_long);
  Status push_text_int(const TextInt& t);
  // GET/PUT text index (canonical: decimal digits).
  Result<std::uint64_t> memo_index_text(std::string_view line, bool put);
  // A non-canonical text operand read CPython's way: tell the observer.
  void note_text(std::string_view text, std::string_view read_as);
  // `s` was charged by the caller (charge_text) before it was built.
  Status push_string(std::string s, Kind k) {
    Node n;
    n.kind = k;
    n.text = std::move(s);
    return push_new(std::move(n), true);
  }
  Status push_utf8(Bytes b, bool surrogatepass) {
    SAFECKPT_CHECK(charge_text(b.size(), "string"));
    std::string s(reinterpret_cast<const char*>(b.data()), b.size());
    if (!valid_utf8(s, surrogatepass)) return malformed("string is not valid UTF-8");
    return push_string(std::move(s), Kind::kStr);
  }
  Status push_long_bytes(Bytes b) {
    if (b.size() > lim_.max_long_bytes)
      return fail(ErrorCode::kLimitExceeded,
                  "integer of " + std::to_string(b.size()) + " bytes exceeds max_long_bytes");
    Node n;
    bool neg = !b.empty() && (b[b.size() - 1] & 0x80);
    // Fits int64 if every byte past the 8th is sign extension and byte 7 agrees.
    bool fits = true;
    for (std::size_t i = 8; i < b.size(); ++i)
      if (b[i] != (neg ? 0xFF : 0x00)) fits = false;
    if (fits && b.size() > 8 && ((b[7] & 0x80) != 0) != neg) fits = false;
    if (fits) {
      std::uint64_t u = neg ? ~std::uint64_t{0} : 0;
      for (std::size_t i = 0; i < b.size() && i < 8; ++i) {
        u &= ~(std::uint64_t{0xFF} << (8 * i));
        u |= std::uint64_t{b[i]} << (8 * i);
      }
      n.kind = Kind::kInt;
      n.i = static_cast<std::int64_t>(u);
    } else {
      n.kind = Kind::kBigInt;
      // bigint_decimal holds n bytes of limbs and <= 2.5 digits per byte.
      SAFECKPT_CHECK(charge_text(4 * b.size() + 16, "long integer"));
      n.text = bigint_decimal(b.data(), b.size());
      return push_new(std::move(n), true);
    }
    return push_new(std::move(n));
  }
  Status push_int(std::int64_t v) {
    Node n;
    n.kind = Kind::kInt;
    n.i = v;
    return push_new(std::move(n));
  }
  Status memo_put(std::uint64_t idx) {
    SAFECKPT_TRY(NodeId v, top());
    auto it = memo_.find(idx);
    if (it == memo_.end()) {
      if (memo_.size() >= lim_.max_memo_entries)
        return fail(ErrorCode::kLimitExceeded, "more than max_memo_entries memo entries");
      SAFECKPT_CHECK(charge(MemoryBudget::kMemoEntryBytes, "memo entry"));
      memo_.emplace(idx, v);
    } else {
      it->second = v;
    }
    return {};
  }
  Status memo_get(std::uint64_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) return malformed("memo key " + std::to_string(idx) + " not found");
    return push(it->second);
  }

  Bytes d_;
  ValueArena& arena_;
  PickleHooks& hooks_;
  PickleObserver* obs_;
  const PickleOptions& opt_;
  const Limits& lim_;
  MemoryBudget own_budget_;
  MemoryBudget& budget_;
  std::size_t charged_nodes_;      // arena nodes below this index are charged
  std::size_t stack_charged_ = 0;  // stack slots charged (high-water mark)
  std::size_t marks_charged_ = 0;  // MARK slots charged (high-water mark)
  std::size_t pos_ = 0;
  std::size_t frame_end_ = 0;  // 0 = not inside a frame
  std::uint8_t op_ = 0;
  std::uint64_t op_offset_ = 0;
  int protocol_ = 0;
  int max_protocol_ = 0;
  std::vector<NodeId> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, NodeId> memo_;
  KeyIndex keys_;
  std::optional<Error> first_policy_error_;
};

Status Machine::do_global(std::string_view module, std::string_view name) {
  SAFECKPT_CHECK(charge_text(2 * (module.size() + name.size() + 1), "global name"));
  std::string canon = canonical_global_name(module, name, protocol_);
  bool dotted = name.find('.') != std::string_view::npos;
  emit(PickleEvent::Type::kImport, canon, std::string(module), std::string(name), false, dotted);
  if (dotted || module.empty() || name.empty()) {
    SAFECKPT_CHECK(policy(Error(ErrorCode::kDisallowedGlobal, "global '" + canon + "' " +
                                                                  (dotted ? "walks attributes (dotted name); refused"
                                                                          : "has an empty module or name"))));
    Node g;
    g.kind = Kind::kGlobal;
    g.text = canon;
    g.i = -1;
    return push_new(std::move(g));
  }
  auto r = hooks_.resolve_global(canon, ctx());
  SAFECKPT_CHECK(charge_hook_nodes());
  if (r) return push(*r);
  SAFECKPT_CHECK(policy(std::move(r).error()));
  Node g;
  g.kind = Kind::kGlobal;
  g.text = canon;
  g.i = -1;
  return push_new(std::move(g));
}

Status Machine::do_call(NodeId callable, NodeId args) {
  emit(PickleEvent::Type::kCall, callee_name(callable));
  if (arena_[args].kind != Kind::kTuple) return malformed("REDUCE/NEWOBJ arguments are not a tuple");
  if (is_refused(callable)) {
    // The import was already refused (scanner mode): do not ask the policy
    // about a call on a placeholder; keep the stack shape.
    SAFECKPT_TRY(NodeId ph, refused_placeholder(callee_name(callable)));
    return push(ph);
  }
  auto r = op_ == op::kNewObj ? hooks_.new_object(callable, args, ctx()) : hooks_.call(callable, args, ctx());
  SAFECKPT_CHECK(charge_hook_nodes());
  if (r) return push(*r);
  if (!is_policy_error(r.error().code())) return unexpected(with_context(std::move(r).error()));
  SAFECKPT_CHECK(policy(std::move(r).error()));
  SAFECKPT_TRY(NodeId ph, refused_placeholder(callee_name(callable)));
  return push(ph);
}

Status Machine::do_append(NodeId target, const std::vector<NodeId>& items) {
  Node& t = arena_[target];
  if (t.kind != Kind::kList)
    return policy(
        Error(ErrorCode::kDisallowedOperation, "Can only append to lists, but got " + std::string(kind_name(t.kind))));
  if (items.size() > lim_.max_container_items - std::min<std::uint64_t>(lim_.max_container_items, t.items.size()))
    return fail(ErrorCode::kLimitExceeded, "list with more than max_container_items items");
  SAFECKPT_CHECK(charge(items.size() * MemoryBudget::kItemBytes, "list items"));
  t.items.insert(t.items.end(), items.begin(), items.end());
  return {};
}

Status Machine::do_setitems(NodeId target, const std::vector<NodeId>& kv) {
  Kind k = arena_[target].kind;
  if (k != Kind::kDict && k != Kind::kOrderedDict && k != Kind::kCounter)
    return policy(Error(ErrorCode::kDisallowedOperation,
                        "Can only SETITEM(S) for dict, collections.OrderedDict, collections.Counter, but got " +
                            std::string(kind_name(k))));
  for (std::size_t i = 0; i + 1 < kv.size(); i += 2) {
    auto key = keys_.key_of(arena_, kv[i], lim_);
    if (!key) {
      // Unhashable key (policy) -> scanner mode records it and skips the
      // item, so the run still fails with the FIRST policy error.
      if (!is_policy_error(key.error().code())) return unexpected(with_context(std::move(key).error()));
      SAFECKPT_CHECK(policy(std::move(key).error()));
      continue;
    }
    SAFECKPT_CHECK(charge(MemoryBudget::kKeyEntryBytes + key->size() + 2 * MemoryBudget::kItemBytes, "dict item"));
    auto slot = keys_.find_or_insert(target, *key, arena_[target].items.size() / 2);
    if (keys_.stored_bytes() > lim_.max_string_bytes)
      return fail(ErrorCode::kLimitExceeded, "dict keys exceed max_string_bytes in total");
    if (slot.inserted) {
      if (arena_[target].items.size() / 2 >= lim_.max_container_items)
        return fail(ErrorCode::kLimitExceeded, "dict with more than max_container_items items");
      arena_[target].items.push_back(kv[i]);
      arena_[target].items.push_back(kv[i + 1]);
    } else {
      arena_[target].items[2 * slot.index + 1] = kv[i + 1];  // Python keeps the first key object
    }
  }
  return {};
}

Status Machine::do_additems(NodeId target, const std::vector<NodeId>& items) {
  Kind k = arena_[target].kind;
  if (k != Kind::kSet)
    return policy(
        Error(ErrorCode::kDisallowedOperation, "Can only ADDITEMS to a set, but got " + std::string(kind_name(k))));
  for (NodeId it : items) {
    auto key = keys_.key_of(arena_, it, lim_);
    if (!key) {
      // Unhashable key (policy) -> scanner mode records it and skips the
      // item, so the run still fails with the FIRST policy error.
      if (!is_policy_error(key.error().code())) return unexpected(with_context(std::move(key).error()));
      SAFECKPT_CHECK(policy(std::move(key).error()));
      continue;
    }
    SAFECKPT_CHECK(charge(MemoryBudget::kKeyEntryBytes + key->size() + MemoryBudget::kItemBytes, "set item"));
    auto slot = keys_.find_or_insert(target, *key, arena_[target].items.size());
    if (keys_.stored_bytes() > lim_.max_string_bytes)
      return fail(ErrorCode::kLimitExceeded, "set members exceed max_string_bytes in total");
    if (slot.inserted) {
      if (arena_[target].items.size() >= lim_.max_container_items)
        return fail(ErrorCode::kLimitExceeded, "set with more than max_container_items items");
      arena_[target].items.push_back(it);
    }
  }
  return {};
}

void Machine::note_text(std::string_view text, std::string_view read_as) {
  if (obs_ != nullptr) obs_->on_text_operand(opcode_name(op_), op_offset_, shown_text(text), read_as);
}

Status Machine::push_text_int(const TextInt& t) {
  if (t.dec.size() > lim_.max_long_bytes * 3) return fail(ErrorCode::kLimitExceeded, "integer literal too long");
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(t.dec.data(), t.dec.data() + t.dec.size(), v);
  if (ec == std::errc() && ptr == t.dec.data() + t.dec.size()) return push_int(t.neg ? -v : v);
  if (t.neg && t.dec == "9223372036854775808") return push_int(INT64_MIN);
  Node n;
  n.kind = Kind::kBigInt;
  SAFECKPT_CHECK(charge_text(t.dec.size() + 1, "long integer"));
  n.text = (t.neg && t.dec != "0" ? "-" : "") + t.dec;
  return push_new(std::move(n), true);
}

Status Machine::push_int_text(std::string_view line, bool is_long) {
  if (!is_long && (line == "00" || line == "01")) {
    Node n;
    n.kind = Kind::kBool;
    n.flag = line == "01";
    return push_new(std::move(n));
  }
  std::string_view body = line;
  if (is_long && !body.empty() && body.back() == 'L') body.remove_suffix(1);
  // INT "-0" is a 2-character line: CPython reads it as False.
  if (canonical_decimal(body) && (is_long || body != "-0")) {
    std::string digits;
    bool neg = false;
    if (!parse_decimal_int(body, digits, neg)) return malformed("invalid literal for int: '" + shown_text(line) + "'");
    return push_text_int(TextInt{neg, digits});
  }
  if (!opt_.cpython_text_operands || line.empty())
    return malformed("invalid literal for int: '" + shown_text(line) +
                     "' (not the text pickle writes, -?[1-9][0-9]*; refused even where CPython would read it)");
  if (line.size() > kMaxCPythonNumberText) return fail(ErrorCode::kLimitExceeded, "integer literal too long");
  std::optional<TextInt> t;
  if (!is_long) {
    if (auto x = c_strtol_line(line)) {
      if (line.size() == 2 && (*x == 0 || *x == 1)) {
        note_text(line, *x != 0 ? "True" : "False");
        Node n;
        n.kind = Kind::kBool;
        n.flag = *x != 0;
        return push_new(std::move(n));
      }
      note_text(line, std::to_string(*x));
      return push_int(*x);
    }
    t = python_int(line, 0);
  } else {
    t = python_int(body, 0);
  }
  if (!t) return malformed("invalid literal for int() with base 0: '" + shown_text(line) + "'");
  note_text(line, (t->neg && t->dec != "0" ? "-" : "") + t->dec);
  return push_text_int(*t);
}

Result<std::uint64_t> Machine::memo_index_text(std::string_view line, bool put) {
  std::uint64_t idx = 0;
  auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), idx);
  if (!line.empty() && ec == std::errc() && ptr == line.data() + line.size()) return idx;
  std::string what = put ? "PUT" : "GET";
  if (!opt_.cpython_text_operands || line.empty() || line.size() > kMaxCPythonNumberText)
    return malformed("invalid " + what + " index");
  auto t = python_int(line, 10);
  if (!t) return malformed("invalid literal for int() with base 10: '" + shown_text(line) + "'");
  if (t->neg && t->dec != "0")
    return malformed(put ? "negative PUT argument" : "GET index is negative: the memo has no such key");
  auto [p2, ec2] = std::from_chars(t->dec.data(), t->dec.data() + t->dec.size(), idx);
  if (ec2 != std::errc() || p2 != t->dec.data() + t->dec.size()) return malformed("invalid " + what + " index");
  note_text(line, t->dec);
  return idx;
}

Result<PickleResult> Machine::run() {
  if (d_.size() > lim_.max_pickle_bytes)
    return make_error(ErrorCode::kLimitExceeded,
                      "pickle of " + std::to_string(d_.size()) + " bytes exceeds max_pickle_bytes",
                      Location{opt_.record, 0, ""});
  std::uint64_t ops = 0;
  for (;;) {
    if (frame_end_ != 0 && pos_ == frame_end_) frame_end_ = 0;
    op_offset_ = pos_;
    op_ = 0;
    if (pos_ >= d_.size()) return truncated("pickle data was truncated (no STOP)");
    if (++ops > lim_.max_pickle_ops)
      return fail(ErrorCode::kLimitExceeded,
                  "more than max_pickle_ops (" + std::to_string(lim_.max_pickle_ops) + ") opcodes");
    {
      SAFECKPT_TRY(Bytes b, read(1));
      op_ = b[0];
    }
    switch (op_) {
      case op::kProto: {
        SAFECKPT_TRY(auto v, read_le<std::uint8_t>());
        if (v > 5) return fail(ErrorCode::kUnsupported, "unsupported pickle protocol: " + std::to_string(v));
        protocol_ = v;
        if (v > max_protocol_) max_protocol_ = v;
        break;
      }
      case op::kFrame: {
        SAFECKPT_TRY(auto n, read_le<std::uint64_t>());
        if (frame_end_ != 0) return malformed("beginning of a new frame before end of current frame");
        if (n > d_.size() - pos_) return malformed("FRAME of " + std::to_string(n) + " bytes exceeds the stream");
        if (n > 0) frame_end_ = pos_ + n;
        break;
      }
      case op::kStop: {
        if (!marks_.empty()) return malformed("STOP with an open MARK");
        if (stack_.size() != 1)
          return malformed("STOP with " + std::to_string(stack_.size()) + " values on the stack (expected 1)");
        if (frame_end_ != 0 && pos_ != frame_end_) return malformed("STOP before the end of the current FRAME");
        SAFECKPT_CHECK(charge_hook_nodes());
        return PickleResult{stack_.back(), pos_, max_protocol_, std::move(first_policy_error_)};
      }
      case op::kMark:
        if (marks_.size() >= lim_.max_mark_depth)
          return fail(ErrorCode::kLimitExceeded, "MARK nesting exceeds max_mark_depth");
        if (marks_.size() >= marks_charged_) {
          SAFECKPT_CHECK(charge(MemoryBudget::kMarkBytes, "MARK stack"));
          ++marks_charged_;
        }
        marks_.push_back(stack_.size());
        break;
      case op::kPop:
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();
        } else {
          SAFECKPT_CHECK(pop());
        }
        break;
      case op::kPopMark: {
        SAFECKPT_CHECK(pop_mark());
        break;
      }
      case op::kDup: {
        SAFECKPT_TRY(NodeId v, top());
        SAFECKPT_CHECK(push(v));
        break;
      }
      case op::kNone: SAFECKPT_CHECK(push_new(Node{})); break;
      case op::kNewTrue:
      case op::kNewFalse: {
        Node n;
        n.kind = Kind::kBool;
        n.flag = op_ == op::kNewTrue;
        SAFECKPT_CHECK(push_new(std::move(n)));
        break;
      }
      case op::kInt: {
        SAFECKPT_TRY(auto line, read_line());
        SAFECKPT_CHECK(push_int_text(line, false));
        break;
      }
      case op::kLong: {
        SAFECKPT_TRY(auto line, read_line());
        SAFECKPT_CHECK(push_int_text(line, true));
        break;
      }
      case op::kBinInt: {
        SAFECKPT_TRY(auto v, read_le<std::uint32_t>());
        SAFECKPT_CHECK(push_int(static_cast<std::int32_t>(v)));
        break;
      }
      case op::kBinInt1: {
        SAFECKPT_TRY(auto v, read_le<std::uint8_t>());
        SAFECKPT_CHECK(push_int(v));
        break;
      }
      case op::kBinInt2: {
        SAFECKPT_TRY(auto v, read_le<std::uint16_t>());
        SAFECKPT_CHECK(push_int(v));
        break;
      }
      case op::kLong1: {
        SAFECKPT_TRY(auto n, read_le<std::uint8_t>());
        SAFECKPT_TRY(Bytes b, read(n));
        SAFECKPT_CHECK(push_long_bytes(b));
        break;
      }
      case op::kLong4: {
        SAFECKPT_TRY(auto n, read_le<std::uint32_t>());
        if (static_cast<std::int32_t>(n) < 0) return malformed("LONG pickle has negative byte count");
        SAFECKPT_CHECK(check_len(n, lim_.max_long_bytes, "LONG4 integer"));
        SAFECKPT_TRY(Bytes b, read(n));
        SAFECKPT_CHECK(push_long_bytes(b));
        break;
      }
      case op::kBinFloat: {
        SAFECKPT_TRY(Bytes b, read(8));
        const std::uint64_t u = util::load_be<std::uint64_t>(b.data());  // BINFLOAT is big-endian
        Node n;
        n.kind = Kind::kFloat;
        std::memcpy(&n.re, &u, 8);
        SAFECKPT_CHECK(push_new(std::move(n)));
        break;
      }
      case op::kFloat: {
        SAFECKPT_TRY(auto line, read_line());
        auto parse = [](std::string_view s) -> std::optional<double> {
          double v = 0;
          if (!s.empty() && s[0] == '+') s.remove_prefix(1);
          auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
          if (s.empty() || ptr != s.data() + s.size() || (ec != std::errc() && ec != std::errc::result_out_of_range))
            return std::nullopt;
          if (ec == std::errc::result_out_of_range) {
            // Python's float() gives +-inf on overflow and 0 on underflow.
            std::string z(s);
            v = std::strtod(z.c_str(), nullptr);
          }
          return v;
        };
        auto parsed = parse(line);
        // CPython stops at a NUL (PyOS_string_to_double's end at '\0' is
        // accepted); the loader refuses the form.
        if (!parsed && opt_.cpython_text_operands && c_string(line).size() != line.size()) {
          parsed = parse(c_string(line));
          if (parsed) note_text(line, std::string(c_string(line)));
        }
        if (!parsed) return malformed("could not convert string to float");
        double v = *parsed;
        Node n;
        n.kind = Kind::kFloat;
        n.re = v;
        SAFECKPT_CHECK(push_new(std::move(n)));
        break;
      }
      case op::kBinUnicode:
      case op::kShortBinUnicode:
      case op::kBinUnicode8: {
        std::uint64_t n;
        if (op_ == op::kShortBinUnicode) {
          SAFECKPT_TRY(n, read_le<std::uint8_t>());
        } else if (op_ == op::kBinUnicode) {
          SAFECKPT_TRY(n, read_le<std::uint32_t>());
        } else {
          SAFECKPT_TRY(n, read_le<std::uint64_t>());
        }
        SAFECKPT_CHECK(check_len(n, lim_.max_string_bytes, "string"));
        SAFECKPT_TRY(Bytes b, read(static_cast<std::size_t>(n)));
        SAFECKPT_CHECK(push_utf8(b, true));
        break;
      }
      case op::kUnicode: {
        SAFECKPT_TRY(auto line, read_line());
        SAFECKPT_CHECK(charge_text(2 * line.size(), "string"));
        auto s = raw_unicode_escape_decode(line);
        if (!s) return malformed("invalid raw-unicode-escape in UNICODE argument");
        SAFECKPT_CHECK(push_string(std::move(*s), Kind::kStr));
        break;
      }
      case op::kString: {
        SAFECKPT_TRY(auto line, read_line());
        if (line.size() < 2 || line.front() != line.back() || (line.front() != '\'' && line.front() != '"'))
          return malformed("the STRING opcode argument must be quoted");
        SAFECKPT_CHECK(charge_text(line.size(), "string"));
        auto s = escape_decode(line.substr(1, line.size() - 2));
        if (!s) return malformed("invalid \\ escape in STRING argument");
        if (!valid_utf8(*s, false)) return malformed("py2 str is not valid UTF-8 (torch.load uses encoding='utf-8')");
        SAFECKPT_CHECK(push_string(std::move(*s), Kind::kStr));
        break;
      }
      case op::kBinString:
      case op::kShortBinString: {
        std::uint64_t n;
        if (op_ == op::kShortBinString) {
          SAFECKPT_TRY(n, read_le<std::uint8_t>());
        } else {
          SAFECKPT_TRY(auto raw, read_le<std::uint32_t>());
          if (static_cast<std::int32_t>(raw) < 0) return malformed("BINSTRING pickle has negative byte count");
          n = raw;
        }
        SAFECKPT_CHECK(check_len(n, lim_.max_string_bytes, "string"));
        SAFECKPT_TRY(Bytes b, read(static_cast<std::size_t>(n)));
        SAFECKPT_CHECK(push_utf8(b, false));
        break;
      }
      case op::kBinBytes:
      case op::kShortBinBytes:
      case op::kBinBytes8:
      case op::kByteArray8: {
        std::uint64_t n;
        if (op_ == op::kShortBinBytes) {
          SAFECKPT_TRY(n, read_le<std::uint8_t>());
        } else if (op_ == op::kBinBytes) {
          SAFECKPT_TRY(n, read_le<std::uint32_t>());
        } else {
          SAFECKPT_TRY(n, read_le<std::uint64_t>());
        }
        SAFECKPT_CHECK(check_len(n, lim_.max_string_bytes, "bytes"));
        SAFECKPT_TRY(Bytes b, read(static_cast<std::size_t>(n)));
        Kind k = Kind::kBytes;
        if (op_ == op::kByteArray8) {
          auto st = hooks_.require_builtin("builtins.bytearray", ctx());
          if (!st) SAFECKPT_CHECK(policy(std::move(st).error()));
          k = Kind::kByteArray;
        }
        SAFECKPT_CHECK(charge_text(b.size(), "bytes"));
        SAFECKPT_CHECK(push_string(std::string(reinterpret_cast<const char*>(b.data()), b.size()), k));
        break;
      }
      case op::kEmptyTuple: SAFECKPT_CHECK(push_new(Node{Kind::kTuple})); break;
      case op::kEmptyList: SAFECKPT_CHECK(push_new(Node{Kind::kList})); break;
      case op::kEmptyDict: SAFECKPT_CHECK(push_new(Node{Kind::kDict})); break;
      case op::kEmptySet: {
        auto st = hooks_.require_builtin("builtins.set", ctx());
        if (!st) SAFECKPT_CHECK(policy(std::move(st).error()));
        SAFECKPT_CHECK(push_new(Node{Kind::kSet}));
        break;
      }
      case op::kTuple: {
        SAFECKPT_TRY(auto items, pop_mark());
        SAFECKPT_TRY(NodeId t, make_container(Kind::kTuple, std::move(items)));
        SAFECKPT_CHECK(push(t));
        break;
      }
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        std::size_t n = op_ == op::kTuple1 ? 1 : op_ == op::kTuple2 ? 2 : 3;
        if (stack_.size() < fence() + n) return malformed("stack underflow");
        std::vector<NodeId> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        SAFECKPT_TRY(NodeId t, make_container(Kind::kTuple, std::move(items)));
        SAFECKPT_CHECK(push(t));
        break;
      }
      case op::kList: {
        SAFECKPT_TRY(auto items, pop_mark());
        SAFECKPT_TRY(NodeId t, make_container(Kind::kList, std::move(items)));
        SAFECKPT_CHECK(push(t));
        break;
      }
      case op::kDict: {
        SAFECKPT_TRY(auto items, pop_mark());
        if (items.size() % 2) return malformed("odd number of items for DICT");
        SAFECKPT_TRY(NodeId t, add(Node{Kind::kDict}));
        SAFECKPT_CHECK(do_setitems(t, items));
        SAFECKPT_CHECK(push(t));
        break;
      }
      case op::kFrozenSet: {
        SAFECKPT_TRY(auto items, pop_mark());
        auto st = hooks_.require_builtin("builtins.frozenset", ctx());
        if (!st) SAFECKPT_CHECK(policy(std::move(st).error()));
        SAFECKPT_TRY(NodeId t, add(Node{Kind::kSet}));
        SAFECKPT_CHECK(do_additems(t, items));
        arena_[t].kind = Kind::kFrozenSet;
        SAFECKPT_CHECK(push(t));
        break;
      }
      case op::kAppend: {
        SAFECKPT_TRY(NodeId v, pop());
        SAFECKPT_TRY(NodeId t, top());
        SAFECKPT_CHECK(do_append(t, {v}));
        break;
      }
      case op::kAppends: {
        SAFECKPT_TRY(auto items, pop_mark());
        SAFECKPT_TRY(NodeId t, top());
        SAFECKPT_CHECK(do_append(t, items));
        break;
      }
      case op::kSetItem: {
        SAFECKPT_TRY(NodeId v, pop());
        SAFECKPT_TRY(NodeId k, pop());
        SAFECKPT_TRY(NodeId t, top());
        SAFECKPT_CHECK(do_setitems(t, {k, v}));
        break;
      }
      case op::kSetItems: {
        SAFECKPT_TRY(auto items, pop_mark());
        if (items.size() % 2) return malformed("odd number of items for SETITEMS");
        SAFECKPT_TRY(NodeId t, top());
        SAFECKPT_CHECK(do_setitems(t, items));
        break;
      }
      case op::kAddItems: {
        SAFECKPT_TRY(auto items, pop_mark());
        SAFECKPT_TRY(NodeId t, top());
        SAFECKPT_CHECK(do_additems(t, items));
        break;
      }
      case op::kPut: {
        SAFECKPT_TRY(auto line, read_line());
        SAFECKPT_TRY(std::uint64_t idx, memo_index_text(line, true));
        SAFECKPT_CHECK(memo_put(idx));
        break;
      }
      case op::kBinPut: {
        SAFECKPT_TRY(auto idx, read_le<std::uint8_t>());
        SAFECKPT_CHECK(memo_put(idx));
        break;
      }
      case op::kLongBinPut: {
        SAFECKPT_TRY(auto idx, read_le<std::uint32_t>());
        SAFECKPT_CHECK(memo_put(idx));
        break;
      }
      case op::kMemoize: SAFECKPT_CHECK(memo_put(memo_.size())); break;
      case op::kGet: {
        SAFECKPT_TRY(auto line, read_line());
        SAFECKPT_TRY(std::uint64_t idx, memo_index_text(line, false));
        SAFECKPT_CHECK(memo_get(idx));
        break;
      }
      case op::kBinGet: {
        SAFECKPT_TRY(auto idx, read_le<std::uint8_t>());
        SAFECKPT_CHECK(memo_get(idx));
        break;
      }
      case op::kLongBinGet: {
        SAFECKPT_TRY(auto idx, read_le<std::uint32_t>());
        SAFECKPT_CHECK(memo_get(idx));
        break;
      }
      case op::kGlobal: {
        SAFECKPT_TRY(auto module, read_line());
        SAFECKPT_TRY(auto name, read_line());
        if (!valid_utf8(module, false) || !valid_utf8(name, false)) return malformed("GLOBAL name is not UTF-8");
        SAFECKPT_CHECK(do_global(module, name));
        break;
      }
      case op::kStackGlobal: {
        SAFECKPT_TRY(NodeId name, pop());
        SAFECKPT_TRY(NodeId module, pop());
        if (arena_[name].kind != Kind::kStr || arena_[module].kind != Kind::kStr) {
          emit(PickleEvent::Type::kImport, "<dynamic>", {}, {}, true, false);
          SAFECKPT_CHECK(policy(Error(ErrorCode::kDisallowedGlobal,
                                      "STACK_GLOBAL operands are not constant strings (dynamic import); refused")));
          SAFECKPT_TRY(NodeId ph, refused_placeholder("<dynamic>"));
          SAFECKPT_CHECK(push(ph));
          break;
        }
        std::string m = arena_[module].text, n = arena_[name].text;
        SAFECKPT_CHECK(do_global(m, n));
        break;
      }
      case op::kInst: {
        SAFECKPT_TRY(auto module, read_line());
        SAFECKPT_TRY(auto name, read_line());
        SAFECKPT_TRY(auto items, pop_mark());
        std::string canon = canonical_global_name(module, name, protocol_);
        emit(PickleEvent::Type::kImport, canon, std::string(module), std::string(name), false,
             name.find('.') != std::string_view::npos);
        emit(PickleEvent::Type::kCall, canon);
        SAFECKPT_CHECK(policy(
            Error(ErrorCode::kDisallowedGlobal, "INST opcode imports and calls '" + canon + "'" + kCodeRunWords)));
        SAFECKPT_TRY(NodeId ph, refused_placeholder(canon));
        SAFECKPT_CHECK(push(ph));
        break;
      }
      case op::kObj: {
        SAFECKPT_TRY(auto items, pop_mark());
        if (items.empty()) return malformed("OBJ without a class");
        std::string name = callee_name(items[0]);
        emit(PickleEvent::Type::kCall, name);
        SAFECKPT_CHECK(
            policy(Error(ErrorCode::kDisallowedOperation, "OBJ opcode calls '" + name + "'" + kCodeRunWords)));
        SAFECKPT_TRY(NodeId ph, refused_placeholder(name));
        SAFECKPT_CHECK(push(ph));
        break;
      }
      case op::kExt1:
      case op::kExt2:
      case op::kExt4: {
        std::uint32_t code;
        if (op_ == op::kExt1) {
          SAFECKPT_TRY(code, read_le<std::uint8_t>());
        } else if (op_ == op::kExt2) {
          SAFECKPT_TRY(code, read_le<std::uint16_t>());
        } else {
          SAFECKPT_TRY(code, read_le<std::uint32_t>());
        }
        std::string name = "<ext:" + std::to_string(code) + ">";
        emit(PickleEvent::Type::kImport, name);
        SAFECKPT_CHECK(policy(Error(ErrorCode::kDisallowedGlobal, "extension registry code " + std::to_string(code) +
                                                                      " (copyreg import by number); refused")));
        SAFECKPT_TRY(NodeId ph, refused_placeholder(name));
        SAFECKPT_CHECK(push(ph));
        break;
      }
      case op::kReduce: {
        SAFECKPT_TRY(NodeId args, pop());
        SAFECKPT_TRY(NodeId callable, pop());
        SAFECKPT_CHECK(do_call(callable, args));
        break;
      }
      case op::kNewObj: {
        SAFECKPT_TRY(NodeId args, pop());
        SAFECKPT_TRY(NodeId cls, pop());
        SAFECKPT_CHECK(do_call(cls, args));
        break;
      }
      case op::kNewObjEx: {
        SAFECKPT_TRY(NodeId kwargs, pop());
        SAFECKPT_TRY(NodeId args, pop());
        SAFECKPT_TRY(NodeId cls, pop());
        (void)kwargs;
        (void)args;
        std::string name = callee_name(cls);
        emit(PickleEvent::Type::kCall, name);
        SAFECKPT_CHECK(
            policy(Error(ErrorCode::kDisallowedOperation, "NEWOBJ_EX opcode calls '" + name + "'" + kCodeRunWords)));
        SAFECKPT_TRY(NodeId ph, refused_placeholder(name));
        SAFECKPT_CHECK(push(ph));
        break;
      }
      case op::kBuild: {
        SAFECKPT_TRY(NodeId state, pop());
        SAFECKPT_TRY(NodeId obj, top());
        emit(PickleEvent::Type::kBuild, callee_name(obj));
        if (is_refused(obj)) break;
        auto st = hooks_.build(obj, state, ctx());
        SAFECKPT_CHECK(charge_hook_nodes());
        if (!st) {
          if (!is_policy_error(st.error().code())) return unexpected(with_context(std::move(st).error()));
          SAFECKPT_CHECK(policy(std::move(st).error()));
        }
        break;
      }
      case op::kBinPersId: {
        SAFECKPT_TRY(NodeId pid, pop());
        emit(PickleEvent::Type::kPersistentId, "");
        auto r = hooks_.persistent_load(pid, ctx());
        SAFECKPT_CHECK(charge_hook_nodes());
        if (r) {
          SAFECKPT_CHECK(push(*r));
        } else {
          if (!is_policy_error(r.error().code())) return unexpected(with_context(std::move(r).error()));
          SAFECKPT_CHECK(policy(std::move(r).error()));
          SAFECKPT_TRY(NodeId ph, refused_placeholder("<persistent id>"));
          SAFECKPT_CHECK(push(ph));
        }
        break;
      }
      case op::kPersId: {
        SAFECKPT_TRY(auto line, read_line());
        (void)line;
        emit(PickleEvent::Type::kPersistentId, "");
        SAFECKPT_CHECK(
            policy(Error(ErrorCode::kDisallowedOperation,
                         "text persistent id (PERSID, protocol 0) refused: torch.load cannot read it either")));
        SAFECKPT_TRY(NodeId ph, refused_placeholder("<persistent id>"));
        SAFECKPT_CHECK(push(ph));
        break;
      }
      case op::kNextBuffer:
      case op::kReadonlyBuffer:
        return fail(ErrorCode::kUnsupported, "out-of-band buffers (protocol 5) are not supported");
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "0x%02x", op_);
        return malformed(std::string("invalid opcode ") + buf);
      }
    }
  }
}

thread_local std::uint64_t t_runs = 0;  // run_pickle() calls on this thread (tests)

}  // namespace

std::uint64_t detail::pickle_runs_on_this_thread() noexcept {
  return t_runs;
}

Result<PickleResult> run_pickle(Bytes data, ValueArena& arena, PickleHooks& hooks, PickleObserver* observer,
                                const PickleOptions& options) {
  return detail::run_pickle_keeping_policy_error(data, arena, hooks, observer, options, nullptr);
}

Result<PickleResult> detail::run_pickle_keeping_policy_error(Bytes data, ValueArena& arena, PickleHooks& hooks,
                                                             PickleObserver* observer, const PickleOptions& options,
                                                             std::optional<Error>* policy_error_before_failure) {
  ++t_runs;
  if (policy_error_before_failure != nullptr) policy_error_before_failure->reset();
  try {
    Machine m(data, arena, hooks, observer, options);
    auto r = m.run();
    if (!r && policy_error_before_failure != nullptr) *policy_error_before_failure = std::move(m.first_policy_error());
    return r;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory while unpickling", Location{options.record});
  }
}

}  // namespace safeckpt
