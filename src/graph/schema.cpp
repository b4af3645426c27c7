// Op schemas: the grammar of allowlist/ops.schema (a subset of PyTorch's
// FunctionSchema text, torchgen/model.py / c10 schema parser) and the
// embedded table.
//
// Accepted per line (after stripping `#` comments and `| note`):
//   NAME '(' ARG (',' ARG)* ')' '->' RETURNS
//   ARG     = '*' | TYPE ' ' IDENT ['=' DEFAULT]
//   TYPE    = BASE [ '(' alias ')' ] [ '[' digits? ']' ] [ '?' ]   (also BASE '?' '[]')
//   DEFAULT = None | True | False | number | '[' numbers ']' | "string"
//   RETURNS = Tensor[(alias)] | Tensor[] | SymInt | '(' ')' | '(' RET (',' RET)* ')'
//   RET     = (Tensor | SymInt) [name]
// The file is ours (embedded at build time), but it is still parsed without
// trusting it: every malformed line is an error naming the line.
#include <algorithm>
#include <charconv>
#include <mutex>

#include "safeckpt/graph.hpp"

namespace safeckpt::detail {
extern const char kOpsAllowlist[];
}

namespace safeckpt::graph {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Removes alias annotations "(a)", "(a!)", "(a -> *)" after "Tensor";
// reports whether "!" was seen (`mutated`) and whether any annotation was
// (`aliased`).
std::string strip_alias(std::string_view s, bool* mutated, bool* aliased = nullptr) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(' && out.size() >= 6 && out.compare(out.size() - 6, 6, "Tensor") == 0) {
      std::size_t j = s.find(')', i);
      if (j == std::string_view::npos) return out;
      if (aliased != nullptr) *aliased = true;
      if (s.substr(i, j - i).find('!') != std::string_view::npos && mutated) *mutated = true;
      i = j;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

bool parse_int(std::string_view s, std::int64_t* v) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}
bool parse_double(std::string_view s, double* v) {
  std::string t(s);
  char* end = nullptr;
  *v = std::strtod(t.c_str(), &end);
  return !t.empty() && end == t.c_str() + t.size();
}

Result<OpArgSchema> parse_arg(std::string_view text, bool kwarg_only, std::string_view line) {
  auto bad = [&](std::string why) {
    return make_error(ErrorCode::kMalformed, "ops allowlist: " + why + " in '" + std::string(line) + "'");
  };
  OpArgSchema a;
  a.kwarg_only = kwarg_only;
  std::string_view def;
  if (auto eq = text.find('='); eq != std::string_view::npos) {
    def = trim(text.substr(eq + 1));
    text = trim(text.substr(0, eq));
    a.has_default = true;
  }
  auto sp = text.rfind(' ');
  if (sp == std::string_view::npos) return bad("argument without a name");
  std::string_view type = trim(text.substr(0, sp));
  a.name = std::string(trim(text.substr(sp + 1)));
  if (a.name.empty()) return bad("empty argument name");
  bool list = false;
  std::string t(type);
  if (!t.empty() && t.back() == '?') {
    a.optional = true;
    t.pop_back();
  }
  if (!t.empty() && t.back() == ']') {
    auto lb = t.rfind('[');
    if (lb == std::string::npos) return bad("unbalanced '['");
    list = true;
    t.resize(lb);
  }
  bool elem_optional = false;
  if (!t.empty() && t.back() == '?') {
    elem_optional = true;
    t.pop_back();
  }
  using T = OpArgSchema::Type;
  if (t == "Tensor") {
    a.type = list ? (elem_optional ? T::kOptTensorList : T::kTensorList) : T::kTensor;
    if (!list && elem_optional) a.optional = true;
  } else if (t == "int" || t == "SymInt") {
    a.type = list ? T::kIntList : T::kInt;
  } else if (!list && t == "float") {
    a.type = T::kFloat;
  } else if (!list && t == "bool") {
    a.type = T::kBool;
  } else if (!list && t == "Scalar") {
    a.type = T::kScalar;
  } else if (!list && t == "ScalarType") {
    a.type = T::kScalarType;
  } else if (!list && t == "Layout") {
    a.type = T::kLayout;
  } else if (!list && t == "Device") {
    a.type = T::kDevice;
  } else if (!list && t == "MemoryFormat") {
    a.type = T::kMemoryFormat;
  } else if (!list && t == "str") {
    a.type = T::kString;
  } else {
    return bad("unknown type '" + std::string(type) + "'");
  }
  if (!a.has_default) return a;
  Arg& d = a.default_value;
  if (def == "None") {
    d.kind = Arg::Kind::kNone;
  } else if (def == "True" || def == "False") {
    d.kind = Arg::Kind::kBool;
    d.b = def == "True";
  } else if (def.size() >= 2 && def.front() == '"' && def.back() == '"') {
    d.kind = Arg::Kind::kString;
    d.s = std::string(def.substr(1, def.size() - 2));
  } else if (def.size() >= 2 && def.front() == '[' && def.back() == ']') {
    d.kind = Arg::Kind::kInts;
    std::string_view in = def.substr(1, def.size() - 2);
    while (!trim(in).empty()) {
      auto c = in.find(',');
      std::int64_t v = 0;
      if (!parse_int(trim(in.substr(0, c)), &v)) return bad("bad list default");
      d.ints.push_back(SymInt{v, -1});
      if (c == std::string_view::npos) break;
      in.remove_prefix(c + 1);
    }
  } else {
    std::int64_t iv = 0;
    double fv = 0;
    if (a.type != T::kFloat && parse_int(def, &iv)) {
      if (a.type == T::kIntList) {
        // `int[2] stride=1` means [1, 1] (c10 schema: a scalar default repeats N times).
        std::int64_t n = 1;
        auto lb = type.find('[');
        if (lb != std::string_view::npos && type[lb + 1] != ']' &&
            !parse_int(type.substr(lb + 1, type.find(']') - lb - 1), &n))
          return bad("bad list size");
        d.kind = Arg::Kind::kInts;
        d.ints.assign(static_cast<std::size_t>(n), SymInt{iv, -1});
      } else {
        d.kind = Arg::Kind::kInt;
        d.ints = {SymInt{iv, -1}};
      }
    } else if (parse_double(def, &fv)) {
      d.kind = Arg::Kind::kFloat;
      d.f = fv;
    } else {
      return bad("unknown default '" + std::string(def) + "'");
    }
  }
  return a;
}

}  // namespace

std::string schema_name_for_target(std::string_view target) {
  constexpr std::string_view kPrefix = "torch.ops.";
  if (target.substr(0, kPrefix.size()) != kPrefix) return std::string(target);
  std::string_view rest = target.substr(kPrefix.size());
  auto dot = rest.find('.');
  if (dot == std::string_view::npos) return std::string(target);
  std::string ns(rest.substr(0, dot));
  std::string_view op = rest.substr(dot + 1);
  constexpr std::string_view kDefault = ".default";
  if (op.size() > kDefault.size() && op.substr(op.size() - kDefault.size()) == kDefault)
    op.remove_suffix(kDefault.size());
  return ns + "::" + std::string(op);
}

Result<std::vector<OpSchema>> parse_op_allowlist(std::string_view text) {
  std::vector<OpSchema> out;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    std::string_view line = raw;
    if (auto h = line.find('#'); h != std::string_view::npos) line = line.substr(0, h);
    std::string note;
    if (auto p = line.find('|'); p != std::string_view::npos) {
      note = std::string(trim(line.substr(p + 1)));
      line = line.substr(0, p);
    }
    line = trim(line);
    if (line.empty()) continue;
    auto bad = [&](std::string why) {
      return make_error(ErrorCode::kMalformed, "ops allowlist: " + why + " in '" + std::string(raw) + "'");
    };
    OpSchema s;
    s.note = note;
    auto lp = line.find('(');
    auto arrow = line.rfind("->");
    if (lp == std::string_view::npos || arrow == std::string_view::npos || arrow < lp) return bad("no '(' or '->'");
    s.name = std::string(trim(line.substr(0, lp)));
    std::string_view head = trim(line.substr(0, arrow));
    if (head.empty() || head.back() != ')') return bad("no ')' before '->'");
    bool mutated = false;
    std::string args = strip_alias(head.substr(lp + 1, head.size() - lp - 2), &mutated);
    bool ret_alias = false;
    std::string rets = strip_alias(trim(line.substr(arrow + 2)), nullptr, &ret_alias);
    bool kwarg_only = false;
    std::string_view av = args;
    while (!trim(av).empty()) {
      auto c = av.find(',');
      std::string_view one = trim(av.substr(0, c));
      if (one == "*") {
        kwarg_only = true;
      } else {
        SAFECKPT_TRY(OpArgSchema a, parse_arg(one, kwarg_only, raw));
        s.args.push_back(std::move(a));
      }
      if (c == std::string_view::npos) break;
      av.remove_prefix(c + 1);
    }
    s.inplace = mutated;
    // A result that may share its first argument's memory: the schema's
    // return alias annotation (views, reshape, to, slice, select, split),
    // and aten::dropout, whose train=False result is its input itself
    // though its schema says nothing (ATen native/Dropout.cpp: `return
    // input`).
    s.aliases_input = (ret_alias && !mutated) || s.name == "aten::dropout";
    if (rets == "Tensor") {
      s.num_outputs = 1;
    } else if (rets == "Tensor[]") {
      s.returns_list = true;
      s.num_outputs = 0;
    } else if (rets == "SymInt") {
      s.returns_symint = true;
      s.num_outputs = 0;
    } else if (rets == "()") {
      s.num_outputs = 0;
    } else if (rets.size() > 2 && rets.front() == '(' && rets.back() == ')') {
      std::uint32_t n = 0;
      std::string_view rv = std::string_view(rets).substr(1, rets.size() - 2);
      // Each position: `Type` or `Type name` (native_functions.yaml names
      // them: `Tensor output, ..., SymInt max_q`); Type is Tensor or SymInt.
      std::vector<bool> sym;
      while (!trim(rv).empty()) {
        auto c = rv.find(',');
        std::string_view one = trim(rv.substr(0, c));
        std::string_view type = one.substr(0, one.find(' '));
        if (type != "Tensor" && type != "SymInt") return bad("unsupported return type");
        if (type.size() < one.size()) {
          std::string_view name = trim(one.substr(type.size()));
          if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_0123456789") != std::string_view::npos)
            return bad("bad return name");
        }
        sym.push_back(type == "SymInt");
        ++n;
        if (c == std::string_view::npos) break;
        rv.remove_prefix(c + 1);
      }
      s.num_outputs = n;
      if (std::find(sym.begin(), sym.end(), true) != sym.end()) s.symint_returns = std::move(sym);
    } else {
      return bad("unsupported return type '" + rets + "'");
    }
    for (const auto& o : out)
      if (o.name == s.name) return bad("duplicate op '" + s.name + "'");
    out.push_back(std::move(s));
  }
  return out;
}

const std::vector<OpSchema>& op_allowlist() {
  static const std::vector<OpSchema> table = [] {
    auto r = parse_op_allowlist(detail::kOpsAllowlist);
    // The embedded file is checked by a unit test; an unparsable build has no ops.
    return r ? std::move(r).value() : std::vector<OpSchema>{};
  }();
  return table;
}

}  // namespace safeckpt::graph
