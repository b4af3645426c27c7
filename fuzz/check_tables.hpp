// fuzz/check_tables.hpp — re-checks what the loader hands out, independently
// of the loader's own checks: every TensorInfo against its StorageInfo
// (checkpoint.hpp "Storages and views"), every index into the tables, every
// node id, and the memory held against the input size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/tensor.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt::fuzz {

using u128 = unsigned __int128;

// Byte extent [0, end) of a strided view in its storage, or 0 for a view with
// no elements; computed in 128 bits so nothing the file says can overflow.
// Returns false (with `why`) if the view breaks a shape/stride rule.
inline bool view_extent(const TensorInfo& t, u128& end, std::string& why) {
  end = 0;
  if (t.stride.size() != t.shape.size()) {
    why = "rank " + std::to_string(t.shape.size()) + " but " + std::to_string(t.stride.size()) + " strides";
    return false;
  }
  if (t.storage_offset < 0) {
    why = "negative storage_offset";
    return false;
  }
  u128 last = static_cast<std::uint64_t>(t.storage_offset);
  bool empty = false;
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] < 0 || t.stride[i] < 0) {
      why = "negative size or stride in dim " + std::to_string(i);
      return false;
    }
    if (t.shape[i] == 0)
      empty = true;
    else
      last += static_cast<u128>(static_cast<std::uint64_t>(t.shape[i] - 1)) * static_cast<std::uint64_t>(t.stride[i]);
  }
  if (empty) return true;
  end = (last + 1) * dtype_size(t.dtype);
  return true;
}

// Checks the tables a loader produced. `input` is the bytes the loader was
// given (storages of stored records must be views of it); `limits` the caps
// it ran with. Returns bytes of metadata held (tensors, storages), for the
// memory check; storage bytes themselves are not counted (they are the file's
// or bounded by max_inflated_bytes).
inline std::uint64_t check_tables(const ValueArena& arena, const std::vector<TensorInfo>& tensors,
                                  const std::vector<StorageInfo>& storages, Bytes input, const Limits& limits,
                                  bool storages_from_input) {
  std::uint64_t held = 0;
  FUZZ_REQUIRE(tensors.size() <= limits.max_tensors, std::to_string(tensors.size()) + " tensors > max_tensors");
  u128 total = 0;
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const StorageInfo& s = storages[i];
    const std::string tag = "storage " + std::to_string(i) + " ('" + s.key + "')";
    FUZZ_REQUIRE(s.dtype < DType::kCount_, tag + ": invalid dtype");
    FUZZ_REQUIRE(s.bytes.size() == s.nbytes, tag + ": " + std::to_string(s.bytes.size()) +
                                                 " bytes handed out, nbytes says " + std::to_string(s.nbytes));
    FUZZ_REQUIRE(s.nbytes % dtype_size(s.dtype) == 0, tag + ": nbytes not a multiple of the element size");
    FUZZ_REQUIRE(s.swap_unit == 1 || s.swap_unit == 2 || s.swap_unit == 4 || s.swap_unit == 8,
                 tag + ": swap_unit " + std::to_string(s.swap_unit));
    FUZZ_REQUIRE(s.nbytes % s.swap_unit == 0, tag + ": nbytes not a multiple of swap_unit");
    if (s.file_offset != Location::kNoOffset && storages_from_input) {
      FUZZ_REQUIRE(s.file_offset <= input.size() && s.nbytes <= input.size() - s.file_offset,
                   tag + ": file_offset range outside the input");
      if (s.swap_unit == 1)
        FUZZ_REQUIRE(s.bytes.data() == input.data() + s.file_offset, tag + ": bytes are not the input at file_offset");
    }
    if (!s.bytes.empty()) {
      // Touch first and last byte (ASan: the span is really that long).
      volatile std::uint8_t sink = s.bytes.front();
      sink = s.bytes.back();
      (void)sink;
    }
    total += s.nbytes;
    held += sizeof(StorageInfo) + s.key.size() + s.location.size() + s.record.size();
  }
  FUZZ_REQUIRE(total <= limits.max_total_storage_bytes, "storages exceed max_total_storage_bytes");

  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const std::string tag = "tensor " + std::to_string(i);
    FUZZ_REQUIRE(t.dtype < DType::kCount_, tag + ": invalid dtype");
    FUZZ_REQUIRE(static_cast<unsigned>(t.layout) <= static_cast<unsigned>(Layout::kSparseBsc),
                 tag + ": invalid layout");
    FUZZ_REQUIRE(t.shape.size() <= limits.max_tensor_rank, tag + ": rank above max_tensor_rank");
    u128 numel = 1;
    for (std::int64_t d : t.shape) {
      FUZZ_REQUIRE(d >= 0, tag + ": negative size");
      numel *= static_cast<std::uint64_t>(d);
      if (numel > (u128{1} << 64)) numel = u128{1} << 64;  // saturate
    }
    FUZZ_REQUIRE(numel < (u128{1} << 64) && t.numel() == static_cast<std::uint64_t>(numel),
                 tag + ": numel() disagrees with the product of the shape");
    if (t.storage != kNoStorage) {
      FUZZ_REQUIRE(t.storage < storages.size(), tag + ": storage index " + std::to_string(t.storage) + " out of range");
      FUZZ_REQUIRE(!t.is_meta, tag + ": meta tensor with a storage");
      FUZZ_REQUIRE(t.layout == Layout::kStrided, tag + ": sparse tensor with a storage");
      u128 end = 0;
      std::string why;
      FUZZ_REQUIRE(view_extent(t, end, why), tag + ": " + why);
      const StorageInfo& s = storages[t.storage];
      FUZZ_REQUIRE(end <= s.nbytes,
                   tag + ": view ends at byte " + std::to_string(static_cast<std::uint64_t>(end >> 64 ? ~0ull : end)) +
                       " beyond its storage '" + s.key + "' of " + std::to_string(s.nbytes) + " bytes");
    } else if (t.layout == Layout::kStrided && !t.is_meta) {
      // A strided, non-meta tensor without storage: only allowed when it has
      // no elements to read.
      FUZZ_REQUIRE(numel == 0 || !t.device.empty(), tag + ": strided tensor with elements but no storage");
    }
    for (std::uint32_t p : t.sparse_parts) {
      FUZZ_REQUIRE(p < tensors.size() && p != i, tag + ": sparse part " + std::to_string(p) + " invalid");
    }
    if (t.layout != Layout::kStrided) FUZZ_REQUIRE(!t.sparse_parts.empty(), tag + ": sparse tensor without parts");
    if (t.q_scales != kNoStorage) FUZZ_REQUIRE(t.q_scales < tensors.size(), tag + ": q_scales index out of range");
    if (t.q_zero_points != kNoStorage)
      FUZZ_REQUIRE(t.q_zero_points < tensors.size(), tag + ": q_zero_points index out of range");
    FUZZ_REQUIRE(t.python_state == kNoNode || t.python_state < arena.size(), tag + ": python_state outside the arena");
    held += sizeof(TensorInfo) + (t.shape.size() + t.stride.size()) * 8 + t.sparse_parts.size() * 4 + t.device.size();
  }

  for (std::size_t i = 0; i < arena.size(); ++i) {
    const Node& n = arena[static_cast<NodeId>(i)];
    if (n.kind == Kind::kTensor)
      FUZZ_REQUIRE(n.i >= 0 && static_cast<std::uint64_t>(n.i) < tensors.size(),
                   "kTensor node " + std::to_string(i) + " names tensor " + std::to_string(n.i));
    if (n.kind == Kind::kStorage)
      FUZZ_REQUIRE(n.i >= 0 && static_cast<std::uint64_t>(n.i) < storages.size(),
                   "kStorage node " + std::to_string(i) + " names storage " + std::to_string(n.i));
    if (n.kind == Kind::kDtype)
      FUZZ_REQUIRE(n.i >= 0 && n.i < static_cast<std::int64_t>(DType::kCount_), "kDtype node with an invalid dtype");
  }
  return held;
}

// Row-major gather of a strided tensor's elements straight from its storage
// (the reference for Checkpoint::contiguous_bytes). Caller checked the view.
inline std::vector<std::uint8_t> reference_contiguous(const TensorInfo& t, const StorageInfo& s) {
  const std::uint64_t es = dtype_size(t.dtype);
  const std::uint64_t n = t.numel();
  std::vector<std::uint8_t> out(n * es);
  if (n == 0) return out;
  std::vector<std::int64_t> idx(t.shape.size(), 0);
  for (std::uint64_t k = 0; k < n; ++k) {
    std::uint64_t off = static_cast<std::uint64_t>(t.storage_offset);
    for (std::size_t d = 0; d < idx.size(); ++d) off += static_cast<std::uint64_t>(idx[d] * t.stride[d]);
    for (std::uint64_t b = 0; b < es; ++b) out[k * es + b] = s.bytes[off * es + b];
    for (std::size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace safeckpt::fuzz
