// Internals shared by the safetensors reader, writer and converter.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/builder.hpp"
#include "safeckpt/safetensors_reader.hpp"

namespace safeckpt {

// Position of a dtype in the reference's Dtype enum (-1 if unknown).
int safetensors_dtype_rank(std::string_view name) noexcept;
// The order keys appear in the text, which nlohmann::json (a sorted map, so
// that a header of a million names parses in n log n: ordered_json's
// vector map made it quadratic, 21 s for 100,000 entries; review
// 2026-12-06) does not keep: the root object's keys, and for each of its
// object members, that member's keys.
struct JsonKeyOrder {
  std::vector<std::string> root;
  std::map<std::string, std::vector<std::string>, std::less<>> members;
};
// JSON with duplicate keys and nesting deeper than max_depth refused.
Result<nlohmann::json> parse_strict_json(std::string_view text, std::size_t max_depth, std::string_view what,
                                         JsonKeyOrder* order = nullptr);
// Adds one safetensors tensor (zero-copy) to `b`; `out` = its kTensor node.
Status add_safetensors_tensor(CheckpointBuilder& b, const SafetensorsTensor& t, NodeId& out);

}  // namespace safeckpt
