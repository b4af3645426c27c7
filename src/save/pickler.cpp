// data.pkl writer: protocol 2, as Python's pickle.Pickler with torch.save's
// persistent_id writes it (torch/serialization.py _save, torch/_tensor.py
// _reduce_ex_internal, torch/nn/parameter.py __reduce_ex__), restricted to
// what torch.load(weights_only=True) accepts (docs/torch-format.md §4-5).
//
// Encodings (Python protocol 2): None N, bools NEWTRUE/NEWFALSE, ints
// BININT1/BININT2/BININT or LONG1 (minimal two's complement), floats
// BINFLOAT (big-endian), str BINUNICODE, bytes _codecs.encode(latin-1 str,
// "latin1"), bytearray bytearray(latin-1 str, "latin-1"), complex/set/Size/
// device/Counter/layout by REDUCE of their allowlisted constructor, dtypes and
// qschemes as bare GLOBALs, lists/dicts in batches of 1000 with APPEND(S)/
// SETITEM(S), OrderedDict = OrderedDict() + SETITEMS + BUILD({'_metadata': m}).
// Memo: every container, string, global and tensor is memoized once
// (BINPUT/LONG_BINPUT) and referenced again with BINGET/LONG_BINGET; strings
// and globals by content, the rest by identity (node / tensor index).
//
// The walk is iterative: an explicit stack of actions, no recursion on the
// shape of the tree.
#include "save/pickler.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "safeckpt/allowlist.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

// Opcodes (Python Lib/pickle.py).
constexpr std::uint8_t kMark = '(', kStop = '.', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kNone = 'N',
                       kBinUnicode = 'X', kAppend = 'a', kAppends = 'e', kBinGet = 'h', kLongBinGet = 'j',
                       kEmptyList = ']', kBinPut = 'q', kLongBinPut = 'r', kSetItem = 's', kTuple = 't',
                       kSetItems = 'u', kEmptyDict = '}', kEmptyTuple = ')', kGlobalOp = 'c', kReduce = 'R',
                       kBuild = 'b', kBinFloat = 'G', kBinPersId = 'Q', kProto = 0x80, kTuple1 = 0x85, kTuple2 = 0x86,
                       kNewTrue = 0x88, kNewFalse = 0x89, kLong1 = 0x8a, kNewObj = 0x81;
constexpr std::size_t kBatch = 1000;  // pickle._BATCHSIZE

Unexpected unsupported(std::string msg) {
  return make_error(ErrorCode::kUnsupported, std::move(msg));
}
Unexpected internal(std::string msg) {
  return make_error(ErrorCode::kInternal, std::move(msg));
}

// Minimal little-endian two's complement of a decimal integer (pickle
// encode_long). Empty on syntax error.
std::vector<std::uint8_t> long_bytes_from_decimal(std::string_view dec, bool& ok) {
  ok = false;
  bool neg = false;
  if (!dec.empty() && (dec[0] == '-' || dec[0] == '+')) {
    neg = dec[0] == '-';
    dec.remove_prefix(1);
  }
  if (dec.empty()) return {};
  std::vector<std::uint8_t> mag;  // little-endian magnitude
  for (char c : dec) {
    if (c < '0' || c > '9') return {};
    unsigned carry = static_cast<unsigned>(c - '0');
    for (auto& b : mag) {
      unsigned v = b * 10u + carry;
      b = static_cast<std::uint8_t>(v & 0xFF);
      carry = v >> 8;
    }
    while (carry) {
      mag.push_back(static_cast<std::uint8_t>(carry & 0xFF));
      carry >>= 8;
    }
  }
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  ok = true;
  if (mag.empty()) return {};
  mag.push_back(0);  // room for the sign bit
  if (neg) {
    unsigned carry = 1;
    for (auto& b : mag) {
      unsigned v = static_cast<std::uint8_t>(~b) + carry;
      b = static_cast<std::uint8_t>(v & 0xFF);
      carry = v >> 8;
    }
  }
  // Trim redundant sign bytes.
  while (mag.size() > 1) {
    std::uint8_t last = mag.back(), prev = mag[mag.size() - 2];
    if ((last == 0x00 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80)))
      mag.pop_back();
    else
      break;
  }
  return mag;
}

class Pickler {
 public:
  Pickler(const Checkpoint& ckpt, const PickleWriteOptions& opt) : c_(ckpt), a_(ckpt.values()), opt_(opt) {}

  Result<TorchPickle> run() {
    SAFECKPT_CHECK(plan_storages());
    out_.push_back(kProto);
    out_.push_back(2);
    if (c_.root() == kNoNode || c_.root() >= a_.size()) return internal("save: checkpoint has no root value");
    push_node(c_.root());
    while (!stack_.empty()) {
      Action act = std::move(stack_.back());
      stack_.pop_back();
      SAFECKPT_CHECK(step(act));
    }
    out_.push_back(kStop);
    TorchPickle r;
    r.bytes = std::move(out_);
    r.storages = std::move(key_order_);
    r.numels = std::move(key_numel_);
    return r;
  }

 private:
  enum class Op : std::uint8_t {
    kNode,        // a value node (a)
    kTensor,      // tensor index a, full form (with Parameter / state wrappers)
    kTensorCore,  // tensor index a, plain rebuild call; flag = requires_grad
    kPid,         // persistent id of storage a
    kRaw,         // raw bytes in text
    kStr,         // str literal in text (memoized by content)
    kLatin1,      // str whose code points are the bytes in text
    kGlobal,      // GLOBAL text = "module\nname"
    kInt,         // integer v
    kMemoNode,    // memoize the top of the stack as node a
    kMemoTensor,  // memoize the top of the stack as tensor a
    kLeave,       // node a is finished (for cycle detection)
    kLeaveTensor,
  };
  struct Action {
    Op op;
    std::uint32_t a = 0;
    std::int64_t v = 0;
    bool flag = false;
    std::string text;
  };

  // ---- action helpers (sequences are built forwards, pushed reversed) ----
  using Seq = std::vector<Action>;
  static Action node(NodeId id) { return {Op::kNode, id}; }
  static Action raw(std::uint8_t op) { return {Op::kRaw, 0, 0, false, std::string(1, static_cast<char>(op))}; }
  static Action str(std::string s) { return {Op::kStr, 0, 0, false, std::move(s)}; }
  static Action global(std::string_view module, std::string_view name) {
    return {Op::kGlobal, 0, 0, false, std::string(module) + "\n" + std::string(name)};
  }
  static Action integer(std::int64_t v) { return {Op::kInt, 0, v}; }
  static Action boolean(bool b) { return raw(b ? kNewTrue : kNewFalse); }
  void push(Seq&& seq) {
    for (auto it = seq.rbegin(); it != seq.rend(); ++it) stack_.push_back(std::move(*it));
  }
  void push_node(NodeId id) { stack_.push_back(node(id)); }
  static void write_global_seq(Seq& seq, std::string mod_nl_name) {
    seq.push_back({Op::kGlobal, 0, 0, false, std::move(mod_nl_name)});
  }

  // Tuple of `n` items already in `seq` order: close it Python's way.
  static void close_tuple(Seq& seq, std::size_t n, std::size_t mark_pos) {
    if (n == 0) {
      seq.push_back(raw(kEmptyTuple));
      return;
    }
    if (n <= 3) {
      seq.push_back(raw(static_cast<std::uint8_t>(kTuple1 + (n - 1))));
      return;
    }
    seq.insert(seq.begin() + static_cast<std::ptrdiff_t>(mark_pos), raw(kMark));
    seq.push_back(raw(kTuple));
  }
  // Appends `items` as a tuple to seq.
  static void tuple_of(Seq& seq, Seq items) {
    const std::size_t pos = seq.size(), n = items.size();
    for (auto& i : items) seq.push_back(std::move(i));
    close_tuple(seq, n, pos);
  }
  static void ordered_dict_call(Seq& seq) {
    seq.push_back(global("collections", "OrderedDict"));
    seq.push_back(raw(kEmptyTuple));
    seq.push_back(raw(kReduce));
  }

  // ---- output primitives ----
  void emit(std::uint8_t b) { out_.push_back(b); }
  void emit32(std::uint32_t x) { util::append_le(out_, x); }
  void emit_bytes(std::string_view s) { out_.insert(out_.end(), s.begin(), s.end()); }
  Status memoize(std::uint32_t& slot_out) {
    if (memo_count_ == 0xFFFFFFFFu) return unsupported("save: more than 2^32-1 memo entries");
    slot_out = memo_count_++;
    if (slot_out < 256) {
      emit(kBinPut);
      emit(static_cast<std::uint8_t>(slot_out));
    } else {
      emit(kLongBinPut);
      emit32(slot_out);
    }
    return {};
  }
  void get(std::uint32_t slot) {
    if (slot < 256) {
      emit(kBinGet);
      emit(static_cast<std::uint8_t>(slot));
    } else {
      emit(kLongBinGet);
      emit32(slot);
    }
  }
  void write_int(std::int64_t v) {
    if (v >= 0 && v <= 0xFF) {
      emit(kBinInt1);
      emit(static_cast<std::uint8_t>(v));
    } else if (v >= 0 && v <= 0xFFFF) {
      emit(kBinInt2);
      emit(static_cast<std::uint8_t>(v));
      emit(static_cast<std::uint8_t>(v >> 8));
    } else if (v >= -0x80000000LL && v <= 0x7FFFFFFFLL) {
      emit(kBinInt);
      emit32(static_cast<std::uint32_t>(v));
    } else {
      std::vector<std::uint8_t> b(8);
      util::store_le(b.data(), static_cast<std::uint64_t>(v));
      while (b.size() > 1) {
        std::uint8_t last = b.back(), prev = b[b.size() - 2];
        if ((last == 0x00 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80)))
          b.pop_back();
        else
          break;
      }
      emit(kLong1);
      emit(static_cast<std::uint8_t>(b.size()));
      out_.insert(out_.end(), b.begin(), b.end());
    }
  }
  Status write_str(const std::string& s) {
    auto it = str_memo_.find(s);
    if (it != str_memo_.end()) {
      get(it->second);
      return {};
    }
    if (s.size() > 0xFFFFFFFFu) return unsupported("save: string longer than 4 GiB");
    emit(kBinUnicode);
    emit32(static_cast<std::uint32_t>(s.size()));
    emit_bytes(s);
    std::uint32_t slot;
    SAFECKPT_CHECK(memoize(slot));
    str_memo_.emplace(s, slot);
    return {};
  }
  Status write_global(const std::string& mod_nl_name) {
    auto it = global_memo_.find(mod_nl_name);
    if (it != global_memo_.end()) {
      get(it->second);
      return {};
    }
    emit(kGlobalOp);
    emit_bytes(mod_nl_name);
    emit('\n');
    std::uint32_t slot;
    SAFECKPT_CHECK(memoize(slot));
    global_memo_.emplace(mod_nl_name, slot);
    return {};
  }
  void write_float(double d) {
    std::uint64_t bits;
    std::memcpy(&bits, &d, 8);
    emit(kBinFloat);
    for (int i = 7; i >= 0; --i) emit(static_cast<std::uint8_t>(bits >> (8 * i)));
  }

  // ---- storages: typed class per storage, keys by first use ----
  Status plan_storages() {
    const auto& st = c_.storages();
    const auto& ts = c_.tensors();
    // Every dtype a storage is viewed as (tensors and bare storage values).
    std::vector<std::vector<DType>> views(st.size());
    for (const TensorInfo& t : ts) {
      if (t.layout != Layout::kStrided || t.is_meta || t.storage == kNoStorage) continue;
      if (t.storage >= st.size()) return internal("save: tensor refers to a missing storage");
      auto& v = views[t.storage];
      if (std::find(v.begin(), v.end(), t.dtype) == v.end()) v.push_back(t.dtype);
    }
    for (std::size_t id = 0; id < a_.size(); ++id) {
      const Node& n = a_[static_cast<NodeId>(id)];
      if (n.kind != Kind::kStorage) continue;
      if (n.i < 0 || static_cast<std::size_t>(n.i) >= st.size()) return internal("save: storage node out of range");
      auto& v = views[static_cast<std::size_t>(n.i)];
      DType d = st[static_cast<std::size_t>(n.i)].dtype;
      if (std::find(v.begin(), v.end(), d) == v.end()) v.push_back(d);
    }
    typed_.assign(st.size(), false);
    typed_dtype_.assign(st.size(), DType::kUInt8);
    for (std::size_t s = 0; s < st.size(); ++s) {
      const auto& v = views[s];
      if (v.size() == 1 && !storage_class_for(v[0]).empty() && st[s].nbytes % dtype_size(v[0]) == 0) {
        typed_[s] = true;
        typed_dtype_[s] = v[0];
      }
    }
    key_of_.assign(st.size(), kUnassigned);
    return {};
  }

  // ---- one step ----
  Status step(Action& act) {
    switch (act.op) {
      case Op::kRaw: emit_bytes(act.text); return {};
      case Op::kStr: return write_str(act.text);
      case Op::kLatin1: {
        std::string utf8;
        utf8.reserve(act.text.size() * 2);
        for (unsigned char ch : act.text) util::append_utf8(utf8, ch);
        return write_str(utf8);
      }
      case Op::kGlobal: return write_global(act.text);
      case Op::kInt: write_int(act.v); return {};
      case Op::kMemoNode: {
        std::uint32_t slot;
        SAFECKPT_CHECK(memoize(slot));
        node_memo_.emplace(act.a, slot);
        return {};
      }
      case Op::kMemoTensor: {
        std::uint32_t slot;
        SAFECKPT_CHECK(memoize(slot));
        tensor_memo_.emplace(act.a, slot);
        return {};
      }
      case Op::kLeave: active_.erase(act.a); return {};
      case Op::kLeaveTensor: active_tensors_.erase(act.a); return {};
      case Op::kPid: return pid(act.a);
      case Op::kNode: return value(act.a);
      case Op::kTensor: return tensor(act.a);
      case Op::kTensorCore: return tensor_core(act.a, act.flag);
    }
    return internal("save: bad action");
  }

  Status pid(std::uint32_t s) {
    const auto& st = c_.storages();
    if (s >= st.size()) return internal("save: storage index out of range");
    if (key_of_[s] == kUnassigned) {
      key_of_[s] = static_cast<std::uint32_t>(key_order_.size());
      key_order_.push_back(s);
    }
    const StorageInfo& info = st[s];
    Seq seq;
    seq.push_back(raw(kMark));
    seq.push_back(str("storage"));
    std::int64_t numel;
    if (opt_.legacy_format && !typed_[s])
      // torch/serialization.py _legacy_save raises the same ("Cannot save
      // multiple tensors or storages that view the same data as different
      // types"; dtypes without a legacy class fail in _pickle_storage_type).
      return unsupported("save: the legacy format needs one typed storage class per storage; storage " + info.key +
                         " is viewed as several dtypes, as a dtype without a legacy storage class "
                         "(uint16/32/64, float8, ...), or holds a byte count that is not a whole number of "
                         "elements; save in the zip format");
    if (typed_[s]) {
      seq.push_back(global("torch", storage_class_for(typed_dtype_[s])));
      numel = static_cast<std::int64_t>(info.nbytes / dtype_size(typed_dtype_[s]));
    } else {
      seq.push_back(global("torch.storage", "UntypedStorage"));
      numel = static_cast<std::int64_t>(info.nbytes);
    }
    seq.push_back(str(std::to_string(key_of_[s])));
    seq.push_back(str(opt_.force_location.empty() ? info.location : opt_.force_location));
    if (key_numel_.size() <= key_of_[s]) key_numel_.resize(key_of_[s] + 1);
    key_numel_[key_of_[s]] = static_cast<std::uint64_t>(numel);
    seq.push_back(integer(numel));
    if (opt_.legacy_format) seq.push_back(raw(kNone));  // view_metadata (legacy storage views are never written)
    seq.push_back(raw(kTuple));
    seq.push_back(raw(kBinPersId));
    push(std::move(seq));
    return {};
  }

  Status refuse_value(NodeId id, std::string_view what) {
    return unsupported("save: " + std::string(what) + " (node " + std::to_string(id) +
                       ") cannot be loaded by torch.load(weights_only=True) with the default allowlist; "
                       "drop it, or save with weights_only_compatible = false");
  }

  static std::pair<std::string, std::string> split_global(const std::string& qual) {
    auto dot = qual.rfind('.');
    if (dot == std::string::npos) return {"builtins", qual};
    return {qual.substr(0, dot), qual.substr(dot + 1)};
  }

  // Batches of APPEND(S) / SETITEM(S).
  // CPython's C pickler (Modules/_pickle.c): exact lists/dicts
  // (batch_list_exact / batch_dict_exact) use the single-item opcode only
  // when the whole container has one item; containers written through an
  // iterator (OrderedDict's dictitems: batch_dict) also for a trailing
  // batch of one. batch_dict_exact loops `while (i == BATCHSIZE)`, so an
  // exact dict of 1000k items ends with an empty MARK SETITEMS.
  static void batched(Seq& seq, const std::vector<NodeId>& items, std::size_t per, std::uint8_t one, std::uint8_t many,
                      bool exact) {
    const std::size_t n = items.size() / per;
    for (std::size_t b = 0; b < n; b += kBatch) {
      const std::size_t e = std::min(n, b + kBatch);
      if (exact ? n == 1 : e - b == 1) {
        for (std::size_t k = 0; k < per; ++k) seq.push_back(node(items[b * per + k]));
        seq.push_back(raw(one));
      } else {
        seq.push_back(raw(kMark));
        for (std::size_t i = b * per; i < e * per; ++i) seq.push_back(node(items[i]));
        seq.push_back(raw(many));
      }
    }
    if (exact && per == 2 && n > 1 && n % kBatch == 0) {
      seq.push_back(raw(kMark));
      seq.push_back(raw(many));
    }
  }

  Status value(NodeId id) {
    if (id >= a_.size()) return internal("save: node id out of range");
    if (auto it = node_memo_.find(id); it != node_memo_.end()) {
      get(it->second);
      return {};
    }
    if (active_.count(id))
      return unsupported("save: node " + std::to_string(id) + " (" + std::string(kind_name(a_[id].kind)) +
                         ") contains itself through an immutable value; protocol 2 needs POP for that, which "
                         "torch's weights-only unpickler refuses");
    const Node& n = a_[id];
    const bool compat = opt_.weights_only_compatible;
    Seq seq;
    // Values built by REDUCE from their parts are memoized after the call;
    // while their parts are written they are "active" (a cycle = refuse).
    auto reduce_value = [&](Seq parts) {
      active_.insert(id);
      for (auto& p : parts) seq.push_back(std::move(p));
      seq.push_back(raw(kReduce));
      seq.push_back({Op::kLeave, id});
      seq.push_back({Op::kMemoNode, id});
    };
    switch (n.kind) {
      case Kind::kNone: emit(kNone); return {};
      case Kind::kBool: emit(n.flag ? kNewTrue : kNewFalse); return {};
      case Kind::kInt: write_int(n.i); return {};
      case Kind::kBigInt: {
        bool ok = false;
        auto b = long_bytes_from_decimal(n.text, ok);
        if (!ok) return internal("save: malformed big integer text");
        if (b.size() > 255)
          return unsupported(
              "save: integer wider than 255 bytes needs LONG4, which torch's "
              "weights-only unpickler refuses");
        emit(kLong1);
        emit(static_cast<std::uint8_t>(b.size()));
        out_.insert(out_.end(), b.begin(), b.end());
        return {};
      }
      case Kind::kFloat: write_float(n.re); return {};
      case Kind::kComplex: {
        Seq parts{global("__builtin__", "complex"),
                  {Op::kRaw, 0, 0, false, float_bytes(n.re) + float_bytes(n.im)},
                  raw(kTuple2)};
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kStr: return write_str(n.text);
      case Kind::kBytes: {
        Seq parts{global("_codecs", "encode"), {Op::kLatin1, 0, 0, false, n.text}, str("latin1"), raw(kTuple2)};
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kByteArray: {
        Seq parts{global("__builtin__", "bytearray"), {Op::kLatin1, 0, 0, false, n.text}, str("latin-1"), raw(kTuple2)};
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kList: {
        seq.push_back(raw(kEmptyList));
        seq.push_back({Op::kMemoNode, id});
        batched(seq, n.items, 1, kAppend, kAppends, /*exact=*/true);
        break;
      }
      case Kind::kTuple: {
        if (n.items.empty()) {
          emit(kEmptyTuple);
          return {};
        }
        active_.insert(id);
        Seq items;
        for (NodeId c : n.items) items.push_back(node(c));
        tuple_of(seq, std::move(items));
        seq.push_back({Op::kLeave, id});
        seq.push_back({Op::kMemoNode, id});
        break;
      }
      case Kind::kSet:
      case Kind::kFrozenSet: {
        if (n.kind == Kind::kFrozenSet && compat) return refuse_value(id, "frozenset");
        Seq parts{global("__builtin__", n.kind == Kind::kSet ? "set" : "frozenset"), raw(kEmptyList)};
        if (!n.items.empty()) {
          if (n.items.size() == 1) {
            parts.push_back(node(n.items[0]));
            parts.push_back(raw(kAppend));
          } else {
            batched(parts, n.items, 1, kAppend, kAppends, /*exact=*/true);
          }
        }
        parts.push_back(raw(kTuple1));
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kSlice: {
        if (compat) return refuse_value(id, "slice");
        Seq parts{global("__builtin__", "slice")};
        Seq items;
        for (NodeId c : n.items) items.push_back(node(c));
        tuple_of(parts, std::move(items));
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kDict: {
        seq.push_back(raw(kEmptyDict));
        seq.push_back({Op::kMemoNode, id});
        batched(seq, n.items, 2, kSetItem, kSetItems, /*exact=*/true);
        break;
      }
      case Kind::kOrderedDict: {
        ordered_dict_call(seq);
        seq.push_back({Op::kMemoNode, id});
        batched(seq, n.items, 2, kSetItem, kSetItems, /*exact=*/false);
        if (n.attrs != kNoNode) {
          // attrs is the BUILD state ({'_metadata': m}, as the loader keeps
          // it); a bare non-dict value is taken as `_metadata` itself.
          if (n.attrs < a_.size() && a_[n.attrs].kind == Kind::kDict) {
            seq.push_back(node(n.attrs));
          } else {
            seq.push_back(raw(kEmptyDict));
            seq.push_back(str("_metadata"));
            seq.push_back(node(n.attrs));
            seq.push_back(raw(kSetItem));
          }
          seq.push_back(raw(kBuild));
        }
        break;
      }
      case Kind::kCounter: {
        Seq parts{global("collections", "Counter"), raw(kEmptyDict)};
        batched(parts, n.items, 2, kSetItem, kSetItems, /*exact=*/true);
        parts.push_back(raw(kTuple1));
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kSize: {
        Seq parts{global("torch", "Size")};
        Seq items;
        for (NodeId c : n.items) items.push_back(node(c));
        tuple_of(parts, std::move(items));
        parts.push_back(raw(kTuple1));
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kDtype: {
        if (n.i < 0 || n.i >= static_cast<std::int64_t>(DType::kCount_)) return internal("save: bad dtype node");
        return write_global(std::string("torch\n") + std::string(dtype_name(static_cast<DType>(n.i))));
      }
      case Kind::kDevice: {
        Seq parts{global("torch", "device")};
        auto colon = n.text.find(':');
        if (colon == std::string::npos) {
          parts.push_back(str(n.text));
          parts.push_back(raw(kTuple1));
        } else {
          std::int64_t index = 0;
          for (char ch : n.text.substr(colon + 1)) {
            if (ch < '0' || ch > '9' || index > 1000000000) return internal("save: bad device text " + n.text);
            index = index * 10 + (ch - '0');
          }
          parts.push_back(str(n.text.substr(0, colon)));
          parts.push_back(integer(index));
          parts.push_back(raw(kTuple2));
        }
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kLayout: {
        Seq parts{global("torch.serialization", "_get_layout"), str("torch." + n.text), raw(kTuple1)};
        reduce_value(std::move(parts));
        break;
      }
      case Kind::kQScheme: return write_global("torch\n" + n.text);
      case Kind::kTensor: {
        if (n.i < 0 || static_cast<std::size_t>(n.i) >= c_.tensors().size())
          return internal("save: tensor node out of range");
        stack_.push_back({Op::kTensor, static_cast<std::uint32_t>(n.i)});
        return {};
      }
      case Kind::kStorage: {
        if (n.i < 0 || static_cast<std::size_t>(n.i) >= c_.storages().size())
          return internal("save: storage node out of range");
        return pid(static_cast<std::uint32_t>(n.i));
      }
      case Kind::kGlobal: {
        if (compat && !Allowlist::default_policy().find(n.text)) return refuse_value(id, "global " + n.text);
        auto [m, nm] = split_global(n.text);
        return write_global(m + "\n" + nm);
      }
      case Kind::kObject: {
        if (compat && !Allowlist::default_policy().find(n.text)) return refuse_value(id, "object of type " + n.text);
        auto [m, nm] = split_global(n.text);
        NodeId args = n.items.size() > 0 ? n.items[0] : kNoNode;
        NodeId state = n.items.size() > 1 ? n.items[1] : kNoNode;
        if (n.flag) {
          // Made by NEWOBJ: cls.__new__(cls), then BUILD (Python's protocol-2
          // reduction of a plain class instance, copyreg.__reduce_ex__ ->
          // __newobj__; how pickle writes DCP's metadata dataclasses).
          if (args != kNoNode && (args >= a_.size() || a_[args].kind != Kind::kTuple || !a_[args].items.empty()))
            return unsupported("save: " + n.text + " (node " + std::to_string(id) +
                               ") is made by NEWOBJ with arguments; only cls.__new__(cls) is written");
          write_global_seq(seq, m + "\n" + nm);
          seq.push_back(raw(kEmptyTuple));
          seq.push_back(raw(kNewObj));
          seq.push_back({Op::kMemoNode, id});
          if (state != kNoNode) {
            seq.push_back(node(state));
            seq.push_back(raw(kBuild));
          }
          break;
        }
        // An object with neither arguments nor state is an opaque placeholder
        // (e.g. a numpy dtype the loader consumed): there is nothing to re-create.
        if (args == kNoNode && state == kNoNode)
          return unsupported("save: " + n.text + " (node " + std::to_string(id) +
                             ") is an opaque object the loader kept no arguments for; it cannot be re-pickled");
        Seq parts{{Op::kGlobal, 0, 0, false, m + "\n" + nm}};
        if (args == kNoNode)
          parts.push_back(raw(kEmptyTuple));
        else
          parts.push_back(node(args));
        reduce_value(std::move(parts));
        if (state != kNoNode) {
          seq.push_back(node(state));
          seq.push_back(raw(kBuild));
        }
        break;
      }
    }
    push(std::move(seq));
    return {};
  }

  static std::string float_bytes(double d) {
    std::uint64_t bits;
    std::memcpy(&bits, &d, 8);
    std::string s(1, static_cast<char>(kBinFloat));
    for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>(bits >> (8 * i)));
    return s;
  }

  static Seq int_tuple(const std::vector<std::int64_t>& v) {
    Seq s;
    Seq items;
    for (auto x : v) items.push_back(integer(x));
    tuple_of(s, std::move(items));
    return s;
  }
  static void append(Seq& a, Seq b) {
    for (auto& x : b) a.push_back(std::move(x));
  }

  // Full tensor: Parameter / Python-state wrappers around the core call.
  Status tensor(std::uint32_t t) {
    if (auto it = tensor_memo_.find(t); it != tensor_memo_.end()) {
      get(it->second);
      return {};
    }
    if (active_tensors_.count(t))
      return unsupported("save: tensor " + std::to_string(t) + " contains itself (through its Python state)");
    const TensorInfo& ti = c_.tensors()[t];
    // A DTensor's local shard written as a plain tensor would pass one rank's
    // piece off as the whole tensor.
    if (ti.dtensor)
      return unsupported(
          "save: a DTensor's local shard (one rank's piece of a sharded tensor) cannot be saved as "
          "a plain tensor: gather the rank files first (gather_dtensor_ranks, `safeckpt convert "
          "--rank R0.pt --rank R1.pt ... OUT`)");
    Seq seq;
    active_tensors_.insert(t);
    if (ti.is_parameter) {
      const bool with_state = ti.python_state != kNoNode;
      seq.push_back(global("torch._utils", with_state ? "_rebuild_parameter_with_state" : "_rebuild_parameter"));
      const std::size_t pos = seq.size();
      seq.push_back({Op::kTensorCore, t, 0, false});  // Parameter.data: requires_grad False
      seq.push_back(boolean(ti.requires_grad));
      ordered_dict_call(seq);
      if (with_state) seq.push_back(node(ti.python_state));
      close_tuple(seq, with_state ? 4 : 3, pos);
      seq.push_back(raw(kReduce));
    } else if (ti.python_state != kNoNode) {
      // Tensor.__reduce_ex__: (_rebuild_from_type_v2, (func, type, args, state))
      seq.push_back(global("torch._tensor", "_rebuild_from_type_v2"));
      seq.push_back(raw(kMark));
      Seq core;
      SAFECKPT_CHECK(core_call(core, t, ti.requires_grad));
      // core = [GLOBAL func, <args tuple ops...>, REDUCE]: split off the REDUCE.
      core.pop_back();
      seq.push_back(std::move(core.front()));
      seq.push_back(global("torch", "Tensor"));
      for (std::size_t i = 1; i < core.size(); ++i) seq.push_back(std::move(core[i]));
      seq.push_back(node(ti.python_state));
      seq.push_back(raw(kTuple));
      seq.push_back(raw(kReduce));
    } else {
      SAFECKPT_CHECK(core_call(seq, t, ti.requires_grad));
    }
    seq.push_back({Op::kLeaveTensor, t});
    seq.push_back({Op::kMemoTensor, t});
    push(std::move(seq));
    return {};
  }

  Status tensor_core(std::uint32_t t, bool requires_grad) {
    Seq seq;
    SAFECKPT_CHECK(core_call(seq, t, requires_grad));
    push(std::move(seq));
    return {};
  }

  // GLOBAL rebuild function, its argument tuple, REDUCE.
  Status core_call(Seq& seq, std::uint32_t t, bool requires_grad) {
    const TensorInfo& ti = c_.tensors()[t];
    const auto& tensors = c_.tensors();
    auto sub_tensor = [&](std::uint32_t idx) -> Result<Action> {
      if (idx >= tensors.size()) return internal("save: tensor component out of range");
      return Action{Op::kTensor, idx};
    };
    if (!ti.device.empty()) {
      // _rebuild_device_tensor_from_cpu_tensor(cpu_tensor, dtype, device, requires_grad)
      TensorInfo cpu = ti;
      cpu.device.clear();
      seq.push_back(global("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"));
      seq.push_back(raw(kMark));
      Seq inner;
      SAFECKPT_CHECK(plain_core(inner, cpu, false));
      append(seq, std::move(inner));
      seq.push_back(global("torch", dtype_name(ti.dtype)));
      seq.push_back(str(ti.device));
      seq.push_back(boolean(requires_grad));
      seq.push_back(raw(kTuple));
      seq.push_back(raw(kReduce));
      return {};
    }
    if (ti.layout != Layout::kStrided) {
      // _rebuild_sparse_tensor(layout, data)
      seq.push_back(global("torch._utils", "_rebuild_sparse_tensor"));
      seq.push_back(global("torch.serialization", "_get_layout"));
      seq.push_back(str("torch." + std::string(layout_name(ti.layout))));
      seq.push_back(raw(kTuple1));
      seq.push_back(raw(kReduce));
      Seq data;
      for (auto p : ti.sparse_parts) {
        SAFECKPT_TRY(Action a, sub_tensor(p));
        data.push_back(std::move(a));
      }
      data.push_back(global("torch", "Size"));
      append(data, int_tuple(ti.shape));
      data.push_back(raw(kTuple1));
      data.push_back(raw(kReduce));
      // torch >= 2.0 pickles (indices, values, size, is_coalesced); a
      // 3-tuple means "not known coalesced" to 2.x and is all 1.13 reads, so
      // the flag is written only when set.
      if (ti.layout == Layout::kSparseCoo && ti.coalesced) data.push_back(boolean(true));
      tuple_of(seq, std::move(data));
      seq.push_back(raw(kTuple2));
      seq.push_back(raw(kReduce));
      return {};
    }
    return plain_core(seq, ti, requires_grad);
  }

  // Strided tensors: meta, quantized, v2, v3.
  Status plain_core(Seq& seq, const TensorInfo& ti, bool requires_grad) {
    if (ti.is_meta) {
      seq.push_back(global("torch._utils", "_rebuild_meta_tensor_no_storage"));
      Seq args;
      args.push_back(global("torch", dtype_name(ti.dtype)));
      append(args, int_tuple(ti.shape));
      append(args, int_tuple(ti.stride));
      args.push_back(boolean(requires_grad));
      seq.push_back(raw(kMark));
      append(seq, std::move(args));
      seq.push_back(raw(kTuple));
      seq.push_back(raw(kReduce));
      return {};
    }
    if (ti.storage >= c_.storages().size()) return internal("save: tensor without a storage");
    const bool typed = typed_[ti.storage];
    if (dtype_is_quantized(ti.dtype)) {
      if (!typed)
        return unsupported("save: quantized tensor over storage " + c_.storages()[ti.storage].key +
                           ", which is also viewed as another dtype; torch cannot rebuild that");
      seq.push_back(global("torch._utils", "_rebuild_qtensor"));
      seq.push_back(raw(kMark));
      seq.push_back({Op::kPid, ti.storage});
      seq.push_back(integer(ti.storage_offset));
      append(seq, int_tuple(ti.shape));
      append(seq, int_tuple(ti.stride));
      Seq q;
      q.push_back(global("torch", qscheme_name(ti.qscheme)));
      const bool per_channel = ti.qscheme == QScheme::kPerChannelAffine ||
                               ti.qscheme == QScheme::kPerChannelSymmetric ||
                               ti.qscheme == QScheme::kPerChannelAffineFloatQParams;
      if (per_channel) {
        if (ti.q_scales >= c_.tensors().size() || ti.q_zero_points >= c_.tensors().size())
          return internal("save: per-channel quantizer tensors out of range");
        q.push_back({Op::kTensor, ti.q_scales});
        q.push_back({Op::kTensor, ti.q_zero_points});
        q.push_back(integer(ti.q_axis));
      } else {
        q.push_back({Op::kRaw, 0, 0, false, float_bytes(ti.q_scale)});
        q.push_back(integer(ti.q_zero_point));
      }
      tuple_of(seq, std::move(q));
      seq.push_back(boolean(requires_grad));
      ordered_dict_call(seq);
      seq.push_back(raw(kTuple));
      seq.push_back(raw(kReduce));
      return {};
    }
    const bool v3 = !typed;
    seq.push_back(global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2"));
    seq.push_back(raw(kMark));
    seq.push_back({Op::kPid, ti.storage});
    seq.push_back(integer(ti.storage_offset));
    append(seq, int_tuple(ti.shape));
    append(seq, int_tuple(ti.stride));
    seq.push_back(boolean(requires_grad));
    ordered_dict_call(seq);
    if (v3) seq.push_back(global("torch", dtype_name(ti.dtype)));
    if (ti.conj || ti.neg) {
      // torch._utils.get_tensor_metadata: {"conj": True} / {"neg": True}
      seq.push_back(raw(kEmptyDict));
      if (ti.conj && ti.neg) seq.push_back(raw(kMark));
      if (ti.conj) {
        seq.push_back(str("conj"));
        seq.push_back(boolean(true));
      }
      if (ti.neg) {
        seq.push_back(str("neg"));
        seq.push_back(boolean(true));
      }
      seq.push_back(raw(ti.conj && ti.neg ? kSetItems : kSetItem));
    }
    seq.push_back(raw(kTuple));
    seq.push_back(raw(kReduce));
    return {};
  }

  static constexpr std::uint32_t kUnassigned = 0xFFFFFFFFu;
  const Checkpoint& c_;
  const ValueArena& a_;
  PickleWriteOptions opt_;
  std::vector<std::uint8_t> out_;
  std::vector<Action> stack_;
  std::uint32_t memo_count_ = 0;
  std::unordered_map<std::string, std::uint32_t> str_memo_, global_memo_;
  std::unordered_map<NodeId, std::uint32_t> node_memo_;
  std::unordered_map<std::uint32_t, std::uint32_t> tensor_memo_;
  std::unordered_set<NodeId> active_;
  std::unordered_set<std::uint32_t> active_tensors_;
  std::vector<bool> typed_;
  std::vector<DType> typed_dtype_;
  std::vector<std::uint32_t> key_of_;
  std::vector<std::uint32_t> key_order_;
  std::vector<std::uint64_t> key_numel_;  // numel in each key's persistent id
};

}  // namespace

Result<TorchPickle> write_torch_pickle(const Checkpoint& ckpt, const PickleWriteOptions& options) {
  Pickler p(ckpt, options);
  return p.run();
}

}  // namespace safeckpt
