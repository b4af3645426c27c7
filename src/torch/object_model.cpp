// Torch object model. Rules: src/torch/object_model.hpp. Argument shapes:
// torch/_utils.py (rebuild functions), torch/_tensor.py, torch/nn/parameter.py,
// torch/serialization.py (persistent ids), torch/_weights_only_unpickler.py.
#include "torch/object_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "pickle/key.hpp"
#include "torch/hook_args.hpp"
#include "torch/weights_only_rules.hpp"

namespace safeckpt {

using hook_args::Args;
using hook_args::bad_args;

std::uint64_t TensorInfo::numel() const noexcept {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

Result<NodeId> TorchHooks::add(Node n) {
  if (arena_.size() >= lim_.max_nodes) return make_error(ErrorCode::kLimitExceeded, "more than max_nodes values");
  return arena_.add(std::move(n));
}

// The budget's per-tensor charge must stay an upper bound of the real cost.
static_assert(2 * sizeof(TensorInfo) <= MemoryBudget::kTensorBytes);

Status TorchHooks::charge(std::uint64_t bytes, const char* what) {
  if (budget_ == nullptr) return {};
  return budget_->charge(bytes, what);
}

Status TorchHooks::charge_tensor(const TensorInfo& t) {
  return charge(MemoryBudget::kTensorBytes + 2 * sizeof(std::int64_t) * (t.shape.size() + t.stride.size()) +
                    4 * t.sparse_parts.size() + t.device.size(),
                "tensor metadata");
}

Result<NodeId> TorchHooks::add_tensor(TensorInfo t) {
  if (t_.tensors.size() >= lim_.max_tensors)
    return make_error(ErrorCode::kLimitExceeded,
                      "more than max_tensors (" + std::to_string(lim_.max_tensors) + ") tensors");
  SAFECKPT_CHECK(charge_tensor(t));
  t_.tensors.push_back(std::move(t));
  Node n;
  n.kind = Kind::kTensor;
  n.i = static_cast<std::int64_t>(t_.tensors.size() - 1);
  return add(std::move(n));
}

Status TorchHooks::charge_items(std::size_t n) {
  copied_items_ += n;
  if (copied_items_ > lim_.max_nodes)
    return make_error(ErrorCode::kLimitExceeded, "containers copied by constructors exceed max_nodes items");
  return {};
}

const AllowEntry* TorchHooks::entry_of(NodeId g) const {
  const Node& n = arena_[g];
  if (n.kind != Kind::kGlobal || n.i < 0) return nullptr;
  return allow_.find(n.text);
}

Result<NodeId> TorchHooks::resolve_global(std::string_view name, const OpContext&) {
  if (Allowlist::is_blocked(name)) return make_error(ErrorCode::kDisallowedGlobal, allow_hint(name));
  const AllowEntry* e = allow_.find(name);
  if (e == nullptr) return make_error(ErrorCode::kDisallowedGlobal, allow_hint(name));
  Node n;
  if (e->builtin == Builtin::kDtype) {
    n.kind = Kind::kDtype;
    n.i = static_cast<std::int64_t>(e->dtype);
    n.text = std::string(dtype_name(e->dtype));
    return add(std::move(n));
  }
  if (e->builtin == Builtin::kQScheme) {
    n.kind = Kind::kQScheme;
    n.text = std::string(name.substr(name.rfind('.') + 1));
    return add(std::move(n));
  }
  n.kind = Kind::kGlobal;
  n.text = std::string(name);
  n.i = static_cast<std::int64_t>(e->builtin);
  return add(std::move(n));
}

Status TorchHooks::require_builtin(std::string_view name, const OpContext&) {
  if (allow_.find(name) == nullptr) return make_error(ErrorCode::kDisallowedGlobal, allow_hint(name));
  return {};
}

Result<NodeId> TorchHooks::call(NodeId callable, NodeId args_id, const OpContext& ctx) {
  budget_ = ctx.budget;
  const AllowEntry* e = entry_of(callable);
  if (e == nullptr)
    return make_error(ErrorCode::kDisallowedOperation,
                      "Trying to call reduce for unrecognized function " +
                          (arena_[callable].kind == Kind::kGlobal ? arena_[callable].text
                                                                  : std::string(kind_name(arena_[callable].kind))));
  SAFECKPT_CHECK(weights_only::check_call(*e, false));
  const std::vector<NodeId> v = arena_[args_id].items;  // copy: arena may grow
  Args a{arena_, v, e->name};
  Node n;
  switch (e->builtin) {
    case Builtin::kOrderedDict:
    case Builtin::kCounter: {
      n.kind = e->builtin == Builtin::kOrderedDict ? Kind::kOrderedDict : Kind::kCounter;
      if (v.size() > 1) return bad_args(e->name, "expected at most one argument");
      if (v.size() == 1) {
        const Node& src = arena_[v[0]];
        KeyIndex keys;
        auto put = [&](NodeId k, NodeId val) -> Status {
          SAFECKPT_TRY(std::string key, keys.key_of(arena_, k, lim_));
          auto slot = keys.find_or_insert(0, key, n.items.size() / 2);
          if (slot.inserted) {
            n.items.push_back(k);
            n.items.push_back(val);
          } else {
            n.items[2 * slot.index + 1] = val;
          }
          return {};
        };
        SAFECKPT_CHECK(charge_items(src.items.size()));
        if (src.kind == Kind::kDict || src.kind == Kind::kOrderedDict || src.kind == Kind::kCounter) {
          for (std::size_t i = 0; i + 1 < src.items.size(); i += 2) SAFECKPT_CHECK(put(src.items[i], src.items[i + 1]));
        } else if (src.kind == Kind::kList || src.kind == Kind::kTuple) {
          for (NodeId p : src.items) {
            const Node& pair = arena_[p];
            if (pair.kind != Kind::kTuple && pair.kind != Kind::kList) return bad_args(e->name, "items must be pairs");
            if (pair.items.size() != 2) return bad_args(e->name, "items must be pairs");
            SAFECKPT_CHECK(put(pair.items[0], pair.items[1]));
          }
        } else {
          return bad_args(e->name, "argument must be a dict or a list of pairs");
        }
      }
      return add(std::move(n));
    }
    case Builtin::kSet: return make_set(Kind::kSet, v);
    case Builtin::kFrozenSet: return make_set(Kind::kFrozenSet, v);
    case Builtin::kByteArray: {
      n.kind = Kind::kByteArray;
      if (v.empty()) return add(std::move(n));
      const Node& src = a.at(0);
      if (v.size() == 1 && src.kind == Kind::kBytes) {
        n.text = src.text;
        return add(std::move(n));
      }
      if (v.size() == 2 && src.kind == Kind::kStr && a.at(1).kind == Kind::kStr &&
          (a.at(1).text == "latin-1" || a.at(1).text == "latin1")) {
        return [&]() -> Result<NodeId> {
          // bytearray(str, 'latin-1') encodes like _codecs.encode
          std::string out;
          const std::string& s = src.text;
          for (std::size_t i = 0; i < s.size();) {
            auto c = static_cast<unsigned char>(s[i]);
            std::uint32_t cp;
            std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
            if (i + len > s.size()) return bad_args(e->name, "invalid UTF-8");
            cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
            for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
            if (cp > 0xFF) return bad_args(e->name, "'latin-1' codec can't encode character");
            out.push_back(static_cast<char>(cp));
            i += len;
          }
          Node r;
          r.kind = Kind::kByteArray;
          r.text = std::move(out);
          return add(std::move(r));
        }();
      }
      return bad_args(e->name, "expected (), (bytes,) or (str, 'latin-1')");
    }
    case Builtin::kCodecsEncode: {
      if (v.size() != 2 || a.at(0).kind != Kind::kStr || a.at(1).kind != Kind::kStr ||
          (a.at(1).text != "latin1" && a.at(1).text != "latin-1"))
        return bad_args(e->name, "expected (str, 'latin1')");
      std::string out;
      const std::string& s = a.at(0).text;
      for (std::size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        if (i + len > s.size()) return bad_args(e->name, "invalid UTF-8");
        std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
        for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
        if (cp > 0xFF) return bad_args(e->name, "'latin-1' codec can't encode character");
        out.push_back(static_cast<char>(cp));
        i += len;
      }
      n.kind = Kind::kBytes;
      n.text = std::move(out);
      return add(std::move(n));
    }
    case Builtin::kComplex: {
      if (v.empty() || v.size() > 2) return bad_args(e->name, "expected (real[, imag])");
      n.kind = Kind::kComplex;
      SAFECKPT_TRY(n.re, a.number(0, "real"));
      if (v.size() == 2) {
        SAFECKPT_TRY(n.im, a.number(1, "imag"));
      }
      return add(std::move(n));
    }
    case Builtin::kSlice: {
      if (v.empty() || v.size() > 3) return bad_args(e->name, "expected 1-3 arguments");
      SAFECKPT_TRY(NodeId none, add(Node{}));
      n.kind = Kind::kSlice;
      if (v.size() == 1)
        n.items = {none, v[0], none};
      else if (v.size() == 2)
        n.items = {v[0], v[1], none};
      else
        n.items = v;
      return add(std::move(n));
    }
    case Builtin::kSize: {
      if (v.size() > 1) return bad_args(e->name, "expected one tuple");
      n.kind = Kind::kSize;
      if (v.size() == 1) {
        SAFECKPT_TRY(auto dims, a.int_tuple(0, "size", lim_.max_container_items));
        SAFECKPT_CHECK(charge_items(dims.size()));
        n.items = arena_[v[0]].items;
      }
      return add(std::move(n));
    }
    case Builtin::kDevice: return make_device(v);
    case Builtin::kGetLayout: {
      if (v.size() != 1 || a.at(0).kind != Kind::kStr) return bad_args(e->name, "expected (name,)");
      static constexpr std::string_view kLayouts[] = {"torch.strided",    "torch.sparse_coo", "torch.sparse_csr",
                                                      "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                                                      "torch._mkldnn",    "torch.jagged"};
      bool ok = false;
      for (auto l : kLayouts) ok = ok || l == a.at(0).text;
      if (!ok) return bad_args(e->name, "unknown layout '" + a.at(0).text + "'");
      n.kind = Kind::kLayout;
      n.text = a.at(0).text.substr(6);
      return add(std::move(n));
    }
    case Builtin::kRebuildTensor:
    case Builtin::kRebuildTensorV2:
    case Builtin::kRebuildTensorV3: return rebuild_strided(v, e->builtin);
    case Builtin::kRebuildParameter: return rebuild_parameter(v, false);
    case Builtin::kRebuildParameterWithState: return rebuild_parameter(v, true);
    case Builtin::kRebuildQTensor: return rebuild_qtensor(v);
    case Builtin::kRebuildSparseTensor: return rebuild_sparse(v);
    case Builtin::kRebuildMetaTensorNoStorage: return rebuild_meta(v);
    case Builtin::kRebuildDeviceTensorFromCpuTensor: return rebuild_device_from_cpu(v);
    case Builtin::kRebuildFromTypeV2: return rebuild_from_type_v2(v, ctx);
    case Builtin::kRebuildWrapperSubclass:
    case Builtin::kRebuildDeviceTensorFromNumpy:
    case Builtin::kDTensor:
      return make_error(ErrorCode::kUnsupported, e->name + " (tensor without a storage layout we can read)");
    case Builtin::kNumpyReconstruct:
    case Builtin::kNumpyScalar:
    case Builtin::kNumpyDtype:
    case Builtin::kNumpyNdarray:
    case Builtin::kNumpyDTypeClass: return numpy_call(e->builtin, callable, v);
    case Builtin::kGeneric: {
      // Allowlisted but not modelled: keep the call as data, never execute it.
      n.kind = Kind::kObject;
      n.text = e->name;
      n.items = {args_id, kNoNode};
      return add(std::move(n));
    }
    case Builtin::kParameter: {
      // torch.nn.Parameter(data[, requires_grad]) as a REDUCE (old files).
      if (v.empty() || v.size() > 2 || a.at(0).kind != Kind::kTensor)
        return bad_args(e->name, "expected (data[, requires_grad])");
      TensorInfo t = t_.tensors[static_cast<std::size_t>(a.at(0).i)];
      t.is_parameter = true;
      t.requires_grad = true;
      if (v.size() == 2) {
        SAFECKPT_TRY(t.requires_grad, a.boolean(1, "requires_grad"));
      }
      return add_tensor(std::move(t));
    }
    default:
      return make_error(ErrorCode::kDisallowedOperation, "Trying to call reduce for unrecognized function " + e->name);
  }
}

Result<NodeId> TorchHooks::new_object(NodeId cls, NodeId args, const OpContext& ctx) {
  budget_ = ctx.budget;
  const AllowEntry* e = entry_of(cls);
  if (e == nullptr)
    return make_error(
        ErrorCode::kDisallowedOperation,
        "Can only create new object for nn.Parameter or classes allowlisted via add_safe_globals "
        "(--allow FILE), but got " +
            (arena_[cls].kind == Kind::kGlobal ? arena_[cls].text : std::string(kind_name(arena_[cls].kind))));
  SAFECKPT_CHECK(weights_only::check_call(*e, true));
  if (e->user && e->builtin == Builtin::kGeneric) {
    Node n;
    n.kind = Kind::kObject;
    n.text = e->name;
    n.items = {args, kNoNode};
    return add(std::move(n));
  }
  return call(cls, args, ctx);
}

Status TorchHooks::build(NodeId obj, NodeId state, const OpContext& ctx) {
  budget_ = ctx.budget;
  const Node& o = arena_[obj];
  using weights_only::BuildTarget;
  const BuildTarget target = weights_only::build_target(o, numpy_objects_.count(obj) != 0, allow_);
  SAFECKPT_CHECK(weights_only::check_build(target, o.kind == Kind::kObject ? o.text : std::string(kind_name(o.kind)),
                                           arena_, state));
  switch (target) {
    case BuildTarget::kOrderedDict: arena_[obj].attrs = state; return {};
    case BuildTarget::kNumpy: return numpy_build(obj, state);
    case BuildTarget::kUserObject: arena_[obj].items[1] = state; return {};
    case BuildTarget::kOther: break;
  }
  return make_error(ErrorCode::kInternal, "BUILD target refused without an error");
}

}  // namespace safeckpt
