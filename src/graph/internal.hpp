// Internal helpers shared by src/graph/*.cpp (not installed).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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
// dtype and sizes of one tensor value after the shape pass; `defined` false
// for values no node produced (unnamed outputs).
struct ValueShape {
  bool defined = false;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> sizes;
};

// The interpreter's shape pass (run_impl in meta mode: every kernel's shape
// logic, each result checked against its recorded tensor_meta) with inputs
// and weights sized from their recorded meta evaluated at `symbols`; returns
// every tensor value's dtype and sizes. Errors as check_shapes, plus
// kInvalidArgument for a size that the symbols cannot evaluate, an input
// outside range_constraints, and a program not validated.
Result<std::vector<ValueShape>> shape_pass(const Program& program,
                                           const std::unordered_map<std::string, std::int64_t>& symbols,
                                           const GraphLimits& limits);

// Binds symbols from user input shapes with run_cpu's input checks (rank,
// static dims, one value per symbol, range_constraints, expression dims).
// Errors: kInvalidArgument naming input, dim and value.
Result<std::unordered_map<std::string, std::int64_t>> bind_user_shapes(
    const Program& program, const std::map<std::string, std::vector<std::int64_t>>& shapes, const GraphLimits& limits);

// The symbol name when `expr` is exactly Symbol('name', ...), else "".
std::string single_symbol(std::string_view expr);

}  // namespace safeckpt::graph::detail
