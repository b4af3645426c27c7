// fuzz/fuzz_graph.cpp — the engine's program reader (safeckpt/graph.hpp):
// PT2 archives and ExportedProgram JSON, validation, and the CPU interpreter
// on what validates.
//
// Option byte: bit 0 the payload is a models/<name>.json text (else a whole
// .pt2 archive); bit 1 tiny GraphLimits (depth 16, 64 nodes, 256 values,
// rank 6, 64 Ki elements per tensor); bit 2 after validate(), run the program
// on the CPU interpreter with zero-filled weights and inputs (symbolic dims
// take their range's lower bound, or 2).
//
// Invariants: documented error codes only (no kInternal, a message always);
// refusal_reasons() is empty exactly when validate() succeeds; every node of
// a validated program has a schema and one argument per schema argument; a
// successful run returns one tensor per user output whose bytes match its
// shape and dtype.
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_util.hpp"
#include "safeckpt/graph.hpp"

namespace sc = safeckpt;
namespace sg = safeckpt::graph;
namespace fz = safeckpt::fuzz;

namespace {

using sc::ErrorCode;

void exercise(sg::Program& p, const sg::WeightMap* archive_weights, const sg::GraphLimits& lim, bool run) {
  auto st = sg::validate(p, lim);
  auto reasons = sg::refusal_reasons(p, lim);
  FUZZ_REQUIRE(st.has_value() == reasons.empty(), "validate() and refusal_reasons() disagree");
  if (!st) {
    fz::check_error(
        st.error(),
        {ErrorCode::kMalformed, ErrorCode::kDisallowedOperation, ErrorCode::kLimitExceeded, ErrorCode::kUnsupported},
        "validate");
    return;
  }
  for (const auto& n : p.nodes) {
    FUZZ_REQUIRE(n.schema != nullptr, "validated node '" + n.name + "' has no schema");
    FUZZ_REQUIRE(n.args.size() == n.schema->args.size(), "validated node '" + n.name + "' is not fully bound");
  }
  if (!run) return;
  sg::WeightMap weights;
  std::map<std::string, sg::HostTensor, std::less<>> inputs;
  for (const auto& in : p.inputs) {
    const sg::TensorMeta& m = p.values[static_cast<std::size_t>(in.value)];
    std::vector<std::int64_t> shape;
    std::uint64_t n = 1;
    bool ok = true;
    for (const auto& s : m.sizes) {
      std::int64_t v = s.value;
      if (s.is_symbolic()) {
        v = 2;
        std::string sym = p.sym_values[static_cast<std::size_t>(s.sym)].expr;
        for (const auto& [name, range] : p.range_constraints)
          if (sym.find("'" + name + "'") != std::string::npos && range.first) v = *range.first;
      }
      if (v < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(v), &n) || n > (1u << 16)) ok = false;
      shape.push_back(v);
    }
    if (!ok) return;  // too large to synthesize
    std::vector<std::uint8_t> zeros(n * sc::dtype_size(m.dtype), 0);
    auto t = sg::make_host_tensor(m.dtype, shape, sc::Bytes(zeros.data(), zeros.size()));
    if (!t) return;
    if (in.kind == sg::InputKind::kUserInput) {
      inputs[in.fqn] = *t;
    } else if (archive_weights != nullptr && archive_weights->count(in.fqn)) {
      weights[in.fqn] = archive_weights->at(in.fqn);
    } else {
      weights[in.fqn] = *t;
    }
  }
  sg::GraphLimits rl = lim;
  rl.max_tensor_elements = std::min<std::uint64_t>(rl.max_tensor_elements, 1u << 20);
  rl.max_run_bytes = 64u << 20;
  auto out = sg::run_cpu(p, weights, inputs, rl);
  if (!out) {
    fz::check_error(
        out.error(),
        {ErrorCode::kMalformed, ErrorCode::kInvalidArgument, ErrorCode::kLimitExceeded, ErrorCode::kUnsupported},
        "run_cpu");
    return;
  }
  FUZZ_REQUIRE(out->size() == p.outputs.size(), "run_cpu returned the wrong number of outputs");
  for (const auto& t : *out)
    FUZZ_REQUIRE(t.data && t.data->size() == t.numel() * sc::dtype_size(t.dtype),
                 "output bytes do not match its shape");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fz::Input in = fz::split_input(data, size);
  sg::GraphLimits lim;
  lim.container = sc::fuzz_limits();
  if (in.bit(1)) {
    lim.max_json_depth = 16;
    lim.max_nodes = 64;
    lim.max_values = 256;
    lim.max_rank = 6;
    lim.max_tensor_elements = 1u << 16;
  }
  const std::initializer_list<ErrorCode> parse_codes = {ErrorCode::kMalformed, ErrorCode::kLimitExceeded,
                                                        ErrorCode::kUnsupported};
  if (in.bit(0)) {
    std::string_view text(reinterpret_cast<const char*>(in.data.data()), in.data.size());
    auto p = sg::parse_program_json(text, "model", lim);
    if (!p) {
      fz::check_error(p.error(), parse_codes, "parse_program_json");
      return 0;
    }
    exercise(*p, nullptr, lim, in.bit(2));
    return 0;
  }
  (void)sg::is_pt2_archive(in.data, lim);
  auto a = sg::Pt2Archive::open(in.data, lim);
  if (!a) {
    fz::check_error(a.error(),
                    {ErrorCode::kMalformed, ErrorCode::kLimitExceeded, ErrorCode::kUnsupported,
                     ErrorCode::kDisallowedGlobal, ErrorCode::kDisallowedOperation},
                    "Pt2Archive::open");
    return 0;
  }
  for (const auto& name : a->models()) {
    auto p = a->program(name);
    FUZZ_REQUIRE(p.has_value(), "a listed model has no program");
    auto w = sg::archive_weights(*a, name);
    FUZZ_REQUIRE(w.has_value(), "a listed model has no weights");
    sg::Program copy = **p;
    exercise(copy, &*w, lim, in.bit(2));
  }
  return 0;
}
