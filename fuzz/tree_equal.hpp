// fuzz/tree_equal.hpp — are two checkpoints the same value (what save ->
// load must preserve)? Iterative (explicit work list), bounded, and
// identity-aware: a mutable container or tensor shared in `a` must be shared
// the same way in `b` (pickle's memo keeps identity).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safeckpt/checkpoint.hpp"

namespace safeckpt::fuzz {

class TreeCompare {
 public:
  TreeCompare(const Checkpoint& a, const Checkpoint& b) : a_(a), b_(b) {}

  // "" when equal, else the first difference found.
  std::string compare(NodeId ra, NodeId rb) {
    work_.push_back({ra, rb});
    std::uint64_t steps = 0;
    while (!work_.empty()) {
      if (++steps > kMaxSteps) return "";  // too large to compare fully: treat as equal (bounded harness)
      auto [x, y] = work_.back();
      work_.pop_back();
      std::string d = node(x, y);
      if (!d.empty()) return d;
    }
    while (!tensor_work_.empty()) {
      auto [x, y] = tensor_work_.back();
      tensor_work_.pop_back();
      std::string d = tensor(x, y);
      if (!d.empty()) return d;
      while (!work_.empty()) {  // python_state of tensors
        auto [p, q] = work_.back();
        work_.pop_back();
        d = node(p, q);
        if (!d.empty()) return d;
      }
    }
    return "";
  }

 private:
  static constexpr std::uint64_t kMaxSteps = 1u << 20;

  static bool identity_kind(Kind k) {
    return k == Kind::kList || k == Kind::kDict || k == Kind::kOrderedDict || k == Kind::kCounter || k == Kind::kSet ||
           k == Kind::kByteArray || k == Kind::kTensor;
  }
  static bool same_bits(double p, double q) { return std::memcmp(&p, &q, sizeof p) == 0; }

  // Records a <-> b for identity kinds; false if either side was already
  // paired with something else. `first` tells whether this pair is new.
  bool pair(std::unordered_map<std::uint64_t, std::uint64_t>& ab, std::unordered_map<std::uint64_t, std::uint64_t>& ba,
            std::uint64_t x, std::uint64_t y, bool& first) {
    auto i = ab.find(x);
    auto j = ba.find(y);
    if (i == ab.end() && j == ba.end()) {
      ab.emplace(x, y);
      ba.emplace(y, x);
      first = true;
      return true;
    }
    first = false;
    return i != ab.end() && j != ba.end() && i->second == y && j->second == x;
  }

  std::string where(NodeId x, NodeId y, const std::string& what) const {
    const Node& n = a_.values()[x];
    return what + " (node " + std::to_string(x) + " " + std::string(kind_name(n.kind)) + " vs node " +
           std::to_string(y) + " " + std::string(kind_name(b_.values()[y].kind)) + ")";
  }

  std::string node(NodeId x, NodeId y) {
    if (x == kNoNode || y == kNoNode) return x == y ? "" : "one side has no node";
    if (x >= a_.values().size() || y >= b_.values().size()) return "node id out of range";
    const Node& p = a_.values()[x];
    const Node& q = b_.values()[y];
    if (p.kind != q.kind) return where(x, y, "kinds differ");
    if (identity_kind(p.kind)) {
      bool first = false;
      if (!pair(node_ab_, node_ba_, x, y, first)) return where(x, y, "sharing differs (identity not preserved)");
      if (!first) return "";
    }
    switch (p.kind) {
      case Kind::kNone: return "";
      case Kind::kBool: return p.flag == q.flag ? "" : where(x, y, "bool differs");
      case Kind::kInt:
      case Kind::kDtype:
        return p.i == q.i ? "" : where(x, y, "int differs: " + std::to_string(p.i) + " vs " + std::to_string(q.i));
      case Kind::kFloat: return same_bits(p.re, q.re) ? "" : where(x, y, "float bits differ");
      case Kind::kComplex:
        return same_bits(p.re, q.re) && same_bits(p.im, q.im) ? "" : where(x, y, "complex bits differ");
      case Kind::kBigInt:
      case Kind::kStr:
      case Kind::kBytes:
      case Kind::kDevice:
      case Kind::kLayout:
      case Kind::kQScheme:
      case Kind::kGlobal:
        if (p.text != q.text)
          return where(x, y, "text differs: '" + p.text.substr(0, 40) + "' vs '" + q.text.substr(0, 40) + "'");
        return "";
      case Kind::kByteArray: return p.text == q.text ? "" : where(x, y, "bytearray differs");
      case Kind::kTensor: {
        if (p.i < 0 || q.i < 0) return where(x, y, "negative tensor index");
        tensor_work_.push_back({static_cast<std::uint32_t>(p.i), static_cast<std::uint32_t>(q.i)});
        return "";
      }
      case Kind::kStorage: {
        bool first = false;
        if (!pair(storage_ab_, storage_ba_, static_cast<std::uint64_t>(p.i), static_cast<std::uint64_t>(q.i), first))
          return where(x, y, "storage sharing differs");
        return "";
      }
      case Kind::kObject:
        if (p.text != q.text) return where(x, y, "object type differs");
        [[fallthrough]];
      default:
        if (p.items.size() != q.items.size())
          return where(
              x, y, "item counts differ: " + std::to_string(p.items.size()) + " vs " + std::to_string(q.items.size()));
        for (std::size_t i = p.items.size(); i-- > 0;) work_.push_back({p.items[i], q.items[i]});
        if ((p.attrs == kNoNode) != (q.attrs == kNoNode)) return where(x, y, "attributes (_metadata) differ");
        if (p.attrs != kNoNode) work_.push_back({p.attrs, q.attrs});
        return "";
    }
  }

  std::string tensor(std::uint32_t x, std::uint32_t y) {
    const auto& ta = a_.tensors();
    const auto& tb = b_.tensors();
    if (x >= ta.size() || y >= tb.size()) return "tensor index out of range";
    bool first = false;
    if (!pair(tensor_ab_, tensor_ba_, x, y, first)) return "tensor sharing differs";
    if (!first) return "";
    const TensorInfo& p = ta[x];
    const TensorInfo& q = tb[y];
    const std::string tag = "tensor " + std::to_string(x) + " vs " + std::to_string(y) + ": ";
    if (p.layout != q.layout) return tag + "layout differs";
    if (p.dtype != q.dtype) return tag + "dtype differs";
    if (p.shape != q.shape) return tag + "shape differs";
    if (p.requires_grad != q.requires_grad) return tag + "requires_grad differs";
    if (p.is_parameter != q.is_parameter) return tag + "is_parameter differs";
    if (p.is_meta != q.is_meta) return tag + "is_meta differs";
    if (p.conj != q.conj || p.neg != q.neg) return tag + "conj/neg differ";
    if (p.device != q.device) return tag + "device differs";
    if (p.qscheme != q.qscheme || !same_bits(p.q_scale, q.q_scale) || p.q_zero_point != q.q_zero_point ||
        p.q_axis != q.q_axis)
      return tag + "quantization parameters differ";
    if (p.layout == Layout::kStrided) {
      if (p.stride != q.stride) return tag + "stride differs";
      if (p.storage_offset != q.storage_offset) return tag + "storage_offset differs";
      if ((p.storage == kNoStorage) != (q.storage == kNoStorage)) return tag + "one has a storage";
      if (p.storage != kNoStorage) {
        if (!pair(storage_ab_, storage_ba_, p.storage, q.storage, first)) return tag + "storage sharing differs";
        const StorageInfo& sa = a_.storages()[p.storage];
        const StorageInfo& sb = b_.storages()[q.storage];
        if (sa.nbytes != sb.nbytes) return tag + "storage sizes differ";
        if (first && (sa.bytes.size() != sb.bytes.size() ||
                      (!sa.bytes.empty() && std::memcmp(sa.bytes.data(), sb.bytes.data(), sa.bytes.size()) != 0)))
          return tag + "storage bytes differ";
      }
    } else {
      if (p.sparse_parts.size() != q.sparse_parts.size()) return tag + "sparse parts differ";
      if (p.coalesced != q.coalesced) return tag + "coalesced differs";
      for (std::size_t i = 0; i < p.sparse_parts.size(); ++i)
        tensor_work_.push_back({p.sparse_parts[i], q.sparse_parts[i]});
    }
    if ((p.q_scales == kNoStorage) != (q.q_scales == kNoStorage)) return tag + "q_scales differ";
    if (p.q_scales != kNoStorage) tensor_work_.push_back({p.q_scales, q.q_scales});
    if ((p.q_zero_points == kNoStorage) != (q.q_zero_points == kNoStorage)) return tag + "q_zero_points differ";
    if (p.q_zero_points != kNoStorage) tensor_work_.push_back({p.q_zero_points, q.q_zero_points});
    if ((p.python_state == kNoNode) != (q.python_state == kNoNode)) return tag + "python_state differs";
    if (p.python_state != kNoNode) work_.push_back({p.python_state, q.python_state});
    return "";
  }

  const Checkpoint& a_;
  const Checkpoint& b_;
  std::vector<std::pair<NodeId, NodeId>> work_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> tensor_work_;
  std::unordered_map<std::uint64_t, std::uint64_t> node_ab_, node_ba_, tensor_ab_, tensor_ba_, storage_ab_, storage_ba_;
};

}  // namespace safeckpt::fuzz
