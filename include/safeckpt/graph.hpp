// safeckpt/graph.hpp — torch.export programs (PT2 archives) as data: read,
// validate against the op allowlist, bind weights, and run on the CPU
// reference interpreter. Nothing from an archive is ever executed: the graph
// is JSON, the weights are raw bytes (or a checkpoint our loader verified);
// the only pickle reader used is safeckpt::load_bytes (restricted machine).
//
// Sources: ../shared/docs/pt2-format.md (archive layout §1, schema 8.x §2,
// op sets §3, allowlist §5.1); torch 2.11 torch/export/pt2_archive/_package.py,
// torch/_export/serde/schema.yaml and serialize.py.
//
// Accepted archive grammar (open_pt2):
//  1. A zip (safeckpt/zip.hpp: CRC checked, no anomaly allowed) whose records
//     all lie under one root folder (the file's stem; not a fixed name).
//  2. `<root>/archive_format` is exactly "pt2" and `<root>/archive_version`
//     exactly "0" (torch 2.11 `load_pt2`); `byteorder`, if present, "little".
//  3. Models: every record `<root>/models/<name>.json` (name non-empty, no '/').
//     An archive with `data/aotinductor/` records or any `.so`/`.cubin`/
//     `.cpp`/`.py` record is code: refused with kUnsupported (§1.5).
//  4. `data/weights/<name>_weights_config.json` and
//     `data/constants/<name>_constants_config.json`: {"config": {FQN: {
//     "path_name": str, "is_param": bool, "use_pickle": bool,
//     "tensor_meta": TensorMeta|null}}} (legacy names `<name>_model_param_config.json`
//     and `<name>_model_constants_config.json` are read when the current ones are
//     absent, as the 2.11 header still lists them); the record is
//     `data/weights/<path_name>` / `data/constants/<path_name>`; path_name
//     must be `weight_<n>` / `tensor_<n>` (no '/', no '..').
//     use_pickle:false: the record holds the raw little-endian storage; its
//     size is a multiple of the element size and the view (sizes, strides,
//     storage_offset; all static, >= 0) lies inside it, like checkpoint views
//     (safeckpt/checkpoint.hpp). Entries naming one record share one storage
//     (ArchiveTensor::storage is equal for them).
//     use_pickle:true: the record is loaded with safeckpt::load_bytes (the
//     restricted loader, default allowlist) and must be a single tensor.
//  5. The JSON (below) is parsed with GraphLimits caps.
//  The 2.6/2.7 flat layout is read too (torch 2.6 torch/export/__init__.py
//  save(); 2.11's load() still falls back to it): a zip WITHOUT a root folder
//  (the only anomaly tolerated) holding `serialized_exported_program.json`
//  (the JSON below; model name "model"), `serialized_state_dict.pt` and
//  `serialized_constants.pt` (optional) — torch.save dicts FQN -> dense
//  tensor read ONLY through safeckpt::load_bytes (restricted loader, default
//  allowlist) — and `version` whose text starts with "8." (2.11 requires the
//  major to equal its own). `serialized_example_inputs.pt` and
//  `extra_files/` are ignored; code records are refused as above.
//  `serialized_exported_program.json` under a root folder is kUnsupported.
//
// Accepted JSON (schema major 8, any minor; pt2-format.md §2):
//  - structs: every required field present with the right JSON type; keys not
//    in the schema are ignored (serialize.py does the same: minor versions add
//    fields);
//  - unions (Argument, SymInt, InputSpec, OutputSpec, ...): exactly one key,
//    a member this reader knows; anything else is kMalformed naming the node
//    and field;
//  - floats: numbers or "Infinity"/"-Infinity"/"NaN";
//  - sizes/strides: {"as_int": n} or {"as_expr": {"expr_str": ...}} where
//    expr_str is a SymPy srepr over Symbol/Integer/Mul/Add (evaluated with an
//    explicit stack, never executed);
//  - node outputs (serialize.py serialize_outputs): one as_tensor, or one
//    as_tensors (Tensor[]), or one as_sym_int (-> SymInt), or one entry per
//    position of a tuple return, each as_tensor, as_none (an undefined
//    tensor) or as_sym_int naming a sym_int_values entry (a SymInt
//    position); validate() checks each position against the schema's type.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"

namespace safeckpt {
class ZipArchive;  // safeckpt/zip.hpp
}  // namespace safeckpt

namespace safeckpt::graph {

// Caps on what a PT2 archive can make us do. Inclusive maxima. Defaults are
// far above the 2.11 corpus (largest model.json 505 KB with 189 nodes and
// nesting depth 11, pt2-format.md §1.3; at most ~200 tensor values, 4 sym
// ints, 2 symbols) and small enough that a hostile file cannot exhaust a
// 24 GiB machine. Hitting one is kLimitExceeded naming the cap.
struct GraphLimits {
  Limits container;                            // zip / pickle caps for the archive itself
  std::uint64_t max_json_bytes = 64ull << 20;  // one models/*.json or config record
  std::uint64_t max_json_depth = 64;           // nesting of arrays/objects (real: 11)
  std::uint64_t max_nodes = 1u << 18;          // graph nodes
  std::uint64_t max_values = 1u << 20;         // tensor_values + sym_int_values entries
  std::uint64_t max_inputs = 1u << 18;         // signature input specs (weights + user inputs)
  std::uint64_t max_args = 64;                 // arguments of one node (largest schema: ~10)
  std::uint64_t max_list_items = 1u << 16;     // items of one list argument
  std::uint64_t max_rank = 16;                 // tensor rank in a program (CPU interpreter loops)
  std::uint64_t max_expr_bytes = 4096;         // one srepr expression
  std::uint64_t max_symbols = 1024;            // range_constraints entries
  // Elements of one tensor the interpreter may create (2^32 elements = 16 GiB
  // of float32), and bytes all live tensors of one run may hold.
  std::uint64_t max_tensor_elements = 1ull << 32;
  std::uint64_t max_run_bytes = 16ull << 30;
  // Multiply-adds one run_cpu() may do in its heavy kernels (matrix
  // products, convolutions, attention, pooling windows; every other kernel
  // is linear in the bytes max_run_bytes bounds). 2^42 = 4.4e12: BERT-base
  // at 32 x 128 tokens is ~3.6e11, GPT-2 124M at 8 x 1024 ~1.2e12 (an hour
  // or more on a CPU); a 5 KB program that asked a 4096 x 4096 convolution
  // of a 4096 x 4096 image for 2.8e14 was days (review, 2026-12-06).
  // Refused in run_cpu's shape pass, before any kernel runs; check_shapes()
  // and validation do not count it.
  std::uint64_t max_run_macs = 1ull << 42;
  // Bytes the dense copies of one weights/constants config may hold beyond
  // the records they view: a view covers its record about once (a tied
  // weight once per name), so more than kViewAmplification times the
  // records' bytes plus this slack is a file whose stride-0 or overlapping
  // views promise far more memory than it holds (a 3.7 KB archive asking
  // for 12 GiB, review 2026-12-06): kLimitExceeded before any copy.
  std::uint64_t max_view_slack_bytes = 64ull << 20;
  static constexpr std::uint64_t kViewAmplification = 4;
};

// True when `file` is a zip whose root holds `archive_format` (torch 2.11
// `is_pt2_package`), or a zip without root folder holding
// `serialized_exported_program.json` (the 2.6/2.7 flat layout). Cheap; opens
// the central directory only.
bool is_pt2_archive(Bytes file, const GraphLimits& limits = {});

// True when `name` (a record name, full or relative to the root) is code that
// an AOTInductor package loads or compiles (pt2-format.md §1.5; torch 2.11
// torch/_inductor/package/package.py writes `data/aotinductor/<model>/` with
// the shared library, its C++ source, kernels and object files): anything
// under `data/aotinductor/`, and the extensions .so .dll .dylib .o .obj .a
// .cubin .ptx .fatbin .hsaco .spv .cpp .cc .cxx .cu .c .h .hpp .py .pyc.
// The engine refuses archives holding one; the scanner reports each.
bool is_code_record(std::string_view name);

// ---------------------------------------------------------------- the IR

// A size, stride or SymInt argument: a constant, or a reference to a symbolic
// value (index into Program::sym_values).
struct SymInt {
  std::int64_t value = 0;
  std::int32_t sym = -1;  // >= 0: Program::sym_values[sym]
  bool is_symbolic() const noexcept { return sym >= 0; }
};

// A symbolic int: either a graph value produced by a node (sym_size.int,
// _operator.mul; `producer` >= 0) or an expression that appears in a
// tensor_meta. `expr` is the srepr text (never executed).
struct SymValue {
  std::string name;  // sym_int_values key, or "" for anonymous size expressions
  std::string expr;  // srepr, e.g. "Mul(Integer(4), Symbol('s95', ...))"
  // The example value PyTorch recorded (SymExprHint as_int), if any: the
  // shape pass of check_shapes() runs the program at these sizes.
  std::optional<std::int64_t> hint;
};

// TensorMeta (schema.yaml): dtype, sizes, strides, storage_offset. Layout is
// always strided (others refused at parse time).
struct TensorMeta {
  DType dtype = DType::kFloat32;
  std::vector<SymInt> sizes;
  std::vector<SymInt> strides;
  SymInt storage_offset;
  bool requires_grad = false;
  std::string device;  // "cpu", "cuda", "cuda:0" (remapped by the engine)
};

// One argument value, after binding to the op's schema.
struct Arg {
  enum class Kind : std::uint8_t {
    kNone,
    kTensor,        // tensor = value id
    kTensors,       // tensors (value ids; -1 for None in optional lists)
    kInt,           // ints[0] (may be symbolic)
    kInts,          // ints
    kFloat,         // f
    kFloats,        // floats
    kBool,          // b
    kBools,         // bools
    kString,        // s
    kScalarType,    // dtype
    kLayout,        // code (7 = strided)
    kMemoryFormat,  // code
    kDevice,        // s
  };
  Kind kind = Kind::kNone;
  std::int32_t tensor = -1;
  std::vector<std::int32_t> tensors;
  std::vector<SymInt> ints;
  double f = 0;
  std::vector<double> floats;
  bool b = false;
  std::vector<bool> bools;
  std::string s;
  DType dtype = DType::kFloat32;
  std::int64_t code = 0;
};

struct OpSchema;  // an entry of allowlist/ops.schema (below)

struct Node {
  std::string name;                  // Node.name (FX node name)
  std::string target;                // "torch.ops.aten.addmm.default", "_operator.mul"
  std::string op;                    // schema name "aten::addmm" / "aten::add.Tensor" / "_operator.mul"
  const OpSchema* schema = nullptr;  // nullptr until validate() (or when not allowlisted)
  // Arguments by schema position (defaults filled in) after validate();
  // before, in file order with `arg_names`.
  std::vector<Arg> args;
  std::vector<std::string> arg_names;
  // Outputs: tensor value ids (-1 for an output the op has but the graph does
  // not name: `as_none`, and the SymInt positions below) or a sym value id
  // for ops returning SymInt.
  std::vector<std::int32_t> outputs;
  std::int32_t sym_output = -1;
  // Tuple returns that mix tensors and SymInts (serialize.py writes each
  // position as as_tensor / as_none / as_sym_int, e.g. max_q, max_k of
  // _scaled_dot_product_cudnn_attention): per output position the sym value
  // id of an `as_sym_int`, -1 elsewhere; empty when the node has none.
  std::vector<std::int32_t> output_syms;
  bool outputs_as_list = false;  // `as_tensors` (split)
};

enum class InputKind : std::uint8_t { kParameter, kBuffer, kConstant, kUserInput };
struct GraphInput {
  InputKind kind;
  std::int32_t value = -1;  // tensor value id
  std::string fqn;          // state_dict key (parameter/buffer/constant), or the user input name
  bool persistent = true;   // buffers: false = non-persistent (lives in constants)
};

struct Program {
  std::string model_name;  // "model"
  std::int64_t schema_major = 0, schema_minor = 0;
  std::string torch_version;
  // SHA-256 hex of the models/<name>.json bytes this program was parsed from
  // (set by parse_program_json): the program part of plan fingerprints and
  // compile-cache keys (safeckpt/graph_plan.hpp).
  std::string json_sha256;
  std::vector<std::string> value_names;  // tensor value id -> name
  std::vector<TensorMeta> values;        // tensor value id -> recorded meta
  std::vector<SymValue> sym_values;
  std::map<std::string, std::pair<std::optional<std::int64_t>, std::optional<std::int64_t>>>
      range_constraints;  // symbol -> [min, max] (nullopt = unbounded)
  std::vector<Node> nodes;
  std::vector<GraphInput> inputs;     // signature order
  std::vector<std::int32_t> outputs;  // user outputs: tensor value ids
  std::vector<std::string> refusals;  // unsupported signature features found while parsing (validate reports)
  // Op histogram: target -> count.
  std::map<std::string, std::uint32_t> op_histogram() const;
  std::int32_t find_value(std::string_view name) const;  // -1 if absent
};

// A dense, row-major, owned host tensor (what the interpreter computes on).
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::shared_ptr<std::vector<std::uint8_t>> data;  // numel * dtype_size bytes
  std::uint64_t numel() const noexcept;
  Bytes bytes() const noexcept { return data ? Bytes(*data) : Bytes(); }
};

// One weight or constant stored in an archive.
struct ArchiveTensor {
  std::string fqn;
  bool is_param = false;
  bool is_constant = false;  // from data/constants
  std::string record;        // full record name
  TensorMeta meta;
  HostTensor tensor;          // dense row-major copy of the view (the CPU interpreter's input; one per FQN)
  std::int32_t storage = -1;  // index of the shared record (tied weights share it)
  bool pickled = false;       // use_pickle: true (read through safeckpt::load_bytes)
};

// A parsed archive: programs plus their weights.
class Pt2Archive {
 public:
  // Opens from bytes (BORROWED: keep alive while the archive is used).
  // Errors: kMalformed (zip damage or anomalies, bad JSON, view outside its
  // record, ...), kUnsupported (not a PT2 archive, AOTInductor code, flat
  // 2.6/2.7 layout, schema major != 8, big-endian, non-strided layout),
  // kLimitExceeded (a GraphLimits cap), and the restricted loader's errors
  // for use_pickle payloads (kDisallowedGlobal, ...).
  static Result<Pt2Archive> open(Bytes file, const GraphLimits& limits = {});
  static Result<Pt2Archive> open_file(const std::filesystem::path& path, const GraphLimits& limits = {});

  const std::vector<std::string>& models() const noexcept { return model_names_; }
  // The program of `model` ("model" is what torch.export.save writes). Errors:
  // kInvalidArgument (no such model).
  Result<const Program*> program(std::string_view model = "model") const;
  // Weights (data/weights) and constants (data/constants) of `model`, by FQN.
  Result<const std::vector<ArchiveTensor>*> weights(std::string_view model = "model") const;

 private:
  Status open_flat(const ZipArchive& zip, const GraphLimits& limits);  // the 2.6/2.7 layout

  std::shared_ptr<MappedFile> file_;
  std::vector<std::string> model_names_;
  std::vector<std::unique_ptr<Program>> programs_;
  std::vector<std::vector<ArchiveTensor>> weights_;
};

// Parses one ExportedProgram JSON (models/<name>.json) into the IR. Errors as
// Pt2Archive::open. Exposed for tests and fuzzers.
Result<Program> parse_program_json(std::string_view json, std::string_view model_name, const GraphLimits& limits = {});

// ------------------------------------------------- op schemas and validation

// One allowlisted op: its PyTorch schema (argument names, types, defaults)
// from allowlist/ops.schema.
struct OpArgSchema {
  enum class Type : std::uint8_t {
    kTensor,
    kTensorList,
    kOptTensorList,
    kInt,
    kIntList,
    kFloat,
    kBool,
    kScalar,
    kScalarType,
    kLayout,
    kDevice,
    kMemoryFormat,
    kString,
  };
  std::string name;
  Type type = Type::kTensor;
  bool optional = false;
  bool kwarg_only = false;
  bool has_default = false;
  Arg default_value;  // when has_default
};
struct OpSchema {
  std::string name;  // "aten::add.Tensor", "_operator.mul"
  std::vector<OpArgSchema> args;
  std::uint32_t num_outputs = 1;  // fixed outputs; 0 for `-> ()`
  bool returns_list = false;      // `Tensor[]`
  bool returns_symint = false;    // `-> SymInt`
  // Tuple returns: true at the positions typed SymInt (`SymInt max_q`);
  // empty when every position is a Tensor.
  std::vector<bool> symint_returns;
  bool inplace = false;  // mutates its first argument (`Tensor(a!)`)
  // Its result may be (a view of) its first argument: `-> Tensor(a)` in the
  // schema, and aten::dropout (train=False returns the input). validate()
  // follows these from an in-place op's argument to the bases it mutates.
  bool aliases_input = false;
  std::string note;  // restriction text from the allowlist
};

// The embedded allowlist (allowlist/ops.schema), parsed once.
const std::vector<OpSchema>& op_allowlist();
// Parses an ops file (same grammar as allowlist/ops.schema). Errors: kMalformed.
Result<std::vector<OpSchema>> parse_op_allowlist(std::string_view text);
// Maps a JSON target to its schema name: "torch.ops.aten.add.Tensor" ->
// "aten::add.Tensor", "torch.ops.aten.addmm.default" -> "aten::addmm";
// other strings unchanged.
std::string schema_name_for_target(std::string_view target);

// Shape pass (no values computed): runs the program at its example sizes
// (every symbol at its recorded hint; weights from their recorded meta),
// propagating dtypes and shapes through every kernel's shape logic and
// comparing each output with its recorded tensor_meta (dtype, sizes and
// strides: view ops — permute, transpose, unsqueeze, expand, split, slice,
// select, view/flatten/reshape — must record the strides ATen's formulas give
// from their input's recorded strides, every other op a non-overlapping dense
// layout, as PyTorch allocates fresh results; dims of size 1 and empty
// tensors are not compared); also checks the live
// tensors fit GraphLimits::max_run_bytes at that size. run_cpu() does the same
// pass at the bound input sizes before computing anything.
// Errors: kMalformed (disagreement, naming node and value; a symbolic input
// size without a hint), kLimitExceeded, kUnsupported.
Status check_shapes(const Program& program, const GraphLimits& limits = {});

// Binds every node's arguments to its schema (defaults filled in), and
// refuses — kDisallowedOperation, naming the node, the op and what to do —
// any op not in the allowlist (other ATen ops, higher-order ops, custom
// namespaces), in-place ops on a value that is - or, through ops returning
// an alias of their input (OpSchema::aliases_input), views - a graph input,
// a graph output or a value another node reads, training-mode
// batch_norm/dropout, dropout_p != 0, unbacked symbols, and signature
// entries other than parameter/buffer/constant/user input and user output.
// kMalformed for arguments of the wrong type or count.
// When nothing else is wrong, the shape pass (check_shapes) runs too, so a
// program whose tensor_meta the engine cannot reproduce is refused
// (kMalformed) before anything runs; it may also return kLimitExceeded
// (tensors beyond GraphLimits at the example sizes) and kUnsupported (an
// argument combination no kernel implements).
// Every reason is collected; the error carries the first and the count.
Status validate(Program& program, const GraphLimits& limits = {});
// Every reason validate() would give, one per line (empty when accepted).
std::vector<std::string> refusal_reasons(Program& program, const GraphLimits& limits = {});

// One reason, typed (what `safeckpt scan` maps to its rules). `message` is
// the text refusal_reasons() gives.
struct Refusal {
  enum class Kind : std::uint8_t {
    kOpNotAllowed,  // an aten op not in allowlist/ops.schema
    kHigherOrder,   // torch.ops.higher_order.* (cond, while_loop, wrap, triton kernels)
    kCustomOp,      // an op of another namespace (torch.ops.<ns>.*, not aten)
    kMutation,      // in-place update of an input/buffer, or a mutation output spec
    kPolicy,        // any other engine restriction (training mode, unbacked symbols, signature kinds)
    kMalformed,     // broken structure or a tensor_meta the shape pass cannot reproduce
  };
  Kind kind = Kind::kMalformed;
  std::string node;    // FX node name; empty when the reason is not about one node
  std::string target;  // the node's target string; empty likewise
  std::string message;
};
// Same reasons as refusal_reasons(), in the same order, typed.
std::vector<Refusal> refusals(Program& program, const GraphLimits& limits = {});

// ------------------------------------------------------------- running

// Weights for a program: FQN -> tensor.
using WeightMap = std::map<std::string, HostTensor, std::less<>>;

// The archive's own weights and constants for `model`.
Result<WeightMap> archive_weights(const Pt2Archive& archive, std::string_view model = "model");
// Weights from a checkpoint loaded by our loader (.pt, .safetensors, index),
// bound by state_dict key like load_state_dict(strict=True): every
// parameter/buffer/constant of the program must be present with the recorded
// dtype, shape and strides (every dim of size > 1; a checkpoint tensor laid
// out otherwise, e.g. saved from a transposed view, is refused: the engine
// binds the program's recorded layout); names the program does not take are
// reported too.
// `fallback` (optional) supplies entries the checkpoint lacks that are
// constants / non-persistent buffers (which state_dict() does not save).
// Errors: kInvalidArgument naming every missing, unexpected and misshapen
// name; kLimitExceeded.
Result<WeightMap> checkpoint_weights(const Program& program, const Checkpoint& ckpt,
                                     const WeightMap* fallback = nullptr, const GraphLimits& limits = {});

// Binds `weights` to the validated program's parameters, buffers and
// constants as run_cpu() does before anything runs (dtype, rank, every dim
// against the recorded tensor_meta; every one present), without inputs or
// kernels: what `safeckpt scan` checks so that it never calls clean an
// archive whose weights `run` refuses (review, 2026-12-06). Errors:
// kInvalidArgument (naming the weight; "missing: ..."), kUnsupported.
Status check_weights(const Program& program, const WeightMap& weights, const GraphLimits& limits = {});

// Runs a validated program on the CPU reference interpreter. `inputs` maps
// user input names to tensors; each is checked (dtype, rank, static dims,
// dynamic dims within range_constraints, one value per symbol) before
// anything runs. A shape pass at the bound sizes (see check_shapes) runs
// first, then the values; after every node its outputs are compared with the
// recorded tensor_meta (dtype, sizes and strides as in check_shapes,
// symbolic sizes evaluated) — a
// disagreement refuses the program (kMalformed naming the node). Index-taking ops check
// every index (kMalformed naming the node and the index).
// Returns the user outputs in signature order.
// Errors: kInvalidArgument (inputs/weights missing or wrong), kMalformed,
// kLimitExceeded (max_tensor_elements, max_run_bytes), kUnsupported (a
// dtype/argument combination the interpreter does not implement: named).
Result<std::vector<HostTensor>> run_cpu(const Program& program, const WeightMap& weights,
                                        const std::map<std::string, HostTensor, std::less<>>& inputs,
                                        const GraphLimits& limits = {});

// Dense tensor from little-endian bytes (copied). Errors: kInvalidArgument
// (size mismatch), kLimitExceeded.
Result<HostTensor> make_host_tensor(DType dtype, std::vector<std::int64_t> shape, Bytes bytes);

}  // namespace safeckpt::graph
