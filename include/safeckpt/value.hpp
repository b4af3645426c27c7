// safeckpt/value.hpp — the typed value tree a checkpoint's pickle denotes.
//
// Values live in an arena (ValueArena) and refer to each other by NodeId, so
// the pickle memo's shared references stay shared (a list appended to itself
// is a cycle, not an infinite copy), and teardown is a flat vector free — no
// recursion on attacker-shaped data.
//
// Mapping from Python (the corpus JSON schema in tests/corpus/README.md):
//   None/bool/int/float/complex/str/bytes/bytearray   -> kNone..kByteArray
//   int beyond int64                                   -> kBigInt (decimal text)
//   list/tuple/set/frozenset/slice                     -> kList..kSlice
//   dict / collections.OrderedDict / collections.Counter -> kDict/kOrderedDict/kCounter
//   torch.Size / torch.dtype / torch.device            -> kSize/kDtype/kDevice
//   torch.layout / torch.qscheme                       -> kLayout/kQScheme
//   torch.Tensor / nn.Parameter                        -> kTensor (-> TensorInfo)
//   an allowlisted class or function used as a value   -> kGlobal
//   an allowlisted callable the library does not model -> kObject (name, args, state)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace safeckpt {

using NodeId = std::uint32_t;
inline constexpr NodeId kNoNode = 0xFFFFFFFFu;

enum class Kind : std::uint8_t {
  kNone,
  kBool,
  kInt,
  kBigInt,
  kFloat,
  kComplex,
  kStr,
  kBytes,
  kByteArray,
  kList,
  kTuple,
  kSet,
  kFrozenSet,
  kSlice,
  kDict,
  kOrderedDict,
  kCounter,
  kSize,
  kDtype,
  kDevice,
  kLayout,
  kQScheme,
  kTensor,
  kStorage,
  kGlobal,
  kObject,
};

std::string_view kind_name(Kind k) noexcept;

struct Node {
  Kind kind = Kind::kNone;
  bool flag = false;      // kBool value; kObject: made by NEWOBJ (cls.__new__(cls)) then BUILD, not REDUCE
  std::int64_t i = 0;     // kInt value; kTensor: tensor index; kStorage: storage index;
                          // kDtype: DType; kGlobal: handled-as id (internal)
  double re = 0, im = 0;  // kFloat (re), kComplex
  // kStr (UTF-8), kBytes/kByteArray (raw), kBigInt (decimal, '-' sign),
  // kGlobal/kObject (canonical "module.qualname"), kDevice ("cuda:1"),
  // kLayout ("sparse_coo"), kQScheme ("per_tensor_affine").
  std::string text;
  // Containers: elements in order. Dicts: k0, v0, k1, v1, ... (insertion
  // order). kSlice: start, stop, step. kSize: kInt nodes. kObject: [args, state]
  // (either may be kNoNode).
  std::vector<NodeId> items;
  // kOrderedDict: the dict its BUILD state set as attributes (e.g. {"_metadata": ...}), else kNoNode.
  NodeId attrs = kNoNode;
};

class ValueArena {
 public:
  NodeId add(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<NodeId>(nodes_.size() - 1);
  }
  const Node& operator[](NodeId id) const { return nodes_[id]; }
  Node& operator[](NodeId id) { return nodes_[id]; }
  std::size_t size() const noexcept { return nodes_.size(); }
  void reserve(std::size_t n) { nodes_.reserve(n); }

 private:
  std::vector<Node> nodes_;
};

}  // namespace safeckpt
