// Python dict-key / set-member semantics for the pickle machine.
//
// A hashable value maps to a canonical key string such that two values are
// equal in Python (==, with the hash contract) exactly when their keys are
// equal, for the types that carry value equality: None, bool/int/float/
// complex (1 == 1.0 == True, -0.0 == 0.0), str, bytes, tuple and torch.Size
// (element-wise), dtype, device, layout, qscheme and globals (singletons).
// Other hashable objects (tensors, frozensets, generic objects) compare by
// identity. list/dict/set/bytearray/slice are unhashable -> kDisallowedOperation
// (Python raises TypeError: unhashable type).
#pragma once

#include <string>
#include <unordered_map>

#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt {

class KeyIndex {
 public:
  // Canonical key of `id`; iterative over nested tuples; bounded length.
  Result<std::string> key_of(const ValueArena& arena, NodeId id, const Limits& limits) const;

  struct Slot {
    std::size_t index;  // position of the (first) equal key
    bool inserted;      // true when the key was new
  };
  // Looks `key` up among `container`'s keys; inserts it at `next_index` if new.
  Slot find_or_insert(NodeId container, const std::string& key, std::size_t next_index);
  // Bytes of all keys stored so far. Callers cap it (limits.max_string_bytes)
  // so that many long tuple keys cannot amplify memory (fuzz/regressions/pickle).
  std::uint64_t stored_bytes() const noexcept { return stored_bytes_; }

 private:
  std::uint64_t stored_bytes_ = 0;
  std::unordered_map<NodeId, std::unordered_map<std::string, std::size_t>> index_;
};

}  // namespace safeckpt
