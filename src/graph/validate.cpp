// Validation: every node's target must be in allowlist/ops.schema; its
// arguments are bound by name to the op's schema (torch 2.11 serialize.py
// `deserialize_inputs` re-binds by name; omitted arguments take the schema
// default) and type-checked; the graph must be in topological order (each
// value produced once, before its uses: this also rules out cycles); the
// engine's restrictions (pt2-format.md §5.1 "Reject with a named reason")
// are checked. Policy refusals are kDisallowedOperation; broken structure is
// kMalformed.
#include <unordered_map>

#include "graph/internal.hpp"

namespace safeckpt::graph {
namespace {

using T = OpArgSchema::Type;

bool arg_matches(const OpArgSchema& s, const Arg& a) {
  using K = Arg::Kind;
  if (a.kind == K::kNone) return s.optional || s.type == T::kOptTensorList;
  switch (s.type) {
    case T::kTensor: return a.kind == K::kTensor;
    case T::kTensorList: return a.kind == K::kTensors;
    case T::kOptTensorList: return a.kind == K::kTensors;
    case T::kInt: return a.kind == K::kInt;
    case T::kIntList: return a.kind == K::kInts || a.kind == K::kInt;
    case T::kFloat: return a.kind == K::kFloat || a.kind == K::kInt;
    case T::kBool: return a.kind == K::kBool;
    case T::kScalar: return a.kind == K::kInt || a.kind == K::kFloat || a.kind == K::kBool;
    case T::kScalarType: return a.kind == K::kScalarType;
    case T::kLayout: return a.kind == K::kLayout;
    case T::kDevice: return a.kind == K::kDevice;
    case T::kMemoryFormat: return a.kind == K::kMemoryFormat;
    case T::kString: return a.kind == K::kString;
  }
  return false;
}

const OpSchema* find_schema(std::string_view name) {
  for (const auto& s : op_allowlist())
    if (s.name == name) return &s;
  return nullptr;
}

using RK = Refusal::Kind;

struct Checker {
  Program& p;
  std::vector<Refusal> policy, broken;

  void pol(RK k, const Node* n, std::string msg) {
    policy.push_back(
        Refusal{k, n != nullptr ? n->name : std::string(), n != nullptr ? n->target : std::string(), std::move(msg)});
  }
  void brk(const Node* n, std::string msg) {
    broken.push_back(Refusal{RK::kMalformed, n != nullptr ? n->name : std::string(),
                             n != nullptr ? n->target : std::string(), std::move(msg)});
  }

  void node_policy(Node& n, std::size_t index) {
    std::string w = "node '" + n.name + "' (" + n.target + ")";
    if (n.target.rfind("torch.ops.higher_order.", 0) == 0) {
      pol(RK::kHigherOrder, &n,
          w + ": higher-order op (control flow, subgraphs, kernels) is not run: export without it "
              "(torch.cond/while_loop/wrap) or inline it");
      return;
    }
    if (n.target.rfind("torch.ops.", 0) == 0 && n.target.rfind("torch.ops.aten.", 0) != 0) {
      pol(RK::kCustomOp, &n, w + ": op of a custom namespace is not run: only ATen ops from allowlist/ops.schema are");
      return;
    }
    const OpSchema* s = find_schema(n.op);
    // Binary pointwise ops take a Python number for `other` (torch.export
    // keeps `x + 1e-6` as add.Tensor with as_float; PyTorch wraps it as a
    // 0-d tensor that does not promote across its category).
    const bool scalar_other = n.op == "aten::add.Tensor" || n.op == "aten::sub.Tensor" || n.op == "aten::mul.Tensor" ||
                              n.op == "aten::bitwise_and.Tensor" || n.op == "aten::__and__.Tensor";
    if (s == nullptr) {
      pol(RK::kOpNotAllowed, &n,
          w + ": op '" + n.op +
              "' is not in the engine's op allowlist (allowlist/ops.schema): "
              "decompose it at export (ep.run_decompositions) or ask for it to be added");
      return;
    }
    // Bind by name; fill defaults.
    std::vector<Arg> bound(s->args.size());
    std::vector<bool> set(s->args.size(), false);
    for (std::size_t i = 0; i < n.args.size(); ++i) {
      std::size_t k = 0;
      while (k < s->args.size() && s->args[k].name != n.arg_names[i]) ++k;
      if (k == s->args.size()) {
        brk(&n, w + ": argument '" + n.arg_names[i] + "' is not in the schema of " + s->name);
        return;
      }
      if (set[k]) {
        brk(&n, w + ": argument '" + n.arg_names[i] + "' given twice");
        return;
      }
      const Arg::Kind ak = n.args[i].kind;
      const bool number = ak == Arg::Kind::kInt || ak == Arg::Kind::kFloat || ak == Arg::Kind::kBool;
      if (!(scalar_other && s->args[k].name == "other" && number) && !arg_matches(s->args[k], n.args[i])) {
        brk(&n, w + ": argument '" + n.arg_names[i] + "' has the wrong type for " + s->name);
        return;
      }
      bound[k] = n.args[i];
      set[k] = true;
    }
    for (std::size_t k = 0; k < s->args.size(); ++k) {
      if (set[k]) continue;
      if (!s->args[k].has_default) {
        brk(&n, w + ": required argument '" + s->args[k].name + "' is missing");
        return;
      }
      bound[k] = s->args[k].default_value;
    }
    // Outputs.
    if (s->returns_symint) {
      if (n.sym_output < 0 || !n.outputs.empty()) brk(&n, w + ": must have one SymInt output");
    } else if (s->returns_list) {
      if (!n.outputs_as_list && !(n.outputs.size() == 1)) brk(&n, w + ": must output a tensor list");
    } else if (n.outputs.size() != s->num_outputs || n.sym_output >= 0 || n.outputs_as_list) {
      brk(&n, w + ": has " + std::to_string(n.outputs.size()) + " outputs; " + s->name + " returns " +
                  std::to_string(s->num_outputs));
    } else {
      // Tuple positions: a SymInt position is as_sym_int, a Tensor position
      // as_tensor or as_none.
      for (std::size_t k = 0; k < n.outputs.size(); ++k) {
        const bool want_sym = k < s->symint_returns.size() && s->symint_returns[k];
        const bool is_sym = k < n.output_syms.size() && n.output_syms[k] >= 0;
        if (want_sym != is_sym) {
          brk(&n, w + ": output " + std::to_string(k) + " is " + (is_sym ? "a SymInt" : "a tensor or None") + "; " +
                      s->name + " returns " + (want_sym ? "a SymInt" : "a Tensor") + " there");
          break;
        }
      }
    }
    n.schema = s;
    n.args = std::move(bound);
    n.arg_names.clear();
    for (const auto& a : s->args) n.arg_names.push_back(a.name);
    auto arg = [&](std::string_view name) -> const Arg& {
      for (std::size_t k = 0; k < s->args.size(); ++k)
        if (s->args[k].name == name) return n.args[k];
      return n.args[0];
    };
    // Op restrictions (ops.schema notes).
    if (s->name == "aten::batch_norm" && arg("training").b)
      pol(RK::kPolicy, &n,
          w + ": batch_norm with training=True updates running statistics: export the model in eval() mode");
    if (s->name == "aten::batch_norm" &&
        (arg("running_mean").kind == Arg::Kind::kNone || arg("running_var").kind == Arg::Kind::kNone))
      pol(RK::kPolicy, &n, w + ": batch_norm without running statistics (batch statistics) is not supported");
    if ((s->name == "aten::scaled_dot_product_attention" ||
         s->name == "aten::_scaled_dot_product_efficient_attention" ||
         s->name == "aten::_scaled_dot_product_cudnn_attention" ||
         s->name == "aten::_scaled_dot_product_flash_attention") &&
        arg("dropout_p").f != 0.0)
      pol(RK::kPolicy, &n, w + ": attention dropout_p != 0 is random: export in eval() mode");
    if (s->name == "aten::dropout" && arg("train").b)
      pol(RK::kPolicy, &n, w + ": dropout with train=True is random: export the model in eval() mode");
    if (s->name == "aten::convolution" && (arg("transposed").b || arg("stride").ints.size() != 2))
      pol(RK::kPolicy, &n, w + ": only 2-D, non-transposed convolution runs");
    if (s->name == "aten::gelu" && arg("approximate").s != "none" && arg("approximate").s != "tanh")
      brk(&n, w + ": gelu approximate='" + arg("approximate").s + "' (none or tanh)");
    (void)index;
  }
};

}  // namespace

namespace {
void collect(Program& p, Checker& c) {
  for (auto& r : p.refusals) c.pol(r.find("mutation") != std::string::npos ? RK::kMutation : RK::kPolicy, nullptr, r);
  std::vector<char> produced(p.values.size(), 0);
  std::vector<char> sym_produced(p.sym_values.size(), 0);
  std::vector<std::uint32_t> uses(p.values.size(), 0);
  std::vector<std::int32_t> producer(p.values.size(), -1);
  for (const auto& in : p.inputs) {
    if (in.value >= 0) produced[static_cast<std::size_t>(in.value)] = 1;
  }
  // Symbols that an input dim or a sym node defines; anything else is unbacked.
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    Node& n = p.nodes[i];
    std::string w = "node '" + n.name + "' (" + n.target + ")";
    for (const auto& a : n.args) {
      std::vector<std::int32_t> ts = a.tensors;
      if (a.kind == Arg::Kind::kTensor) ts.push_back(a.tensor);
      for (auto t : ts) {
        if (t < 0) continue;
        if (!produced[static_cast<std::size_t>(t)])
          c.brk(&n, w + ": uses '" + p.value_names[static_cast<std::size_t>(t)] +
                        "' before any node produces it (graph not in order, or cyclic)");
        ++uses[static_cast<std::size_t>(t)];
      }
      for (const auto& s : a.ints)
        if (s.is_symbolic() && !sym_produced[static_cast<std::size_t>(s.sym)])
          c.brk(&n, w + ": uses SymInt '" + p.sym_values[static_cast<std::size_t>(s.sym)].name +
                        "' before any node produces it");
    }
    for (auto o : n.outputs) {
      if (o < 0) continue;
      if (produced[static_cast<std::size_t>(o)])
        c.brk(&n, w + ": produces '" + p.value_names[static_cast<std::size_t>(o)] + "' a second time");
      produced[static_cast<std::size_t>(o)] = 1;
      producer[static_cast<std::size_t>(o)] = static_cast<std::int32_t>(i);
    }
    std::vector<std::int32_t> syms_out = n.output_syms;
    syms_out.push_back(n.sym_output);
    for (auto so : syms_out) {
      if (so < 0) continue;
      if (sym_produced[static_cast<std::size_t>(so)]) c.brk(&n, w + ": produces a SymInt a second time");
      sym_produced[static_cast<std::size_t>(so)] = 1;
      const std::string& nm = p.sym_values[static_cast<std::size_t>(so)].name;
      if (!nm.empty() && nm[0] == 'u')
        c.pol(RK::kPolicy, &n, w + ": unbacked symbol '" + nm + "' (a data-dependent size) is not supported");
    }
    c.node_policy(n, i);
  }
  for (auto o : p.outputs)
    if (!produced[static_cast<std::size_t>(o)])
      c.brk(nullptr, "user output '" + p.value_names[static_cast<std::size_t>(o)] + "' is never produced");
  // Unbacked symbols (data-dependent sizes, torch's u<n>) in any expression.
  for (const auto& sv : p.sym_values) {
    auto at = sv.expr.find("Symbol('u");
    if (at == std::string::npos) continue;
    auto end = sv.expr.find('\'', at + 8);
    c.pol(RK::kPolicy, nullptr,
          "unbacked symbol '" + sv.expr.substr(at + 8, end == std::string::npos ? 8 : end - at - 8) +
              "' (a size that depends on tensor data) is not supported: export with static or input-bound "
              "sizes");
    break;
  }
  // Unbacked symbols in range_constraints.
  for (const auto& [sym, range] : p.range_constraints)
    if (!sym.empty() && sym[0] == 'u')
      c.pol(RK::kPolicy, nullptr,
            "range_constraints: unbacked symbol '" + sym + "' (data-dependent size) is not supported");
  // In-place ops: the mutated value (and every base it may alias, through
  // any op whose result may share its input's memory: OpSchema::
  // aliases_input) must have no other use, must not be a graph output and
  // must not be a graph input, so running them out of place is exact (the
  // interpreter and the engine copy views). A review (2026-12-06) found
  // relu_ through slice / reshape / dropout / to reaching a parameter, and
  // relu_ of a value the graph also returns, accepted with results PyTorch
  // would not give: the view list was hand-kept and outputs were no use.
  std::vector<char> is_input(p.values.size(), 0);
  for (const auto& in : p.inputs)
    if (in.value >= 0) is_input[static_cast<std::size_t>(in.value)] = 1;
  std::vector<char> is_output(p.values.size(), 0);
  for (auto o : p.outputs)
    if (o >= 0 && static_cast<std::size_t>(o) < is_output.size()) is_output[static_cast<std::size_t>(o)] = 1;
  for (const auto& n : p.nodes) {
    if (n.schema == nullptr || !n.schema->inplace || n.args.empty() || n.args[0].kind != Arg::Kind::kTensor) continue;
    std::string w = "node '" + n.name + "' (" + n.target + ")";
    std::int32_t t = n.args[0].tensor;
    for (int hops = 0; t >= 0 && hops < 1 << 20; ++hops) {
      auto ut = static_cast<std::size_t>(t);
      if (is_input[ut]) {
        c.pol(RK::kMutation, &n,
              w + ": mutates graph input '" + p.value_names[ut] +
                  "' in place (buffer/input mutation): export without in-place updates of inputs");
        break;
      }
      if (uses[ut] > 1 || is_output[ut]) {
        c.pol(RK::kMutation, &n,
              w + ": mutates '" + p.value_names[ut] + "' in place while " +
                  (is_output[ut] ? "the graph also returns it" : "another node reads it") +
                  ": not supported (run_decompositions() makes the program functional)");
        break;
      }
      std::int32_t prod = producer[ut];
      if (prod < 0) break;
      const Node& pn = p.nodes[static_cast<std::size_t>(prod)];
      if (pn.schema == nullptr || !pn.schema->aliases_input || pn.args.empty() || pn.args[0].kind != Arg::Kind::kTensor)
        break;
      t = pn.args[0].tensor;
    }
  }
  // The fused attention ops' auxiliary outputs (logsumexp, cum_seq_*,
  // philox seed/offset, debug mask) are placeholders of their recorded
  // tensor_meta in the interpreter (zeros; the RNG state of a dropout that
  // never runs): a program that reads one is refused rather than fed them.
  // Output 0 and the SymInt positions (max_q/max_k = the sequence lengths)
  // are computed.
  std::vector<char> is_user_output(p.values.size(), 0);
  for (auto o : p.outputs)
    if (o >= 0) is_user_output[static_cast<std::size_t>(o)] = 1;
  for (const auto& n : p.nodes) {
    if (n.schema == nullptr || (n.schema->name != "aten::_scaled_dot_product_efficient_attention" &&
                                n.schema->name != "aten::_scaled_dot_product_cudnn_attention" &&
                                n.schema->name != "aten::_scaled_dot_product_flash_attention"))
      continue;
    for (std::size_t k = 1; k < n.outputs.size(); ++k) {
      auto o = n.outputs[k];
      if (o < 0 || (uses[static_cast<std::size_t>(o)] == 0 && !is_user_output[static_cast<std::size_t>(o)])) continue;
      c.pol(RK::kPolicy, &n,
            "node '" + n.name + "' (" + n.target + "): output " + std::to_string(k) + " ('" +
                p.value_names[static_cast<std::size_t>(o)] +
                "') is read, but the CPU reference computes only the attention output (0) and max_q/max_k");
    }
  }
}
}  // namespace

std::vector<Refusal> refusals(Program& p, const GraphLimits& limits) {
  Checker c{p, {}, {}};
  collect(p, c);
  if (c.broken.empty() && c.policy.empty()) {
    auto st = check_shapes(p, limits);
    if (!st) c.brk(nullptr, st.error().message());
  }
  std::vector<Refusal> all = std::move(c.broken);
  for (auto& r : c.policy) all.push_back(std::move(r));
  return all;
}

std::vector<std::string> refusal_reasons(Program& p, const GraphLimits& limits) {
  std::vector<std::string> out;
  for (auto& r : refusals(p, limits)) out.push_back(std::move(r.message));
  return out;
}

Status validate(Program& p, const GraphLimits& limits) {
  // Structure first (kMalformed), then policy (kDisallowedOperation), then
  // the shape pass (its own code) when everything else passed.
  Checker c{p, {}, {}};
  collect(p, c);
  if (c.broken.empty() && c.policy.empty()) return check_shapes(p, limits);
  const bool structural = !c.broken.empty();
  const auto& first = structural ? c.broken : c.policy;
  if (first.empty()) return {};
  std::size_t more = c.broken.size() + c.policy.size() - 1;
  std::string msg = first[0].message;
  if (more > 0) msg += " (and " + std::to_string(more) + " more reason" + (more > 1 ? "s" : "") + ")";
  return make_error(structural ? ErrorCode::kMalformed : ErrorCode::kDisallowedOperation, msg);
}

}  // namespace safeckpt::graph
