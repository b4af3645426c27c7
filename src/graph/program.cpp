// ExportedProgram JSON (schema 8.x, torch 2.11 torch/_export/serde/schema.yaml)
// -> the typed IR of safeckpt/graph.hpp. The grammar accepted is listed in
// that header; decoding rules follow serialize.py (_dict_to_dataclass):
// unions are objects with exactly one key, floats may be the strings
// "Infinity"/"-Infinity"/"NaN", unknown struct keys are ignored.
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <new>

#include "graph/internal.hpp"
#include "safeckpt/hash.hpp"

namespace safeckpt::graph {
namespace detail {

using nlohmann::json;

Result<json> parse_json(std::string_view text, std::string_view what, const GraphLimits& limits) {
  if (text.size() > limits.max_json_bytes)
    return make_error(ErrorCode::kLimitExceeded, std::string(what) + ": " + std::to_string(text.size()) +
                                                     " bytes exceed GraphLimits::max_json_bytes (" +
                                                     std::to_string(limits.max_json_bytes) + ")");
  bool too_deep = false;
  // nlohmann's SAX parser is iterative; the callback sees every value's depth
  // and discards everything once the cap is passed (memory stays bounded).
  json::parser_callback_t cb = [&](int depth, json::parse_event_t, json&) {
    if (static_cast<std::uint64_t>(depth) > limits.max_json_depth) too_deep = true;
    return !too_deep;
  };
  try {
    json j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
    if (too_deep)
      return make_error(ErrorCode::kLimitExceeded, std::string(what) +
                                                       ": nesting deeper than GraphLimits::max_json_depth (" +
                                                       std::to_string(limits.max_json_depth) + ")");
    if (j.is_discarded()) return make_error(ErrorCode::kMalformed, std::string(what) + ": not valid JSON");
    return j;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, std::string(what) + ": out of memory parsing JSON");
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kMalformed, std::string(what) + ": not valid JSON (" + e.what() + ")");
  }
}

Result<DType> dtype_from_scalar_type(std::int64_t code, std::string_view where) {
  switch (code) {
    case 1: return DType::kUInt8;
    case 2: return DType::kInt8;
    case 3: return DType::kInt16;
    case 4: return DType::kInt32;
    case 5: return DType::kInt64;
    case 6: return DType::kFloat16;
    case 7: return DType::kFloat32;
    case 8: return DType::kFloat64;
    case 9: return DType::kComplex32;
    case 10: return DType::kComplex64;
    case 11: return DType::kComplex128;
    case 12: return DType::kBool;
    case 13: return DType::kBFloat16;
    case 28: return DType::kUInt16;
    case 29: return DType::kFloat8_e4m3fn;
    case 30: return DType::kFloat8_e5m2;
    case 31: return DType::kFloat8_e4m3fnuz;
    case 32: return DType::kFloat8_e5m2fnuz;
    default: break;
  }
  return make_error(ErrorCode::kMalformed,
                    std::string(where) + ": unknown ScalarType " + std::to_string(code) + " (schema.yaml ScalarType)");
}

std::int64_t scalar_type_of(DType d) {
  for (std::int64_t c : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 28, 29, 30, 31, 32}) {
    auto r = dtype_from_scalar_type(c, "");
    if (r && *r == d) return c;
  }
  return 0;
}

namespace {

Unexpected malformed(std::string_view where, std::string what) {
  return make_error(ErrorCode::kMalformed, std::string(where) + ": " + what);
}

Result<const json*> field(const json& obj, const char* key, std::string_view where) {
  if (!obj.is_object()) return malformed(where, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return malformed(where, std::string("missing field '") + key + "'");
  return &*it;
}

Result<std::int64_t> get_int(const json& j, std::string_view where) {
  if (j.is_number_integer()) return j.get<std::int64_t>();
  if (j.is_number_unsigned()) {
    auto u = j.get<std::uint64_t>();
    if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return static_cast<std::int64_t>(u);
  }
  return malformed(where, "expected an integer");
}

Result<std::string> get_string(const json& j, std::string_view where) {
  if (!j.is_string()) return malformed(where, "expected a string");
  return j.get<std::string>();
}

// A union: exactly one key. Returns (member, value).
Result<std::pair<std::string, const json*>> union_member(const json& j, std::string_view where) {
  if (!j.is_object() || j.size() != 1)
    return malformed(where, "a union must be an object with exactly one key (serialize.py _Union)");
  auto it = j.begin();
  return std::make_pair(it.key(), &it.value());
}

}  // namespace

// SymExpr.hint = SymExprHint{as_int}: the example value; absent or another
// member -> none (a hint is only used by the shape pass).
std::optional<std::int64_t> hint_of(const json& as_expr) {
  auto h = as_expr.find("hint");
  if (h == as_expr.end() || !h->is_object() || h->size() != 1) return std::nullopt;
  auto i = h->find("as_int");
  if (i == h->end() || !i->is_number_integer()) return std::nullopt;
  return i->get<std::int64_t>();
}

Result<TensorMeta> parse_tensor_meta(const json& j, std::string_view where, Program* program,
                                     std::unordered_map<std::string, std::int32_t>* expr_ids,
                                     const GraphLimits& limits) {
  TensorMeta m;
  std::string w(where);
  SAFECKPT_TRY(const json* dt, field(j, "dtype", w));
  SAFECKPT_TRY(std::int64_t code, get_int(*dt, w + ".dtype"));
  SAFECKPT_TRY(m.dtype, dtype_from_scalar_type(code, w + ".dtype"));
  SAFECKPT_TRY(const json* lay, field(j, "layout", w));
  SAFECKPT_TRY(std::int64_t layout, get_int(*lay, w + ".layout"));
  if (layout != 7)
    return make_error(ErrorCode::kUnsupported,
                      w + ".layout: layout " + std::to_string(layout) + " is not strided (7); only dense tensors run");
  if (auto it = j.find("requires_grad"); it != j.end() && it->is_boolean()) m.requires_grad = it->get<bool>();
  if (auto it = j.find("device"); it != j.end() && it->is_object()) {
    if (auto t = it->find("type"); t != it->end() && t->is_string()) m.device = t->get<std::string>();
    if (auto ix = it->find("index"); ix != it->end() && ix->is_number_integer())
      m.device += ":" + std::to_string(ix->get<std::int64_t>());
  }
  auto sym = [&](const json& s, const std::string& sw) -> Result<SymInt> {
    SAFECKPT_TRY(auto um, union_member(s, sw));
    if (um.first == "as_int") {
      SAFECKPT_TRY(std::int64_t v, get_int(*um.second, sw + ".as_int"));
      return SymInt{v, -1};
    }
    if (um.first != "as_expr") return malformed(sw, "unknown SymInt member '" + um.first + "'");
    if (program == nullptr || expr_ids == nullptr)
      return make_error(ErrorCode::kUnsupported, sw + ": symbolic size where only static sizes are allowed");
    SAFECKPT_TRY(const json* e, field(*um.second, "expr_str", sw + ".as_expr"));
    SAFECKPT_TRY(std::string expr, get_string(*e, sw + ".as_expr.expr_str"));
    if (expr.size() > limits.max_expr_bytes)
      return make_error(ErrorCode::kLimitExceeded, sw + ": expression longer than GraphLimits::max_expr_bytes");
    auto [it, fresh] = expr_ids->try_emplace(expr, static_cast<std::int32_t>(program->sym_values.size()));
    if (fresh) {
      if (program->sym_values.size() >= limits.max_values)
        return make_error(ErrorCode::kLimitExceeded, sw + ": more symbolic values than GraphLimits::max_values");
      program->sym_values.push_back(SymValue{"", expr, hint_of(*um.second)});
    }
    return SymInt{0, it->second};
  };
  auto list = [&](const char* key, std::vector<SymInt>* out) -> Status {
    SAFECKPT_TRY(const json* l, field(j, key, w));
    if (!l->is_array()) return malformed(w + "." + key, "expected a list");
    if (l->size() > limits.max_rank)
      return make_error(ErrorCode::kLimitExceeded,
                        w + "." + key + ": rank " + std::to_string(l->size()) + " exceeds GraphLimits::max_rank");
    for (std::size_t i = 0; i < l->size(); ++i) {
      SAFECKPT_TRY(SymInt s, sym((*l)[i], w + "." + key + "[" + std::to_string(i) + "]"));
      if (!s.is_symbolic() && s.value < 0) return malformed(w + "." + key, "negative size or stride");
      out->push_back(s);
    }
    return {};
  };
  SAFECKPT_CHECK(list("sizes", &m.sizes));
  SAFECKPT_CHECK(list("strides", &m.strides));
  if (m.strides.size() != m.sizes.size()) return malformed(w, "sizes and strides differ in length");
  SAFECKPT_TRY(const json* so, field(j, "storage_offset", w));
  SAFECKPT_TRY(m.storage_offset, sym(*so, w + ".storage_offset"));
  if (!m.storage_offset.is_symbolic() && m.storage_offset.value < 0) return malformed(w, "negative storage_offset");
  return m;
}

std::string single_symbol(std::string_view e) {
  constexpr std::string_view kHead = "Symbol('";
  if (e.substr(0, kHead.size()) != kHead) return {};
  auto q = e.find('\'', kHead.size());
  if (q == std::string_view::npos || e.back() != ')') return {};
  // Only the keyword flags may follow the name (no nested calls).
  if (e.find('(', kHead.size()) != std::string_view::npos) return {};
  return std::string(e.substr(kHead.size(), q - kHead.size()));
}

Result<std::int64_t> eval_srepr(std::string_view e, const std::unordered_map<std::string, std::int64_t>& symbols,
                                const GraphLimits& limits) {
  if (e.size() > limits.max_expr_bytes)
    return make_error(ErrorCode::kLimitExceeded, "expression longer than GraphLimits::max_expr_bytes");
  struct Frame {
    std::string fn;
    std::vector<std::int64_t> args;
    std::string sym;  // Symbol's name
  };
  std::vector<Frame> stack;
  std::vector<std::int64_t> top;  // values at depth 0
  auto bad = [&](std::string why) {
    return make_error(ErrorCode::kUnsupported, "symbolic expression '" + std::string(e) + "': " + why);
  };
  auto push_value = [&](std::int64_t v) {
    if (stack.empty())
      top.push_back(v);
    else
      stack.back().args.push_back(v);
  };
  std::size_t i = 0;
  while (i < e.size()) {
    char c = e[i];
    if (c == ' ' || c == ',') {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < e.size() && (std::isalnum(static_cast<unsigned char>(e[j])) || e[j] == '_')) ++j;
      std::string name(e.substr(i, j - i));
      if (j < e.size() && e[j] == '(') {
        if (stack.size() >= 64) return bad("nested too deeply");
        stack.push_back(Frame{name, {}, {}});
        i = j + 1;
      } else if (j < e.size() && e[j] == '=') {
        // keyword flag (positive=True, integer=True): skip `name=Value`
        std::size_t k = j + 1;
        while (k < e.size() && e[k] != ',' && e[k] != ')') ++k;
        i = k;
      } else {
        return bad("unexpected name '" + name + "'");
      }
    } else if (c == '\'') {
      auto q = e.find('\'', i + 1);
      if (q == std::string_view::npos || stack.empty()) return bad("bad string");
      stack.back().sym = std::string(e.substr(i + 1, q - i - 1));
      i = q + 1;
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i + 1;
      while (j < e.size() && std::isdigit(static_cast<unsigned char>(e[j]))) ++j;
      std::int64_t v = 0;
      auto r = std::from_chars(e.data() + i, e.data() + j, v);
      if (r.ec != std::errc()) return bad("bad integer");
      push_value(v);
      i = j;
    } else if (c == ')') {
      if (stack.empty()) return bad("unbalanced ')'");
      Frame f = std::move(stack.back());
      stack.pop_back();
      std::int64_t v = 0;
      if (f.fn == "Symbol") {
        auto it = symbols.find(f.sym);
        if (it == symbols.end()) return bad("symbol '" + f.sym + "' is not bound");
        v = it->second;
      } else if (f.fn == "Integer") {
        if (f.args.size() != 1) return bad("Integer takes one value");
        v = f.args[0];
      } else if (f.fn == "Mul" || f.fn == "Add") {
        if (f.args.empty()) return bad(f.fn + " without arguments");
        v = f.fn == "Mul" ? 1 : 0;
        for (auto a : f.args) {
          bool ovf = f.fn == "Mul" ? __builtin_mul_overflow(v, a, &v) : __builtin_add_overflow(v, a, &v);
          if (ovf)
            return make_error(ErrorCode::kLimitExceeded, "symbolic expression '" + std::string(e) + "' overflows");
        }
      } else if (f.fn == "FloorDiv" || f.fn == "Mod") {
        if (f.args.size() != 2 || f.args[1] == 0) return bad(f.fn + " needs two arguments, divisor non-zero");
        std::int64_t a = f.args[0], b = f.args[1];
        if (a == std::numeric_limits<std::int64_t>::min() && b == -1) return bad("overflow");
        std::int64_t q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
        v = f.fn == "FloorDiv" ? q : a - q * b;
      } else if (f.fn == "Pow") {
        // Pow(base, Integer(n)), n in [0, 64] (strides of dynamic programs: s^2).
        if (f.args.size() != 2 || f.args[1] < 0 || f.args[1] > 64) return bad("Pow needs an exponent in [0, 64]");
        v = 1;
        for (std::int64_t k = 0; k < f.args[1]; ++k)
          if (__builtin_mul_overflow(v, f.args[0], &v))
            return make_error(ErrorCode::kLimitExceeded, "symbolic expression '" + std::string(e) + "' overflows");
      } else if (f.fn == "Max" || f.fn == "Min") {
        if (f.args.empty()) return bad(f.fn + " without arguments");
        v = f.args[0];
        for (auto a : f.args) v = f.fn == "Max" ? std::max(v, a) : std::min(v, a);
      } else {
        return bad("function '" + f.fn + "' is not understood");
      }
      push_value(v);
      ++i;
    } else {
      return bad(std::string("unexpected character '") + c + "'");
    }
  }
  if (!stack.empty() || top.size() != 1) return bad("not one complete expression");
  return top[0];
}

}  // namespace detail

using detail::field;  // the JSON field helpers above, one copy
using detail::get_int;
using detail::get_string;
using detail::malformed;
using detail::parse_json;
using nlohmann::json;

namespace {

Result<double> get_float(const json& j, std::string_view where) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  }
  return malformed(where, "expected a float (number, \"Infinity\", \"-Infinity\" or \"NaN\")");
}
Result<std::pair<std::string, const json*>> union_member(const json& j, std::string_view where) {
  if (!j.is_object() || j.size() != 1)
    return malformed(where, "a union must be an object with exactly one key (serialize.py _Union)");
  auto it = j.begin();
  return std::make_pair(it.key(), &it.value());
}

class Parser {
 public:
  Parser(Program& p, const GraphLimits& l) : p_(p), lim_(l) {}

  Status run(const json& root) {
    SAFECKPT_TRY(const json* sv, field(root, "schema_version", "program"));
    SAFECKPT_TRY(const json* major, field(*sv, "major", "schema_version"));
    SAFECKPT_TRY(p_.schema_major, get_int(*major, "schema_version.major"));
    if (auto mi = sv->find("minor"); mi != sv->end() && mi->is_number_integer())
      p_.schema_minor = mi->get<std::int64_t>();
    if (p_.schema_major != 8)
      return make_error(
          ErrorCode::kUnsupported,
          "schema_version.major is " + std::to_string(p_.schema_major) +
              "; this reader implements schema 8.x (torch 2.6-2.11): re-export with a torch of that range");
    if (auto tv = root.find("torch_version"); tv != root.end() && tv->is_string())
      p_.torch_version = tv->get<std::string>();
    if (auto vr = root.find("verifiers"); vr != root.end()) {
      if (!vr->is_array()) return malformed("verifiers", "expected a list");
      for (const auto& v : *vr)
        // "ATEN" (core IR) or "TRAINING" (the default export IR since 2.6,
        // pt2-format.md §1.4); other dialects (EDGE, ...) are not ATen programs.
        if (!v.is_string() || (v.get<std::string>() != "ATEN" && v.get<std::string>() != "TRAINING"))
          p_.refusals.push_back("verifiers: dialect " + v.dump() + " is not ATEN or TRAINING: only ATen programs run");
    }
    SAFECKPT_TRY(const json* rc, field(root, "range_constraints", "program"));
    if (!rc->is_object()) return malformed("range_constraints", "expected an object");
    if (rc->size() > lim_.max_symbols)
      return make_error(ErrorCode::kLimitExceeded, "range_constraints: more than GraphLimits::max_symbols");
    for (auto it = rc->begin(); it != rc->end(); ++it) {
      std::string w = "range_constraints." + it.key();
      std::optional<std::int64_t> lo, hi;
      SAFECKPT_TRY(const json* mn, field(it.value(), "min_val", w));
      SAFECKPT_TRY(const json* mx, field(it.value(), "max_val", w));
      if (!mn->is_null()) {
        SAFECKPT_TRY(lo, get_int(*mn, w + ".min_val"));
      }
      if (!mx->is_null()) {
        SAFECKPT_TRY(hi, get_int(*mx, w + ".max_val"));
      }
      p_.range_constraints[it.key()] = {lo, hi};
    }
    SAFECKPT_TRY(const json* gm, field(root, "graph_module", "program"));
    SAFECKPT_TRY(const json* g, field(*gm, "graph", "graph_module"));
    SAFECKPT_CHECK(values(*g));
    SAFECKPT_CHECK(nodes(*g));
    SAFECKPT_TRY(const json* sig, field(*gm, "signature", "graph_module"));
    SAFECKPT_CHECK(signature(*sig, *g));
    return {};
  }

 private:
  Status values(const json& g) {
    SAFECKPT_TRY(const json* tv, field(g, "tensor_values", "graph"));
    if (!tv->is_object()) return malformed("graph.tensor_values", "expected an object");
    if (tv->size() > lim_.max_values)
      return make_error(ErrorCode::kLimitExceeded, "graph.tensor_values: " + std::to_string(tv->size()) +
                                                       " entries exceed GraphLimits::max_values");
    for (auto it = tv->begin(); it != tv->end(); ++it) {
      SAFECKPT_TRY(TensorMeta m,
                   detail::parse_tensor_meta(it.value(), "tensor_values." + it.key(), &p_, &exprs_, lim_));
      ids_.emplace(it.key(), static_cast<std::int32_t>(p_.values.size()));
      p_.value_names.push_back(it.key());
      p_.values.push_back(std::move(m));
    }
    SAFECKPT_TRY(const json* sv, field(g, "sym_int_values", "graph"));
    if (!sv->is_object()) return malformed("graph.sym_int_values", "expected an object");
    if (sv->size() > lim_.max_values)
      return make_error(ErrorCode::kLimitExceeded, "graph.sym_int_values: exceed GraphLimits::max_values");
    for (auto it = sv->begin(); it != sv->end(); ++it) {
      std::string w = "sym_int_values." + it.key();
      SAFECKPT_TRY(auto um, union_member(it.value(), w));
      SymValue s;
      s.name = it.key();
      if (um.first == "as_expr") {
        SAFECKPT_TRY(const json* e, field(*um.second, "expr_str", w));
        SAFECKPT_TRY(s.expr, get_string(*e, w + ".expr_str"));
        s.hint = detail::hint_of(*um.second);
        if (s.expr.size() > lim_.max_expr_bytes)
          return make_error(ErrorCode::kLimitExceeded, w + ": expression longer than GraphLimits::max_expr_bytes");
      } else if (um.first == "as_int") {
        SAFECKPT_TRY(std::int64_t v, get_int(*um.second, w));
        s.expr = "Integer(" + std::to_string(v) + ")";
      } else {
        return malformed(w, "unknown SymInt member '" + um.first + "'");
      }
      if (p_.sym_values.size() >= lim_.max_values)
        return make_error(ErrorCode::kLimitExceeded, w + ": more symbolic values than GraphLimits::max_values");
      sym_ids_.emplace(it.key(), static_cast<std::int32_t>(p_.sym_values.size()));
      p_.sym_values.push_back(std::move(s));
    }
    for (const char* k : {"sym_bool_values", "sym_float_values", "custom_obj_values"}) {
      auto it = g.find(k);
      if (it != g.end() && !(it->is_object() && it->empty()))
        p_.refusals.push_back(std::string("graph.") + k +
                              " is not empty: symbolic bools/floats and custom objects "
                              "are not supported");
    }
    return {};
  }

  Result<std::int32_t> tensor_ref(const json& j, const std::string& w) {
    SAFECKPT_TRY(const json* n, field(j, "name", w));
    SAFECKPT_TRY(std::string name, get_string(*n, w + ".name"));
    auto it = ids_.find(name);
    if (it == ids_.end()) return malformed(w, "names tensor '" + name + "', which has no tensor_values entry");
    return it->second;
  }

  Result<SymInt> sym_arg(const json& j, const std::string& w) {
    SAFECKPT_TRY(auto um, union_member(j, w));
    if (um.first == "as_int") {
      SAFECKPT_TRY(std::int64_t v, get_int(*um.second, w));
      return SymInt{v, -1};
    }
    if (um.first == "as_name") {
      SAFECKPT_TRY(std::string name, get_string(*um.second, w));
      auto it = sym_ids_.find(name);
      if (it == sym_ids_.end()) return malformed(w, "names SymInt '" + name + "', which has no sym_int_values entry");
      return SymInt{0, it->second};
    }
    return malformed(w, "unknown SymIntArgument member '" + um.first + "'");
  }

  Result<Arg> argument(const json& j, const std::string& w) {
    SAFECKPT_TRY(auto um, union_member(j, w));
    const std::string& m = um.first;
    const json& v = *um.second;
    Arg a;
    auto list_of = [&](const json& l) -> Status {
      if (!l.is_array()) return malformed(w + "." + m, "expected a list");
      if (l.size() > lim_.max_list_items)
        return make_error(ErrorCode::kLimitExceeded, w + "." + m + ": more than GraphLimits::max_list_items items");
      return {};
    };
    if (m == "as_none") {
      a.kind = Arg::Kind::kNone;
    } else if (m == "as_tensor") {
      a.kind = Arg::Kind::kTensor;
      SAFECKPT_TRY(a.tensor, tensor_ref(v, w + ".as_tensor"));
    } else if (m == "as_tensors" || m == "as_optional_tensors") {
      SAFECKPT_CHECK(list_of(v));
      a.kind = Arg::Kind::kTensors;
      for (std::size_t i = 0; i < v.size(); ++i) {
        std::string iw = w + "." + m + "[" + std::to_string(i) + "]";
        if (m == "as_tensors") {
          SAFECKPT_TRY(std::int32_t t, tensor_ref(v[i], iw));
          a.tensors.push_back(t);
        } else {
          SAFECKPT_TRY(auto im, union_member(v[i], iw));
          if (im.first == "as_none") {
            a.tensors.push_back(-1);
          } else if (im.first == "as_tensor") {
            SAFECKPT_TRY(std::int32_t t, tensor_ref(*im.second, iw));
            a.tensors.push_back(t);
          } else {
            return malformed(iw, "unknown OptionalTensorArgument member '" + im.first + "'");
          }
        }
      }
    } else if (m == "as_int") {
      a.kind = Arg::Kind::kInt;
      SAFECKPT_TRY(std::int64_t x, get_int(v, w + ".as_int"));
      a.ints = {SymInt{x, -1}};
    } else if (m == "as_ints") {
      SAFECKPT_CHECK(list_of(v));
      a.kind = Arg::Kind::kInts;
      for (const auto& x : v) {
        SAFECKPT_TRY(std::int64_t i, get_int(x, w + ".as_ints"));
        a.ints.push_back(SymInt{i, -1});
      }
    } else if (m == "as_sym_int") {
      a.kind = Arg::Kind::kInt;
      SAFECKPT_TRY(SymInt s, sym_arg(v, w + ".as_sym_int"));
      a.ints = {s};
    } else if (m == "as_sym_ints") {
      SAFECKPT_CHECK(list_of(v));
      a.kind = Arg::Kind::kInts;
      for (const auto& x : v) {
        SAFECKPT_TRY(SymInt s, sym_arg(x, w + ".as_sym_ints"));
        a.ints.push_back(s);
      }
    } else if (m == "as_float") {
      a.kind = Arg::Kind::kFloat;
      SAFECKPT_TRY(a.f, get_float(v, w + ".as_float"));
    } else if (m == "as_floats") {
      SAFECKPT_CHECK(list_of(v));
      a.kind = Arg::Kind::kFloats;
      for (const auto& x : v) {
        SAFECKPT_TRY(double f, get_float(x, w + ".as_floats"));
        a.floats.push_back(f);
      }
    } else if (m == "as_bool") {
      if (!v.is_boolean()) return malformed(w + ".as_bool", "expected a boolean");
      a.kind = Arg::Kind::kBool;
      a.b = v.get<bool>();
    } else if (m == "as_bools") {
      SAFECKPT_CHECK(list_of(v));
      a.kind = Arg::Kind::kBools;
      for (const auto& x : v) {
        if (!x.is_boolean()) return malformed(w + ".as_bools", "expected booleans");
        a.bools.push_back(x.get<bool>());
      }
    } else if (m == "as_string") {
      a.kind = Arg::Kind::kString;
      SAFECKPT_TRY(a.s, get_string(v, w + ".as_string"));
    } else if (m == "as_scalar_type") {
      a.kind = Arg::Kind::kScalarType;
      SAFECKPT_TRY(std::int64_t c, get_int(v, w + ".as_scalar_type"));
      SAFECKPT_TRY(a.dtype, detail::dtype_from_scalar_type(c, w + ".as_scalar_type"));
    } else if (m == "as_layout" || m == "as_memory_format") {
      a.kind = m == "as_layout" ? Arg::Kind::kLayout : Arg::Kind::kMemoryFormat;
      SAFECKPT_TRY(a.code, get_int(v, w + "." + m));
    } else if (m == "as_device") {
      a.kind = Arg::Kind::kDevice;
      SAFECKPT_TRY(const json* t, field(v, "type", w + ".as_device"));
      SAFECKPT_TRY(a.s, get_string(*t, w + ".as_device.type"));
      if (auto ix = v.find("index"); ix != v.end() && !ix->is_null()) {
        SAFECKPT_TRY(std::int64_t i, get_int(*ix, w + ".as_device.index"));
        a.s += ":" + std::to_string(i);
      }
    } else if (m == "as_graph" || m == "as_custom_obj" || m == "as_operator" || m == "as_sym_bool" ||
               m == "as_sym_bools" || m == "as_sym_float" || m == "as_sym_floats" || m == "as_optional_tensor" ||
               m == "as_complex" || m == "as_nested_tensors" || m == "as_int_lists" || m == "as_string_to_argument" ||
               m == "as_strings") {
      // Known Argument members (schema.yaml 8.17) the engine does not run.
      a.kind = Arg::Kind::kNone;
      unsupported_.push_back(w + " is '" + m + "'" +
                             (m == "as_graph" ? " (a subgraph: higher-order ops are not run)" : " (not supported)"));
    } else {
      return malformed(w, "unknown Argument member '" + m + "' (schema.yaml 8.17 lists 30)");
    }
    return a;
  }

  Status nodes(const json& g) {
    SAFECKPT_TRY(const json* ns, field(g, "nodes", "graph"));
    if (!ns->is_array()) return malformed("graph.nodes", "expected a list");
    if (ns->size() > lim_.max_nodes)
      return make_error(ErrorCode::kLimitExceeded,
                        "graph.nodes: " + std::to_string(ns->size()) + " nodes exceed GraphLimits::max_nodes");
    p_.nodes.reserve(ns->size());
    for (std::size_t k = 0; k < ns->size(); ++k) {
      const json& nj = (*ns)[k];
      Node n;
      std::string w = "node #" + std::to_string(k);
      if (auto nm = nj.find("name"); nm != nj.end() && nm->is_string()) n.name = nm->get<std::string>();
      if (!n.name.empty()) w = "node '" + n.name + "'";
      SAFECKPT_TRY(const json* t, field(nj, "target", w));
      SAFECKPT_TRY(n.target, get_string(*t, w + ".target"));
      n.op = schema_name_for_target(n.target);
      SAFECKPT_TRY(const json* in, field(nj, "inputs", w));
      if (!in->is_array()) return malformed(w + ".inputs", "expected a list");
      if (in->size() > lim_.max_args)
        return make_error(ErrorCode::kLimitExceeded, w + ": more than GraphLimits::max_args arguments");
      for (const auto& ia : *in) {
        SAFECKPT_TRY(const json* an, field(ia, "name", w + ".inputs"));
        SAFECKPT_TRY(std::string aname, get_string(*an, w + ".inputs.name"));
        SAFECKPT_TRY(const json* av, field(ia, "arg", w + ".inputs"));
        unsupported_.clear();
        SAFECKPT_TRY(Arg a, argument(*av, w + " argument '" + aname + "'"));
        for (auto& u : unsupported_) p_.refusals.push_back(u);
        n.arg_names.push_back(std::move(aname));
        n.args.push_back(std::move(a));
      }
      SAFECKPT_TRY(const json* out, field(nj, "outputs", w));
      if (!out->is_array()) return malformed(w + ".outputs", "expected a list");
      if (out->size() > lim_.max_args)
        return make_error(ErrorCode::kLimitExceeded, w + ": more than GraphLimits::max_args outputs");
      for (std::size_t i = 0; i < out->size(); ++i) {
        std::string ow = w + " output " + std::to_string(i);
        SAFECKPT_TRY(auto um, union_member((*out)[i], ow));
        if (um.first == "as_tensor") {
          SAFECKPT_TRY(std::int32_t id, tensor_ref(*um.second, ow));
          n.outputs.push_back(id);
        } else if (um.first == "as_tensors") {
          if (!um.second->is_array() || out->size() != 1) return malformed(ow, "as_tensors must be the only output");
          if (um.second->size() > lim_.max_list_items)
            return make_error(ErrorCode::kLimitExceeded, ow + ": more than GraphLimits::max_list_items outputs");
          n.outputs_as_list = true;
          for (const auto& x : *um.second) {
            SAFECKPT_TRY(std::int32_t id, tensor_ref(x, ow));
            n.outputs.push_back(id);
          }
        } else if (um.first == "as_sym_int") {
          SAFECKPT_TRY(SymInt s, sym_arg(*um.second, ow));
          if (!s.is_symbolic()) return malformed(ow, "a SymInt output must name a value");
          if (out->size() == 1) {
            n.sym_output = s.sym;
          } else {
            // One position of a tuple return (serialize.py serialize_outputs:
            // an int/SymInt meta value becomes as_sym_int naming a
            // sym_int_values entry, between the tensor and None positions).
            n.output_syms.resize(out->size(), -1);
            n.output_syms[i] = s.sym;
            n.outputs.push_back(-1);
          }
        } else if (um.first == "as_none") {
          n.outputs.push_back(-1);
        } else {
          p_.refusals.push_back(ow + " is '" + um.first + "' (not supported)");
        }
      }
      p_.nodes.push_back(std::move(n));
    }
    return {};
  }

  Status signature(const json& sig, const json& g) {
    SAFECKPT_TRY(const json* is, field(sig, "input_specs", "signature"));
    if (!is->is_array()) return malformed("signature.input_specs", "expected a list");
    if (is->size() > lim_.max_inputs)
      return make_error(ErrorCode::kLimitExceeded, "signature.input_specs: more than GraphLimits::max_inputs");
    for (std::size_t i = 0; i < is->size(); ++i) {
      std::string w = "signature.input_specs[" + std::to_string(i) + "]";
      SAFECKPT_TRY(auto um, union_member((*is)[i], w));
      const json& v = *um.second;
      GraphInput in;
      SAFECKPT_TRY(const json* arg, field(v, "arg", w + "." + um.first));
      if (um.first == "user_input") {
        in.kind = InputKind::kUserInput;
        SAFECKPT_TRY(auto am, union_member(*arg, w + ".user_input.arg"));
        if (am.first != "as_tensor") {
          p_.refusals.push_back(w + ": user input of kind '" + am.first + "' (only tensor inputs run)");
          continue;
        }
        SAFECKPT_TRY(in.value, tensor_ref(*am.second, w));
        in.fqn = p_.value_names[static_cast<std::size_t>(in.value)];
      } else if (um.first == "parameter" || um.first == "buffer" || um.first == "tensor_constant") {
        in.kind = um.first == "parameter" ? InputKind::kParameter
                  : um.first == "buffer"  ? InputKind::kBuffer
                                          : InputKind::kConstant;
        SAFECKPT_TRY(in.value, tensor_ref(*arg, w));
        const char* key = um.first == "parameter" ? "parameter_name"
                          : um.first == "buffer"  ? "buffer_name"
                                                  : "tensor_constant_name";
        SAFECKPT_TRY(const json* fq, field(v, key, w));
        SAFECKPT_TRY(in.fqn, get_string(*fq, w + "." + key));
        if (um.first == "buffer") {
          if (auto ps = v.find("persistent"); ps != v.end() && ps->is_boolean()) in.persistent = ps->get<bool>();
        }
      } else if (um.first == "custom_obj" || um.first == "token" || um.first == "constant_input") {
        p_.refusals.push_back(w + ": input spec '" + um.first +
                              "' is not supported (custom objects, effect tokens "
                              "and constant inputs do not run)");
        continue;
      } else {
        return malformed(w, "unknown InputSpec member '" + um.first + "'");
      }
      for (const auto& prev : p_.inputs)
        if (prev.fqn == in.fqn && (prev.kind == InputKind::kUserInput) == (in.kind == InputKind::kUserInput))
          return malformed(w, "input '" + in.fqn + "' appears twice in the signature");
      p_.inputs.push_back(std::move(in));
    }
    SAFECKPT_TRY(const json* os, field(sig, "output_specs", "signature"));
    if (!os->is_array()) return malformed("signature.output_specs", "expected a list");
    if (os->size() > lim_.max_inputs)
      return make_error(ErrorCode::kLimitExceeded, "signature.output_specs: more than GraphLimits::max_inputs");
    // The tensor each user_output spec returns (-1: another spec), for the
    // graph.outputs check below.
    std::vector<std::int32_t> spec_tensor(os->size(), -1);
    for (std::size_t i = 0; i < os->size(); ++i) {
      std::string w = "signature.output_specs[" + std::to_string(i) + "]";
      SAFECKPT_TRY(auto um, union_member((*os)[i], w));
      static const char* kKnown[] = {
          "user_output",         "loss_output", "buffer_mutation",   "gradient_to_parameter", "gradient_to_user_input",
          "user_input_mutation", "token",       "parameter_mutation"};
      bool known = false;
      for (const char* k : kKnown) known = known || um.first == k;
      if (!known) return malformed(w, "unknown OutputSpec member '" + um.first + "'");
      if (um.first != "user_output") {
        p_.refusals.push_back(w + ": output spec '" + um.first +
                              "' (mutations, gradients and losses are not run: export the model in eval mode "
                              "without in-place updates of buffers or inputs)");
        continue;
      }
      SAFECKPT_TRY(const json* arg, field(*um.second, "arg", w + ".user_output"));
      SAFECKPT_TRY(auto am, union_member(*arg, w + ".user_output.arg"));
      if (am.first != "as_tensor") {
        p_.refusals.push_back(w + ": user output of kind '" + am.first + "' (only tensor outputs run)");
        continue;
      }
      SAFECKPT_TRY(std::int32_t id, tensor_ref(*am.second, w));
      p_.outputs.push_back(id);
      spec_tensor[i] = id;
    }
    // graph.outputs must be the signature's outputs, in order (torch/_export/
    // serde/serialize.py writes one per output spec): a program whose graph
    // returns other values than its signature names is malformed, not run
    // with either (review, 2026-12-06).
    SAFECKPT_TRY(const json* go, field(g, "outputs", "graph"));
    if (!go->is_array()) return malformed("graph.outputs", "expected a list");
    if (go->size() != os->size())
      return malformed("graph.outputs",
                       std::to_string(go->size()) + " outputs but the signature has " + std::to_string(os->size()));
    for (std::size_t i = 0; i < go->size(); ++i) {
      if (spec_tensor[i] < 0) continue;
      std::string w = "graph.outputs[" + std::to_string(i) + "]";
      SAFECKPT_TRY(auto am, union_member((*go)[i], w));
      if (am.first != "as_tensor") return malformed(w, "is '" + am.first + "' but the signature returns a tensor");
      SAFECKPT_TRY(std::int32_t id, tensor_ref(*am.second, w));
      if (id != spec_tensor[i])
        return malformed(w, "'" + p_.value_names[static_cast<std::size_t>(id)] +
                                "' does not match the signature's output '" +
                                p_.value_names[static_cast<std::size_t>(spec_tensor[i])] + "'");
    }
    // graph.inputs must be the signature's inputs, in order (pt2-format.md §2.6 step 3).
    SAFECKPT_TRY(const json* gi, field(g, "inputs", "graph"));
    if (!gi->is_array()) return malformed("graph.inputs", "expected a list");
    if (gi->size() != is->size())
      return malformed("graph.inputs",
                       std::to_string(gi->size()) + " inputs but the signature has " + std::to_string(is->size()));
    std::size_t k = 0;
    for (std::size_t i = 0; i < gi->size(); ++i) {
      std::string w = "graph.inputs[" + std::to_string(i) + "]";
      SAFECKPT_TRY(auto am, union_member((*gi)[i], w));
      if (am.first != "as_tensor") continue;
      SAFECKPT_TRY(std::int32_t id, tensor_ref(*am.second, w));
      if (k < p_.inputs.size() && p_.inputs[k].value == id) {
        ++k;
      } else if (k < p_.inputs.size()) {
        return malformed(w, "'" + p_.value_names[static_cast<std::size_t>(id)] +
                                "' does not match the signature's input '" +
                                p_.value_names[static_cast<std::size_t>(p_.inputs[k].value)] + "'");
      }
    }
    return {};
  }

  Program& p_;
  const GraphLimits& lim_;
  std::unordered_map<std::string, std::int32_t> ids_, sym_ids_, exprs_;
  std::vector<std::string> unsupported_;
};

}  // namespace

std::int32_t Program::find_value(std::string_view name) const {
  for (std::size_t i = 0; i < value_names.size(); ++i)
    if (value_names[i] == name) return static_cast<std::int32_t>(i);
  return -1;
}

std::map<std::string, std::uint32_t> Program::op_histogram() const {
  std::map<std::string, std::uint32_t> h;
  for (const auto& n : nodes) ++h[n.target];
  return h;
}

Result<Program> parse_program_json(std::string_view text, std::string_view model_name, const GraphLimits& limits) {
  std::string what = "models/" + std::string(model_name) + ".json";
  SAFECKPT_TRY(json root, parse_json(text, what, limits));
  Program p;
  p.model_name = std::string(model_name);
  p.json_sha256 = sha256_hex({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  try {
    Parser parser(p, limits);
    auto st = parser.run(root);
    if (!st) {
      Error e = std::move(st).error();
      e.at_record(what);
      return unexpected(std::move(e));
    }
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, what + ": out of memory");
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kMalformed, what + ": " + e.what());
  }
  return p;
}

}  // namespace safeckpt::graph
