// aten::view's restriding rule, shared by the graph layer's planner and CPU
// interpreter and by the engine's lowering (src/engine/plan.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace safeckpt::graph::detail {

// Strides of `new_sizes` viewing a tensor of `sizes`/`strides` without a
// copy, or nullopt when the strides do not allow it (PyTorch's computeStride,
// aten/src/ATen/TensorUtils.cpp: each run of dims that is contiguous in
// memory may be regrouped; a view may not merge dims across a gap). No
// elements: contiguous strides. `sizes` and `new_sizes` hold the same number
// of elements (the caller's tensor_meta says so).
std::optional<std::vector<std::int64_t>> view_strides(const std::vector<std::int64_t>& sizes,
                                                      const std::vector<std::int64_t>& strides,
                                                      const std::vector<std::int64_t>& new_sizes);

}  // namespace safeckpt::graph::detail
