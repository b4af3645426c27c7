// The execution planner (safeckpt/graph_plan.hpp) on the real torch.export
// programs of tests/data/pt2-2.11 (both IRs, every recorded shape): symbol
// binding, concrete shapes against PyTorch's eager outputs and recorded
// strides, step grouping checked against the op lists the generator recorded
// (<model>.json ops_json), the memory plan checked by an independent
// checker, and refusals (order, ranges, options).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "safeckpt/graph.hpp"
#include "safeckpt/graph_plan.hpp"
#include "safeckpt/hash.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/zip.hpp"
#include "support/pt2_corpus.hpp"

using namespace safeckpt;
using namespace safeckpt::graph;
using nlohmann::json;

namespace {

std::string data_dir() {
  return test_support::test_data_dir();
}
using Loaded = test_support::LoadedProgram;
using test_support::load_program;
using test_support::read_text;

using Shapes = std::map<std::string, std::vector<std::int64_t>>;

// Every recorded case of a model: (tag, user input shapes, output shapes),
// read from <model>.io.safetensors (PyTorch's inputs and eager outputs).
struct Case {
  std::string tag;
  Shapes inputs;
  std::vector<std::vector<std::int64_t>> outputs;
};
std::vector<Case> corpus_cases(const std::string& model, const Program& program) {
  auto io = SafetensorsFile::open(data_dir() + model + ".io.safetensors");
  REQUIRE(io.has_value());
  std::vector<std::string> prefixes = {""};
  for (const auto& t : io->tensors())
    if (t.name.rfind("extra.", 0) == 0 && t.name.find(".input.") != std::string::npos)
      prefixes.push_back(t.name.substr(0, t.name.find(".input.") + 1));
  std::vector<Case> out;
  for (const auto& prefix : prefixes) {
    Case c;
    c.tag = prefix.empty() ? "example" : prefix;
    for (const auto& gi : program.inputs) {
      if (gi.kind != InputKind::kUserInput) continue;
      const SafetensorsTensor* t = io->find(prefix + "input." + gi.fqn);
      REQUIRE(t != nullptr);
      c.inputs[gi.fqn] = std::vector<std::int64_t>(t->shape.begin(), t->shape.end());
    }
    for (std::size_t i = 0; i < program.outputs.size(); ++i) {
      const SafetensorsTensor* t = io->find(prefix + "output." + std::to_string(i) + ".cpu");
      REQUIRE(t != nullptr);
      c.outputs.emplace_back(t->shape.begin(), t->shape.end());
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The independent checker of a memory plan: recomputes each slot's lifetime
// from the steps (the step that lists the value as an output; the last step
// reading it or a view of it, found by walking kView steps to their base;
// program outputs live to the end) and checks that slots alive at the same
// time do not overlap, offsets are aligned, slots hold their value, and the
// arena bounds hold.
void check_memory_plan(const Program& p, const ExecutionPlan& plan, const std::string& what) {
  CAPTURE(what);
  const std::size_t nv = p.values.size();
  std::vector<std::int32_t> def_step(nv, -1), root(nv, -1);
  std::vector<char> is_input(nv, 0);
  for (const auto& in : p.inputs) is_input[static_cast<std::size_t>(in.value)] = 1;
  for (std::size_t v = 0; v < nv; ++v)
    if (is_input[v]) root[v] = static_cast<std::int32_t>(v);
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& st = plan.steps[s];
    for (auto o : st.outputs) {
      def_step[static_cast<std::size_t>(o)] = static_cast<std::int32_t>(s);
      if (st.kind == StepKind::kView) {
        REQUIRE(st.inputs.size() == 1);
        root[static_cast<std::size_t>(o)] = root[static_cast<std::size_t>(st.inputs[0])];
      } else {
        root[static_cast<std::size_t>(o)] = o;
      }
    }
  }
  std::vector<std::int32_t> last(nv, -1);
  const auto end = static_cast<std::int32_t>(plan.steps.size()) - 1;
  for (std::size_t s = 0; s < plan.steps.size(); ++s)
    for (auto v : plan.steps[s].inputs) {
      const std::int32_t r = root[static_cast<std::size_t>(v)];
      REQUIRE_MESSAGE(r >= 0, "step " << s << " reads a value that is neither materialized nor an input");
      last[static_cast<std::size_t>(r)] = std::max(last[static_cast<std::size_t>(r)], static_cast<std::int32_t>(s));
    }
  for (auto o : p.outputs) last[static_cast<std::size_t>(root[static_cast<std::size_t>(o)])] = end;
  // Every materialized non-input value has exactly one slot of its size.
  std::size_t expected_slots = 0;
  for (std::size_t v = 0; v < nv; ++v)
    if (root[v] == static_cast<std::int32_t>(v) && !is_input[v]) {
      ++expected_slots;
      const std::int32_t si = plan.slot_of_value[v];
      REQUIRE(si >= 0);
      const MemorySlot& sl = plan.slots[static_cast<std::size_t>(si)];
      CHECK(sl.value == static_cast<std::int32_t>(v));
      CHECK(sl.bytes >= plan.shapes[v].nbytes());
      CHECK(sl.offset % plan.options.alignment == 0);
      CHECK(sl.offset + sl.bytes <= plan.arena_bytes);
      CHECK(sl.first_step == def_step[v]);
      CHECK(sl.last_step == std::max(def_step[v], last[v]));
    }
  CHECK(plan.slots.size() == expected_slots);
  std::uint64_t naive = 0;
  for (const auto& s : plan.slots) naive += s.bytes;
  CHECK(plan.naive_bytes == naive);
  std::size_t conflicts = 0;
  for (std::size_t a = 0; a < plan.slots.size(); ++a)
    for (std::size_t b = a + 1; b < plan.slots.size(); ++b) {
      const MemorySlot &x = plan.slots[a], &y = plan.slots[b];
      if (x.bytes == 0 || y.bytes == 0) continue;
      const bool live_together = x.first_step <= y.last_step && y.first_step <= x.last_step;
      const bool overlap = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      if (live_together && overlap) ++conflicts;
    }
  CHECK(conflicts == 0);
  // Peak live bytes recomputed step by step.
  std::uint64_t peak = 0;
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    std::uint64_t live = 0;
    for (const auto& sl : plan.slots)
      if (sl.first_step <= static_cast<std::int32_t>(s) && static_cast<std::int32_t>(s) <= sl.last_step)
        live += sl.bytes;
    peak = std::max(peak, live);
  }
  CHECK(plan.peak_live_bytes == peak);
  CHECK(plan.arena_bytes >= plan.peak_live_bytes);
  CHECK(plan.arena_bytes <= plan.naive_bytes);
}

// Schedule checks: every node in exactly one step, steps in topological
// order (each input produced by an earlier step or a program input).
void check_schedule(const Program& p, const ExecutionPlan& plan) {
  std::vector<int> seen(p.nodes.size(), 0);
  std::vector<std::int32_t> produced_at(p.values.size(), -1);
  for (const auto& in : p.inputs) produced_at[static_cast<std::size_t>(in.value)] = -2;
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& st = plan.steps[s];
    REQUIRE_FALSE(st.nodes.empty());
    for (auto i : st.nodes) {
      ++seen[static_cast<std::size_t>(i)];
      CHECK(plan.step_of_node[static_cast<std::size_t>(i)] == static_cast<std::int32_t>(s));
    }
    for (auto v : st.inputs) {
      const std::int32_t at = produced_at[static_cast<std::size_t>(v)];
      CHECK_MESSAGE(at != -1, "step " << s << " reads '" << p.value_names[static_cast<std::size_t>(v)]
                                      << "' before a step produces it");
    }
    for (auto o : st.outputs) produced_at[static_cast<std::size_t>(o)] = static_cast<std::int32_t>(s);
  }
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK_MESSAGE(seen[i] == 1, "node " << p.nodes[i].name);
  for (auto o : p.outputs) CHECK(produced_at[static_cast<std::size_t>(o)] >= 0);
}

std::size_t count_steps(const ExecutionPlan& plan, StepKind k) {
  return static_cast<std::size_t>(
      std::count_if(plan.steps.begin(), plan.steps.end(), [&](const Step& s) { return s.kind == k; }));
}

// kGemm steps whose epilogue contains `op`.
std::size_t gemm_with(const ExecutionPlan& plan, EwOp op) {
  std::size_t n = 0;
  for (const auto& s : plan.steps)
    if (s.kind == StepKind::kGemm)
      n += std::any_of(s.ops.begin(), s.ops.end(), [&](const FusedOp& f) { return f.op == op; }) ? 1 : 0;
  return n;
}

std::uint32_t ops_json(const std::string& model, const std::string& ir, const std::string& target) {
  json meta = json::parse(read_text(data_dir() + model + ".json"));
  auto& ops = meta["programs"][ir]["ops_json"];
  return ops.contains(target) ? ops[target].get<std::uint32_t>() : 0;
}

// Plans at `shapes`; with none, at an empty binding (static programs have no symbols).
ExecutionPlan plan_for(const Program& p, const Shapes& shapes, const PlanOptions& o = {}) {
  SymbolBinding binding;
  if (!shapes.empty()) {
    auto b = bind_symbols(p, shapes);
    REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
    binding = *b;
  }
  auto plan = make_plan(p, binding, o);
  REQUIRE_MESSAGE(plan.has_value(), (plan ? "" : plan.error().to_string()));
  return std::move(plan).value();
}

const char* const kModels[] = {"mlp", "cnn", "gpt2", "gpt2_dynbatch", "gpt2_dynbatchseq"};

}  // namespace

TEST_CASE("plan: stances parse as torch.compiler.set_stance spells them") {
  for (Stance s : {Stance::kDefault, Stance::kForceEager, Stance::kEagerThenCompile, Stance::kFailOnRecompile}) {
    auto r = parse_stance(stance_name(s));
    REQUIRE(r.has_value());
    CHECK(*r == s);
  }
  CHECK(stance_name(Stance::kEagerThenCompile) == "eager_then_compile");
  for (const char* bad : {"", "Default", "force-eager", "eager", "fail_on_recompile "}) {
    auto r = parse_stance(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kInvalidArgument);
  }
}

TEST_CASE("plan: every corpus program, both IRs, every recorded shape: shapes, schedule, memory") {
  std::string table;
  for (const char* m : kModels)
    for (const char* ir : {"train", "core"}) {
      Loaded l = load_program(std::string(m) + "." + ir + ".pt2");
      for (const Case& c : corpus_cases(m, l.program)) {
        const std::string what = std::string(m) + "." + ir + " " + c.tag;
        CAPTURE(what);
        auto b = bind_symbols(l.program, c.inputs);
        REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
        auto shapes = infer_shapes(l.program, *b);
        REQUIRE_MESSAGE(shapes.has_value(), (shapes ? "" : shapes.error().to_string()));
        // Output sizes equal PyTorch's eager outputs at this shape.
        for (std::size_t i = 0; i < l.program.outputs.size(); ++i)
          CHECK((*shapes)[static_cast<std::size_t>(l.program.outputs[i])].sizes == c.outputs[i]);
        for (bool fuse : {true, false}) {
          PlanOptions o;
          o.fuse = fuse;
          auto plan = make_plan(l.program, *b, o);
          REQUIRE_MESSAGE(plan.has_value(), (plan ? "" : plan.error().to_string()));
          check_schedule(l.program, *plan);
          check_memory_plan(l.program, *plan, what + (fuse ? " fused" : " eager"));
          if (!fuse) CHECK(plan->steps.size() == l.program.nodes.size());
          if (fuse) CHECK(plan->steps.size() <= l.program.nodes.size());  // cnn has nothing to fuse
          table += what + (fuse ? " fused" : " eager") + ": steps " + std::to_string(plan->steps.size()) + "/" +
                   std::to_string(l.program.nodes.size()) + " nodes, slots " + std::to_string(plan->slots.size()) +
                   ", arena " + std::to_string(plan->arena_bytes) + " B, naive " + std::to_string(plan->naive_bytes) +
                   " B, peak live " + std::to_string(plan->peak_live_bytes) + " B\n";
        }
      }
    }
  MESSAGE("arena vs naive (bytes, alignment 256):\n" << table);
}

// layout_arena alone (make_plan's memory plan and the GPU engine's): buffers
// whose step ranges meet never share a byte, the arena is the highest end
// and no smaller than the most bytes live at one step.
TEST_CASE("plan: layout_arena keeps live buffers apart and reaches the live peak where first use would not") {
  auto check = [](const std::vector<std::uint64_t>& bytes, const std::vector<std::int64_t>& first,
                  const std::vector<std::int64_t>& last) {
    const ArenaLayout l = layout_arena(bytes, first, last);
    REQUIRE(l.offsets.size() == bytes.size());
    std::uint64_t top = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      top = std::max(top, l.offsets[i] + bytes[i]);
      for (std::size_t j = 0; j < i; ++j)
        if (first[i] <= std::max(first[j], last[j]) && first[j] <= std::max(first[i], last[i]) && bytes[i] > 0 &&
            bytes[j] > 0) {
          CAPTURE(i);
          CAPTURE(j);
          CHECK((l.offsets[i] + bytes[i] <= l.offsets[j] || l.offsets[j] + bytes[j] <= l.offsets[i]));
        }
    }
    CHECK(top == l.arena_bytes);
    // The most bytes live at one step, step by step.
    std::uint64_t most = 0;
    for (std::int64_t s = 0; s < 128; ++s) {
      std::uint64_t live = 0;
      for (std::size_t i = 0; i < bytes.size(); ++i)
        if (first[i] <= s && s <= std::max(first[i], last[i])) live += bytes[i];
      most = std::max(most, live);
    }
    CHECK(l.peak_live_bytes == most);
    CHECK(l.arena_bytes >= l.peak_live_bytes);
    return l;
  };
  // Random lifetimes and 256-byte multiples (seeded): the invariants above,
  // offsets stay multiples of the sizes' alignment.
  std::mt19937 rng(20261206);
  for (int round = 0; round < 300; ++round) {
    const std::size_t n = 1 + rng() % 60;
    std::vector<std::uint64_t> bytes(n);
    std::vector<std::int64_t> first(n), last(n);
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i] = 256 * (rng() % 4096);
      first[i] = static_cast<std::int64_t>(rng() % 100);
      last[i] = first[i] + static_cast<std::int64_t>(rng() % 20);
    }
    CAPTURE(round);
    const ArenaLayout l = check(bytes, first, last);
    for (auto o : l.offsets) CHECK(o % 256 == 0);
  }
  // Placed in order of first use, a wide buffer made after a narrow one
  // died goes above the narrow one still alive (4 units); largest first
  // fits the live peak: A (1 unit, steps 0-1) and B (1 unit, 0-3), then C
  // (2 units, 2-3) -- at most B + C = 3 units live. (The GPU engine placed
  // by first use until 2026-12-06: BERT bf16 32x128's activation arena was
  // 73.5 MiB against PyTorch eager's 54.5, bench/RESULTS.md.)
  const std::uint64_t u = 1 << 20;
  const ArenaLayout abc = check({u, u, 2 * u}, {0, 0, 2}, {1, 3, 3});
  CHECK(abc.peak_live_bytes == 3 * u);
  CHECK(abc.arena_bytes == abc.peak_live_bytes);
  // A range that ends before it starts lives at its first step: it meets
  // a buffer of that step, not one of the step before.
  const ArenaLayout rev = check({u, u, u}, {3, 3, 2}, {1, 3, 2});
  CHECK(rev.peak_live_bytes == 2 * u);
  CHECK(rev.arena_bytes == 2 * u);
  // Nothing to place; empty buffers take no room; past 2^64 bytes is no layout.
  CHECK(layout_arena({}, {}, {}).arena_bytes == 0);
  CHECK(layout_arena({0, 0}, {0, 0}, {1, 1}).arena_bytes == 0);
  const std::uint64_t half = std::uint64_t{1} << 63;
  CHECK(layout_arena({half, half}, {0, 0}, {1, 1}).arena_bytes == ~std::uint64_t{0});
}

TEST_CASE("plan: views get PyTorch's strides (recorded tensor_meta) where their base has PyTorch's layout") {
  // Static programs: recorded strides are numbers. Dims of size 1 carry no
  // stride information (PyTorch leaves any value there).
  std::size_t compared = 0;
  for (const char* m : {"mlp", "cnn", "gpt2"})
    for (const char* ir : {"train", "core"}) {
      Loaded l = load_program(std::string(m) + "." + ir + ".pt2");
      ExecutionPlan plan = plan_for(l.program, {});
      auto recorded = [&](std::int32_t v) {
        std::vector<std::int64_t> st;
        for (const auto& s : l.program.values[static_cast<std::size_t>(v)].strides) st.push_back(s.value);
        return st;
      };
      auto same = [&](std::int32_t v) {
        const ConcreteShape& cs = plan.shapes[static_cast<std::size_t>(v)];
        auto rs = recorded(v);
        if (rs.size() != cs.strides.size()) return false;
        for (std::size_t d = 0; d < rs.size(); ++d)
          if (cs.sizes[d] > 1 && rs[d] != cs.strides[d]) return false;
        return true;
      };
      for (const Step& s : plan.steps) {
        if (s.kind != StepKind::kView || !same(s.inputs[0])) continue;
        for (auto o : s.outputs) {
          CAPTURE(l.program.value_names[static_cast<std::size_t>(o)]);
          CHECK(same(o));
          ++compared;
        }
      }
    }
  CHECK(compared > 20);
  MESSAGE("view outputs compared with PyTorch's recorded strides: " << compared);
}

TEST_CASE("plan: fuse=false is one step per node (the force_eager baseline)") {
  Loaded l = load_program("gpt2.core.pt2");
  PlanOptions o;
  o.fuse = false;
  ExecutionPlan plan = plan_for(l.program, {}, o);
  REQUIRE(plan.steps.size() == l.program.nodes.size());
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    REQUIRE(plan.steps[s].nodes.size() == 1);
    CHECK(plan.steps[s].nodes[0] == static_cast<std::int32_t>(s));
    if (plan.steps[s].kind == StepKind::kFused) CHECK(plan.steps[s].ops.size() == 1);
    if (plan.steps[s].kind == StepKind::kGemm) CHECK(plan.steps[s].ops.empty());
  }
  CHECK(count_steps(plan, StepKind::kAttention) == 0);  // the decomposed attention stays op by op
  CHECK(count_steps(plan, StepKind::kGemm) == ops_json("gpt2", "core", "torch.ops.aten.addmm.default") +
                                                  ops_json("gpt2", "core", "torch.ops.aten.mm.default") +
                                                  ops_json("gpt2", "core", "torch.ops.aten.bmm.default"));
  // Fused plans need less memory than eager ones here.
  ExecutionPlan fused = plan_for(l.program, {});
  CHECK(fused.naive_bytes < plan.naive_bytes);
}

TEST_CASE("plan: GEMM epilogues where the programs have them (counts from the recorded op lists)") {
  // mlp is Linear-GELU-Linear-GELU-Linear (its README): each GELU follows a
  // GEMM; cnn's ReLUs follow BatchNorm, not a GEMM; gpt2's two GELUs follow
  // c_fc (a GEMM) in both IRs.
  for (const char* ir : {"train", "core"}) {
    CAPTURE(ir);
    Loaded mlp = load_program(std::string("mlp.") + ir + ".pt2");
    ExecutionPlan p = plan_for(mlp.program, {});
    const std::uint32_t gemms =
        ops_json("mlp", ir, "torch.ops.aten.linear.default") + ops_json("mlp", ir, "torch.ops.aten.addmm.default");
    CHECK(count_steps(p, StepKind::kGemm) == gemms);
    CHECK(gemm_with(p, EwOp::kGelu) == ops_json("mlp", ir, "torch.ops.aten.gelu.default"));
    CHECK(count_steps(p, StepKind::kFused) == 0);  // no GELU left on its own

    Loaded cnn = load_program(std::string("cnn.") + ir + ".pt2");
    ExecutionPlan c = plan_for(cnn.program, {});
    CHECK(count_steps(c, StepKind::kConv) == ops_json("cnn", ir, "torch.ops.aten.conv2d.default") +
                                                 ops_json("cnn", ir, "torch.ops.aten.convolution.default"));
    CHECK(count_steps(c, StepKind::kNorm) ==
          ops_json("cnn", ir, "torch.ops.aten.batch_norm.default") +
              ops_json("cnn", ir, "torch.ops.aten._native_batch_norm_legit_no_training.default"));
    CHECK(gemm_with(c, EwOp::kRelu) == 0);
    CHECK(count_steps(c, StepKind::kFused) ==
          ops_json("cnn", ir, "torch.ops.aten.relu_.default") + ops_json("cnn", ir, "torch.ops.aten.relu.default"));

    Loaded gpt = load_program(std::string("gpt2.") + ir + ".pt2");
    ExecutionPlan g = plan_for(gpt.program, {});
    CHECK(gemm_with(g, EwOp::kGeluTanh) == ops_json("gpt2", ir, "torch.ops.aten.gelu.default"));
  }
  // gpt2 core: the 3-D linears of the train IR (attention c_proj, 2 blocks)
  // become bmm + view + add(bias): the bias comes back as an epilogue. Those
  // bmms are the ones the attention steps do not take (2 per SDPA).
  Loaded core = load_program("gpt2.core.pt2");
  ExecutionPlan g = plan_for(core.program, {});
  const std::uint32_t sdpa = ops_json("gpt2", "train", "torch.ops.aten.scaled_dot_product_attention.default");
  const std::uint32_t bmm = ops_json("gpt2", "core", "torch.ops.aten.bmm.default");
  CHECK(gemm_with(g, EwOp::kAdd) == bmm - 2 * sdpa);
  for (const Step& s : g.steps) {
    if (s.kind != StepKind::kGemm) continue;
    // The first epilogue op reads the GEMM result, each later one the op before it.
    for (std::size_t k = 0; k < s.ops.size(); ++k) {
      const FusedOp& f = s.ops[k];
      const auto reads = [&](FusedOperand::Kind kind) {
        return std::any_of(f.in.begin(), f.in.end(), [&](const FusedOperand& o) { return o.kind == kind; });
      };
      CHECK(reads(k == 0 ? FusedOperand::Kind::kAccumulator : FusedOperand::Kind::kTemp));
      if (f.op == EwOp::kAdd) {  // the other operand is the [N] bias
        const auto it = std::find_if(f.in.begin(), f.in.end(),
                                     [](const FusedOperand& o) { return o.kind == FusedOperand::Kind::kInput; });
        REQUIRE(it != f.in.end());
        const auto bias = s.inputs[static_cast<std::size_t>(it->index)];
        CHECK(g.shapes[static_cast<std::size_t>(bias)].sizes.size() == 1);
      }
    }
  }
}

TEST_CASE("plan: attention — SDPA in the train IR, the decomposed pattern matched back in the core IR") {
  Loaded train = load_program("gpt2.train.pt2");
  Loaded core = load_program("gpt2.core.pt2");
  ExecutionPlan t = plan_for(train.program, {});
  ExecutionPlan c = plan_for(core.program, {});
  const std::uint32_t sdpa = ops_json("gpt2", "train", "torch.ops.aten.scaled_dot_product_attention.default");
  REQUIRE(sdpa > 0);
  CHECK(count_steps(t, StepKind::kAttention) == sdpa);
  CHECK(count_steps(c, StepKind::kAttention) == sdpa);
  // No softmax is left on its own in the core plan: each went into an attention step.
  CHECK(count_steps(c, StepKind::kSoftmax) == 0);
  std::vector<const Step*> ta, ca;
  for (const auto& s : t.steps)
    if (s.kind == StepKind::kAttention) ta.push_back(&s);
  for (const auto& s : c.steps)
    if (s.kind == StepKind::kAttention) ca.push_back(&s);
  REQUIRE(ta.size() == ca.size());
  for (std::size_t i = 0; i < ta.size(); ++i) {
    const AttentionInfo &a = ta[i]->attention, &b = ca[i]->attention;
    CHECK(ta[i]->nodes.size() == 1);
    CHECK(ca[i]->nodes.size() > 10);
    // Same q/k/v shapes; the decomposition's two scale constants multiply to
    // SDPA's default scale.
    for (auto [x, y] : {std::pair{a.query, b.query}, std::pair{a.key, b.key}, std::pair{a.value, b.value}})
      CHECK(t.shapes[static_cast<std::size_t>(x)].sizes == c.shapes[static_cast<std::size_t>(y)].sizes);
    CHECK(std::fabs(a.scale - b.scale) < 1e-12);
    // Causal: SDPA says so; the decomposition spells it as a mask.
    CHECK((a.is_causal || a.mask >= 0));
    CHECK(b.mask >= 0);
    CHECK(b.zero_fully_masked_rows);
    REQUIRE(ca[i]->outputs.size() == 1);
    CHECK(c.shapes[static_cast<std::size_t>(ca[i]->outputs[0])].sizes ==
          t.shapes[static_cast<std::size_t>(ta[i]->outputs[0])].sizes);
  }
}

TEST_CASE("plan: fused elementwise chains carry their ops as data") {
  Loaded core = load_program("gpt2.core.pt2");
  ExecutionPlan p = plan_for(core.program, {});
  std::size_t multi = 0;
  for (const Step& s : p.steps) {
    if (s.kind != StepKind::kFused) continue;
    REQUIRE_FALSE(s.ops.empty());
    CHECK(s.ops.size() <= p.options.max_fused_ops);
    CHECK(s.ops.size() == s.nodes.size());
    multi += s.ops.size() > 1 ? 1 : 0;
    for (std::size_t k = 0; k < s.ops.size(); ++k)
      for (const auto& in : s.ops[k].in) {
        if (in.kind == FusedOperand::Kind::kTemp) CHECK(in.index < static_cast<std::int32_t>(k));
        if (in.kind == FusedOperand::Kind::kInput) CHECK(in.index < static_cast<std::int32_t>(s.inputs.size()));
        CHECK(in.kind != FusedOperand::Kind::kAccumulator);
      }
    // The last op produces the step's output.
    REQUIRE(s.outputs.size() == 1);
    CHECK(s.ops.back().value == s.outputs[0]);
  }
  CHECK(multi > 0);
  // max_fused_ops bounds every chain.
  PlanOptions o;
  o.max_fused_ops = 1;
  ExecutionPlan one = plan_for(core.program, {}, o);
  for (const Step& s : one.steps)
    if (s.kind == StepKind::kFused) CHECK(s.ops.size() == 1);
}

TEST_CASE("plan: fingerprints cover the program, the symbols and the options") {
  Loaded l = load_program("gpt2_dynbatch.core.pt2");
  // Program::json_sha256 is the SHA-256 of the models/model.json record.
  const std::string mj = test_support::archive_record(data_dir() + "gpt2_dynbatch.core.pt2", "models/model.json");
  CHECK(l.program.json_sha256 == sha256_hex(Bytes(reinterpret_cast<const std::uint8_t*>(mj.data()), mj.size())));

  ExecutionPlan a = plan_for(l.program, {{"idx", {4, 32}}});
  ExecutionPlan a2 = plan_for(l.program, {{"idx", {4, 32}}});
  ExecutionPlan b = plan_for(l.program, {{"idx", {3, 32}}});
  PlanOptions eager;
  eager.fuse = false;
  ExecutionPlan c = plan_for(l.program, {{"idx", {4, 32}}}, eager);
  CHECK(a.fingerprint.size() == 64);
  CHECK(a.fingerprint == a2.fingerprint);
  CHECK(a.fingerprint != b.fingerprint);
  CHECK(a.fingerprint != c.fingerprint);
  CHECK(a.fingerprint == plan_fingerprint(l.program.json_sha256, a.binding, PlanOptions{}));
  CHECK(a.fingerprint != plan_fingerprint(std::string(64, '0'), a.binding, PlanOptions{}));
  // Bigger batch, bigger arena.
  CHECK(b.arena_bytes < a.arena_bytes);
}

TEST_CASE("plan: bind_symbols checks inputs like run_cpu and names the dim") {
  Loaded l = load_program("gpt2_dynbatchseq.core.pt2");
  auto ok = bind_symbols(l.program, {{"idx", {3, 7}}});
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  CHECK(ok->values.size() == 2);
  CHECK(ok->to_string().find("=3;") != std::string::npos);
  CHECK(ok->to_string().find("=7;") != std::string::npos);
  struct Bad {
    Shapes shapes;
    const char* needle;
  };
  for (const Bad& bad :
       {Bad{{{"idx", {65, 7}}}, "dim 0 is 65, outside the range"},
        Bad{{{"idx", {3, 33}}}, "dim 1 is 33, outside the range"},
        Bad{{{"idx", {0, 7}}}, "dim 0 is 0, outside the range"}, Bad{{{"idx", {3}}}, "rank 1"},
        Bad{{}, "missing: input 'idx'"}, Bad{{{"idx", {3, 7}}, {"mask", {3}}}, "'mask' is not an input"}}) {
    CAPTURE(bad.needle);
    auto r = bind_symbols(l.program, bad.shapes);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kInvalidArgument);
    CHECK_MESSAGE(r.error().message().find(bad.needle) != std::string::npos, r.error().message());
  }
  Loaded st = load_program("gpt2.core.pt2");
  auto r = bind_symbols(st.program, {{"idx", {2, 31}}});
  REQUIRE_FALSE(r.has_value());
  CHECK_MESSAGE(r.error().message().find("dim 1 is 31") != std::string::npos, r.error().message());
}

TEST_CASE("plan: infer_shapes and make_plan refuse bad bindings and options") {
  Loaded l = load_program("gpt2_dynbatch.core.pt2");
  auto good = bind_symbols(l.program, {{"idx", {2, 32}}});
  REQUIRE(good.has_value());
  const std::string sym = good->values.begin()->first;
  SymbolBinding missing;
  SymbolBinding unknown = *good;
  unknown.values["s_not_there"] = 1;
  SymbolBinding outside = *good;
  outside.values[sym] = 65;
  for (const auto& [b, needle] : {std::pair{missing, "has no value"}, std::pair{unknown, "not a symbol"},
                                  std::pair{outside, "outside its range"}}) {
    auto r = infer_shapes(l.program, b);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kInvalidArgument);
    CHECK_MESSAGE(r.error().message().find(needle) != std::string::npos, r.error().message());
    auto p = make_plan(l.program, b);
    REQUIRE_FALSE(p.has_value());
    CHECK(p.error().code() == ErrorCode::kInvalidArgument);
  }
  for (std::uint64_t align : {0ull, 8ull, 100ull, 384ull}) {
    PlanOptions o;
    o.alignment = align;
    auto p = make_plan(l.program, *good, o);
    REQUIRE_FALSE(p.has_value());
    CHECK(p.error().code() == ErrorCode::kInvalidArgument);
  }
  PlanOptions zero;
  zero.max_fused_ops = 0;
  CHECK_FALSE(make_plan(l.program, *good, zero).has_value());
  PlanOptions few;
  few.max_slots = 3;
  auto p = make_plan(l.program, *good, few);
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code() == ErrorCode::kLimitExceeded);
  PlanOptions small;
  small.max_arena_bytes = 1024;
  p = make_plan(l.program, *good, small);
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code() == ErrorCode::kLimitExceeded);
  // Not validated.
  auto raw = l.archive.program("model");
  REQUIRE(raw.has_value());
  auto nv = make_plan(**raw, *good);
  REQUIRE_FALSE(nv.has_value());
  CHECK(nv.error().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("plan: a program out of order or cyclic is refused (kMalformed naming node and value)") {
  Loaded l = load_program("mlp.train.pt2");
  REQUIRE(l.program.nodes.size() >= 2);
  SUBCASE("use before definition: two nodes swapped") {
    Program p = l.program;
    std::swap(p.nodes[0], p.nodes[1]);
    auto r = make_plan(p, {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kMalformed);
    CHECK_MESSAGE(r.error().message().find("before any node produces it") != std::string::npos, r.error().message());
  }
  SUBCASE("a cycle: the first node reads the second node's output") {
    Program p = l.program;
    const std::int32_t later = p.nodes[1].outputs.at(0);
    bool patched = false;
    for (auto& a : p.nodes[0].args)
      if (a.kind == Arg::Kind::kTensor && !patched) {
        a.tensor = later;
        patched = true;
      }
    REQUIRE(patched);
    auto r = make_plan(p, {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kMalformed);
    CHECK_MESSAGE(r.error().message().find(p.value_names[static_cast<std::size_t>(later)]) != std::string::npos,
                  r.error().message());
  }
  SUBCASE("a value produced twice") {
    Program p = l.program;
    p.nodes[1].outputs.at(0) = p.nodes[0].outputs.at(0);
    auto r = make_plan(p, {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kMalformed);
    CHECK_MESSAGE(r.error().message().find("a second time") != std::string::npos, r.error().message());
  }
}
