// Internal helpers shared by src/graph/*.cpp (not installed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>

#include "safeckpt/graph.hpp"

namespace safeckpt::graph::detail {

// Parses JSON text with the GraphLimits caps on bytes and nesting depth.
// Never throws. Errors: kLimitExceeded, kMalformed (what, where).
Result<nlohmann::json> parse_json(std::string_view text, std::string_view what, const GraphLimits& limits);

// PyTorch serde ScalarType number -> DType (schema.yaml ScalarType).
Result<DType> dtype_from_scalar_type(std::int64_t code, std::string_view where);
// DType -> serde ScalarType number (0 if none).
std::int64_t scalar_type_of(DType d);

// TensorMeta from its JSON; symbolic sizes become anonymous SymValues in
// `program` (deduplicated by expression text). `program` may be null for
// configs (then symbolic sizes are refused).
Result<TensorMeta> parse_tensor_meta(const nlohmann::json& j, std::string_view where, Program* program,
                                     std::unordered_map<std::string, std::int32_t>* expr_ids,
                                     const GraphLimits& limits);

// SymExpr's recorded example value (hint.as_int), if any.
std::optional<std::int64_t> hint_of(const nlohmann::json& as_expr);

// Evaluates a SymPy srepr expression over bound symbols: Symbol('name', ...),
// Integer(n), Mul(...), Add(...), FloorDiv(a, b) (sympy's torch
// FloorDiv), Mod, Max, Min. Iterative (explicit stack). Overflow and
// unknown symbols/functions are errors (kUnsupported for unknown functions).
Result<std::int64_t> eval_srepr(std::string_view expr, const std::unordered_map<std::string, std::int64_t>& symbols,
                                const GraphLimits& limits);
// The symbol name when `expr` is exactly Symbol('name', ...), else "".
std::string single_symbol(std::string_view expr);

}  // namespace safeckpt::graph::detail
