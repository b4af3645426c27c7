// Internals shared by the safetensors reader, writer and converter.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

#include "safeckpt/builder.hpp"
#include "safeckpt/safetensors_reader.hpp"

namespace safeckpt {

// Position of a dtype in the reference's Dtype enum (-1 if unknown).
int safetensors_dtype_rank(std::string_view name) noexcept;
// JSON with duplicate keys and nesting deeper than max_depth refused.
Result<nlohmann::ordered_json> parse_strict_json(std::string_view text, std::size_t max_depth, std::string_view what);
// Adds one safetensors tensor (zero-copy) to `b`; `out` = its kTensor node.
Status add_safetensors_tensor(CheckpointBuilder& b, const SafetensorsTensor& t, NodeId& out);

}  // namespace safeckpt
