// safeckpt/engine.hpp — the compiled execution engine (issue 14): a validated
// PT2 program (safeckpt/graph.hpp) planned for one CUDA device and run on
// device tensors, with the weights read in place from a DeviceCheckpoint
// (safeckpt/device_checkpoint.hpp) or uploaded once from the archive.
//
// Only in safeckpt::engine (link safeckpt::engine, built with safeckpt::cuda);
// this header includes no CUDA header (device pointers are void*, streams are
// not exposed). Nothing from the program file is ever compiled: generated
// kernels come from templates in src/engine/fused.cpp whose only parameters
// are op codes, numbers and dtypes taken from the validated IR.
//
// What a plan is (per concrete input shape; src/engine/plan.cpp):
//  1. Symbols bound from the user inputs' sizes (range_constraints checked:
//     an out-of-range size is refused before anything is launched) and every
//     value's concrete shape evaluated from its validated tensor_meta.
//  2. Steps in program order: view ops (view, reshape, flatten, unsqueeze,
//     permute, transpose, expand, split, split_with_sizes, slice.Tensor,
//     select.int; bounds as aten's TensorShape.cpp) are strided aliases and
//     launch nothing (a view of a non-contiguous tensor that needs new
//     strides is a copy); GEMMs (linear, addmm, mm, bmm) through cuBLASLt
//     with the bias in the epilogue and, when compiled, a following
//     gelu(approximate='tanh') or relu fused into it, or a following
//     residual add (add.Tensor, alpha 1, reached through inference dropout
//     and views; the other operand of the same shape, dtype and dense
//     layout, computed before the GEMM) as cuBLASLt's C input with beta 1:
//     D = A B + residual + bias in one rounding where PyTorch rounds the
//     GEMM's result first (results can differ in the last bit); when
//     compiled, linears that read one input with checkpoint weights
//     (query / key / value) as one GEMM (EngineOptions::fuse_sibling_gemms);
//     layer_norm (last dims; one warp per row with the row in registers up
//     to 1024 elements of 4-element-aligned rows),
//     _softmax (last dim), any.dim / mean.dim, embedding, gather and
//     index.Tensor (integer indices on the leading dims; indices checked on
//     the device: an out-of-range index is an error, not a fault), cat (one
//     copy per input into its slice of the output) and
//     scaled_dot_product_attention (fp32 / bf16, causal and boolean /
//     additive masks broadcast in any dim; see "Attention" below) as fixed
//     kernels; chains of
//     pointwise ops (add, sub, mul.Tensor/Scalar, neg, pow.Tensor_Scalar,
//     rsqrt, silu, sigmoid, tanh, eq/le/ge.Scalar, logical_and/not,
//     bitwise_and, where, gelu, relu, clone, _to_copy / to, dropout (eval),
//     arange, full, full_like, new_ones, scalar_tensor; a Python-number
//     operand is a constant, float for floating results as ATen's opmath) of
//     one shape fused into one kernel generated and compiled with NVRTC;
//     _assert_tensor_metadata is checked when planning and launches nothing.
//
// Attention (aten::scaled_dot_product_attention with query [B,H,L,D], key
// [B,H,S,D], value [B,H,S,Dv], D and Dv <= 128; any strides with a unit last
// dim, other ones are copied first), two lowerings:
//  - materialized, when the float32 scores of ONE batch element, H*L*S*4
//    bytes (bfloat16: H*L*S*6, the probabilities are stored again in
//    bfloat16 for the second GEMM), fit EngineOptions::attention_workspace_
//    bytes (default kDefaultAttentionWorkspaceBytes = 256 MiB): per group of
//    batch elements (as many as fit, a divisor of B; one when the strides of
//    query/key/value do not let b and h collapse into one batch stride)
//    cuBLASLt strided-batched GEMM scores = scale * Q K^T (fp32 accumulate
//    and output; bfloat16 inputs on tensor cores; float32 under the TF32
//    policy below), one kernel for causal / boolean / additive mask +
//    numerically stable softmax (max subtracted; in place in fp32), and a
//    second batched GEMM P V into the output. Causal attention of 512 query
//    rows or more runs both GEMMs per block of about 256 rows (at most 8
//    blocks) over the keys up to the block's last row only (is_causal is
//    top-left: row r keeps keys 0..r), skipping the products the mask
//    discards (62.5 % of them left at 4 blocks). The workspace is a buffer of
//    the activation arena, live during that step only, so ProgramStats::
//    arena_bytes includes it. Heads that step over b and h with two
//    strides go to cuBLASLt as pointer-array batches
//    (EngineOptions::attention_pointer_arrays).
//  - otherwise the flash-style kernel (online softmax, no workspace; blocks
//    of 64 query rows x 64-key tiles in shared memory, fp32 on the CUDA
//    cores for both dtypes, src/engine/kernels_device.cuh).
// bfloat16 on a device with bf16 tensor cores (sm_80+) takes neither: a
// flash kernel on the tensor cores (EngineOptions::attention_tensor_cores,
// src/engine/attention_tc_device.cuh): 64-row blocks and 64-key tiles, Q K^T and
// P V as mma.sync m16n8k16 bf16 products with fp32 accumulation kept in
// registers, two warp groups per block on alternate key tiles, the online
// softmax in fp32,
// the probabilities rounded to bfloat16 for P V (as the materialized path
// and PyTorch's flash kernels); no workspace. Taken first where they apply
// (both on by default, bench/RESULTS.md 2026-12-05 "cuDNN attention and
// 3xTF32"): EngineOptions::cudnn_attention (bfloat16 without a mask other
// than is_causal through cuDNN's fused flash-attention engines, the kernel
// PyTorch picks on sm_90; with EngineOptions::cudnn_attention_masks, also
// on by default, masked ones too) and EngineOptions::attention_3xtf32 (float32 on a
// tensor-core flash kernel in 3xTF32, src/engine/attention_tf32_device.cuh,
// float32 accuracy).
// Both give a row of zeros where every key is masked (the CPU reference's
// and PyTorch's math SDPA rule since _safe_softmax), never NaN. Masked means
// a false bool or an additive -inf: a finite additive value, however
// negative (finfo.min, HF's padding masks), keeps its key, and a row of
// only those gives every key the same weight (the mean of V), as PyTorch
// computes in float32 (src/engine/attention_flash_common.cuh).
//  3. A static activation arena: buffers reused by liveness (greedy by
//     size, graph::layout_arena in safeckpt/graph_plan.hpp);
//     inputs and outputs live in fixed buffers outside it.
//  4. Compiled plans are captured as one CUDA graph and replayed — once
//     their cuDNN graph plans are in (EngineOptions::background_graph_plans:
//     until then their runs go step by step).
//
// The persistent compile cache (safeckpt/compile_cache.hpp; EngineOptions::
// cache, on by default as PyTorch's inductor cache is): what is cached is the
// NVRTC output of each generated module (the cubin of one fused_source, one
// entry per distinct source), and the choices that cost time to make: the
// cuBLASLt algorithm of each GEMM (the heuristic's or the autotuner's
// pick), cuDNN's algorithm for each convolution and cuDNN's own
// serialization of each runtime-compiled graph plan (fused convolution or
// attention), each keyed by everything that decided it and re-checked by
// the library when read (module_cache.hpp choice_cache_key;
// EngineStats::choices_*). The lowered step list, the arena and the CUDA
// graphs are rebuilt per process (they hold device pointers; lowering at a
// warm cache took 1-21 ms of the first call on the real-size programs,
// bench/RESULTS.md 2026-12-06). Two levels: the engine's in-process map
// (source text -> loaded module) first, then the directory.
// Modules' key (src/engine/module_cache.hpp): SHA-256 of the generated source (it is
// made only from the validated plan and is the whole NVRTC input, so equal
// text is an equal module), the device name and sm, the driver and CUDA
// runtime versions, the NVRTC soname major (not nvrtcVersion(): a hit loads
// no NVRTC at all), the engine version with its code-generator revision, and
// the NVRTC flags. A bad entry (MAC mismatch, truncated, other version, a
// cubin the driver refuses) is a miss with a warning: the module is compiled
// again and the entry overwritten. Failing to read or write the cache is a
// warning too, never an error of the run. Entries are written atomically and
// authenticated, so several threads and processes may share one directory.
//
// Convolutional programs (src/engine/conv.cpp, pool_device.cuh): conv2d / convolution
// (2-D, forward, groups, stride, padding, dilation, bias; NCHW, float32 or
// bfloat16) through cuDNN, loaded on the first plan that has one
// (libcudnn.so.<major>; a missing library is a kDevice error naming it), the
// algorithm chosen once per plan by cuDNN's heuristics, its workspace owned
// by the plan; the bias and inference batch_norm (batch_norm with
// training=False, _native_batch_norm_legit_no_training: (x - running_mean) /
// sqrt(running_var + eps) * weight + bias in fp32) are micro-ops of the fused
// pointwise kernels, so a following relu or residual add fuses with them;
// adaptive_avg_pool2d and max_pool2d (values; max_pool2d_with_indices only
// when its indices are not read) as fixed kernels. A plan with cuDNN steps
// runs once eagerly before its CUDA graph is captured.
// Memory format (EngineOptions::conv_layout; inductor's layout_optimization,
// torch/_inductor/config.py, for the same reason): by default a convolution
// cuDNN runs on tensor cores (bfloat16, or float32 under cudnn_allow_tf32)
// reads and writes channels-last tensors (torch.channels_last: N,H,W,C in
// memory), which its tensor-core kernels take without transposing. An NCHW
// operand (the program's input) is copied to channels-last first; pointwise
// kernels, batch_norm, the pools and residual adds keep the layout of their
// channels-last operands (ATen's TensorIterator rule), and whatever needs
// another layout (a view, a GEMM operand, a program output) gets a copy, so
// results are the same tensors in either layout. Each such plan keeps its
// own K,R,S,C copy of every convolution weight, made on the plan's first run
// (ProgramStats::prepared_bytes; the checkpoint's weights stay untouched).
//
// Batch norm folding (EngineOptions::fold_batch_norm; torch/nn/utils/
// fusion.py's fuse_conv_bn_eval, which inductor's freezing applies with
// torch._inductor.config.freezing = True): in a compiled plan, an
// inference batch_norm that is the only reader of a convolution's output,
// with its running statistics (and weight, bias) checkpoint tensors, is
// folded — for a float32 convolution into a copy of the filter and a bias,
// s = weight / sqrt(running_var + eps), filter * s[k], (conv_bias -
// running_mean) * s + bias — written once per plan by a prep step
// (ProgramStats::prepared_bytes; the checkpoint's tensors stay untouched),
// when its result goes only to relu, directly or through an add (alpha 1) of
// a tensor computed before the convolution in the output's layout (a ResNet
// block's residual). The convolution, batch norm, add and relu then run as
// one cuDNN call, cudnnConvolutionBiasActivationForward (what ATen's
// cudnn_convolution_add_relu runs): no pass over the convolution's output.
// Results differ from the unfolded ones by rounding only (the scale
// multiplies the filter instead of the output). bfloat16 convolutions (that
// call takes float32 only; groups 1) keep their filter: the scale and bias
// (float32, made by the same prep step) go into the epilogue of one cuDNN
// operation graph (backend API: conv_fprop, mul, add, [add,] relu, float32
// in between), when cuDNN's heuristics offer an engine for it (and
// EngineOptions::cudnn_graph_fusion) — else the batch norm stays a generated
// kernel. Not folded: force_eager plans.
//
// Not implemented on the GPU (kUnsupported when compiling, naming the node):
// transposed convolutions, float16 and other dtypes than float32 / bfloat16 /
// int64 / bool / int32 for computed values, _softmax over another than the
// last dimension, GQA.
//
// Numerics (TF32 policy): the default follows PyTorch 2.11's defaults
// (docs/source/notes/cuda.rst, "TensorFloat-32 (TF32) on Ampere (and later)
// devices"; torch.backends.cuda.matmul.allow_tf32 = False since 1.12, i.e.
// fp32_precision "ieee" for matmul): float32 GEMMs use
// CUBLAS_COMPUTE_32F (full fp32), never TF32, unless EngineOptions::allow_tf32
// is set (then CUBLAS_COMPUTE_32F_FAST_TF32, like allow_tf32 = True).
// Convolutions follow PyTorch's cuDNN default, torch.backends.cudnn.allow_tf32
// = True (the same notes; unchanged in 2.11): float32 convolutions may use
// TF32 tensor cores (CUDNN_DEFAULT_MATH) unless EngineOptions::
// cudnn_allow_tf32 is false (then CUDNN_FMA_MATH, full fp32, like
// cudnn.allow_tf32 = False — what the corpus's CUDA references were recorded
// with). bfloat16 GEMMs and convolutions accumulate in fp32. Pointwise chains, norms, softmax and attention compute in
// fp32 and round to the value's dtype after every op (what eager PyTorch stores).
//
// Threads and streams: an Engine and its CompiledPrograms may be used from
// one thread at a time each (calls on one CompiledProgram are serialized by
// a mutex; different CompiledPrograms may run concurrently). Each
// CompiledProgram owns one non-blocking CUDA stream. The engine's module map,
// its compile cache use and its counters are guarded by one mutex (two
// programs needing new modules at once get them one after the other).
// EngineOptions::background_graph_plans adds up to 15 threads per plan that
// is building cuDNN graph plans; they only build plans and write the
// compile cache, and a CompiledProgram's destructor (or a plan's LRU
// eviction) waits for the build under way on each. run()
// returns after its outputs are complete on the device (it synchronizes that
// stream); inputs must be complete before run() is called (e.g.
// torch.cuda.synchronize()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/dlpack.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/graph.hpp"
#include "safeckpt/graph_plan.hpp"

namespace safeckpt::engine {

// PyTorch 2.6's torch.compiler.set_stance, in C++: the planner's enum
// (safeckpt/graph_plan.hpp), one spelling for the engine, the cache key and
// the CLI. kDefault compiles on the first call per shape and replays after;
// kForceEager runs one kernel per node, no fusion, no CUDA graph (the
// differential baseline); kEagerThenCompile runs the first call per shape
// eagerly; kFailOnRecompile refuses a shape other than the first compiled
// one, naming the dimension.
using Stance = graph::Stance;
using graph::parse_stance;
using graph::stance_name;

// Whether an Engine uses the persistent compile cache.
enum class CacheMode : std::uint8_t {
  kOff,        // compile in every process; the directory is not opened
  kReadWrite,  // look modules up before NVRTC, store what was compiled
};

// EngineOptions::attention_workspace_bytes by default: 256 MiB, e.g. GPT-2's
// 12 heads at 1024 x 1024 (48 MiB per batch element, float32) for up to 5
// batch elements per group.
inline constexpr std::uint64_t kDefaultAttentionWorkspaceBytes = 256ull << 20;

// EngineOptions::conv_layout.
enum class ConvLayout : std::uint8_t {
  kAuto,          // channels-last where cuDNN uses tensor cores (bfloat16; float32 with cudnn_allow_tf32)
  kNchw,          // contiguous NCHW everywhere
  kChannelsLast,  // channels-last for every convolution (full-fp32 ones too)
};
// "auto", "nchw" or "channels-last" (the CLI's --conv-layout values).
// Errors: kInvalidArgument for any other text (the message lists the three).
Result<ConvLayout> parse_conv_layout(std::string_view text);

struct EngineOptions {
  int device = 0;                    // CUDA device index
  Stance stance = Stance::kDefault;  // per engine; RunOptions::stance overrides per call
  bool allow_tf32 = false;           // float32 GEMMs (cuBLASLt); see "TF32 policy" above
  bool cudnn_allow_tf32 = true;      // float32 convolutions (cuDNN); see "TF32 policy" above
  // Memory format of convolutions (see "Memory format" above): kAuto =
  // channels-last for tensor-core convolutions, NCHW for full-fp32 ones.
  ConvLayout conv_layout = ConvLayout::kAuto;
  // Concrete shapes kept compiled per CompiledProgram (plans + CUDA graphs),
  // least recently used dropped first. 1..4096.
  std::size_t max_plans = 16;
  // Fuse a gelu/relu, or a residual add, that follows a GEMM into its
  // cuBLASLt epilogue (compiled plans only; see "What a plan is" above).
  bool fuse_gemm_epilogue = true;
  // GEMM autotuning (compiled plans only; inductor's max-autotune for
  // extern GEMMs, done on cuBLASLt's own candidates): for each distinct GEMM
  // (shape, layouts, dtype, epilogue; a transformer's layers share one)
  // cuBLASLt's heuristic is asked for up to 8 algorithms instead of one, and
  // before the plan's first compiled run (before its CUDA-graph capture) each
  // candidate runs on the plan's own buffers: once, then as many times as
  // make about 0.5 ms (1..20) captured into one CUDA graph, timed between
  // CUDA events; the fastest is kept for the plan, the engine and the
  // persistent compile cache (re-checked with cublasLtMatmulAlgoCheck when
  // read back), so a warm-cache start times nothing. Costs the first call
  // about 8 x (0.5 ms + 2 runs) per distinct GEMM, and no further candidate
  // once 100 ms went into one GEMM (src/engine/runtime.hpp
  // kGemmTuneBudgetMs: GPT-2 fp32 32x1024's lm_head spent 860 ms there for
  // no gain); a streaming start waits for every weight before it. Results
  // can differ from an untuned plan's in the last bits (another summation
  // order). false: the heuristic's first answer, as force_eager plans always
  // use.
  bool autotune_gemm = true;
  // A large tensor-core GEMM whose N is not a multiple of 16 bytes' worth
  // of elements (GPT-2's lm_head, N = 50257) runs in pieces (compiled and
  // eager plans; see plan_gemm.cpp lower_gemm for the rule and its
  // measurements): by row classes (gemm_row_classes below) where those
  // apply, else as an aligned GEMM and a tail into rows padded to that
  // multiple, then one copy that makes the output dense. false: one GEMM
  // straight into the misaligned rows, as PyTorch's mm does; through
  // cuBLASLt that was slower on an H100 at GPT-2's 1 x 1024 and 32 x 1024
  // rows (bench/RESULTS.md, 2026-12-05: GEMMs 33.4 ms whole, against 12.8
  // + a 2.4 ms copy split); `bench-engine --no-gemm-split` measures it.
  bool split_misaligned_gemm = true;
  // ... and, for such a GEMM whose weight's rows are B's columns (a
  // linear's, the lm_head's; a bias, if any, a checkpoint tensor), no
  // padded output and no copy of it: the output rows fall into P = 16 /
  // gcd(N * element size, 16) classes (rows j mod P) that start at the
  // same offset modulo 16, and one GEMM per class writes its rows' aligned
  // columns straight into the dense output (ldc = P * N); two narrow GEMMs
  // and two copies fill each row's first
  // and last 16 bytes' worth of columns (src/engine/plan_gemm.cpp
  // gemm_by_row_classes). GPT-2 bf16's lm_head: 8 class GEMMs of
  // M/8 x 50248 instead of the aligned GEMM + tail + a copy of its
  // 32768 x 50264 output (2.41 ms on an H100 at batch 32 x 1024, RESULTS.md
  // 2026-12-05), and no 3.3 GB padded buffer in the arena. Measured on an
  // H100 (RESULTS.md 2026-12-06): GPT-2 bf16 32 x 1024 warm 16.47 ms
  // against 18.42 split (the lm_head 8 x 0.49 ms against 3.75 + a 2.36 ms
  // copy), activation arena 338 MiB against 3238. The GPU case "a GEMM with
  // a misaligned N" checks every variant against PyTorch CUDA. false: the
  // split above (`bench-engine --no-gemm-row-classes`).
  bool gemm_row_classes = true;
  // Horizontal GEMM fusion (compiled plans only): aten::linear nodes that
  // read the same input with checkpoint weights of the same K (HF BERT's
  // query / key / value, LLaMA's gate / up) run as one GEMM into [M, sum N]
  // on their weights concatenated once by a prep step; each output is a
  // column block of it (src/engine/plan_gemm.cpp sibling_linears for the rule).
  // One wider GEMM keeps the tensor cores busier than three narrow ones
  // (inductor's freezing passes concatenate such weights the same way:
  // torch/_inductor/fx_passes/freezing_patterns.py check_concat_weights;
  // TorchScript's frozen_concat_linear.cpp). Costs those weights' size
  // again in device memory, per plan (ProgramStats::prepared_bytes).
  // `bench-engine --no-gemm-siblings` turns it off.
  bool fuse_sibling_gemms = true;
  // Fold an inference batch_norm (+ residual add) + relu into the
  // convolution before it (see "Batch norm folding" above; compiled plans
  // only).
  bool fold_batch_norm = true;
  // ... for bfloat16 convolutions too, through cuDNN's operation graphs. The
  // engines cuDNN 9 offers for them compile their kernels at plan time
  // (ResNet-50's 23 graphs: 2.06 s on 16 threads of an H100, bench/
  // RESULTS.md 2026-12-05; ProgramStats::last_dnn_graph_seconds); the
  // persistent cache keeps each compiled plan (cuDNN's own serialization),
  // so a warm-cache start restores them without compiling. false keeps
  // those batch norms as generated kernels (slower runs, no cuDNN
  // compilation).
  bool cudnn_graph_fusion = true;
  // Build the cuDNN graph plans of a compiled plan that the compile cache
  // does not hold (the cudnn_graph_fusion and cudnn_attention ones: runtime
  // compilation, 0.3-1.5 s of CPU each) on background threads (up to 15,
  // one core left to the caller) instead of before the first run. Until
  // they are all built, the plan's runs go step by step without a CUDA
  // graph (ProgramStats::background_runs) and their steps take the fallback
  // they take when cuDNN has no engine: the plain convolution and one
  // bias + batch norm (+ add) + relu kernel over its output, the attention
  // kernel — the same math; a bfloat16 convolution's output is then rounded
  // to bfloat16 before its epilogue instead of after, so those first outputs
  // may differ from later ones in the last bits. The first run after the
  // build finished installs the plans and captures the CUDA graph;
  // CompiledProgram::wait_compiled() waits for that point without running
  // anything. Plans the cache holds are restored on those threads too
  // (background_graph_restore) or before the first run; eager plans
  // (force_eager) build theirs before it. A graph
  // cuDNN fails to build in the background is a warning (its steps keep the
  // fallback), not an error. What it buys (bench/RESULTS.md 2026-12-05,
  // H100): ResNet-50 bfloat16 batch 1's cold first call took 997 ms instead
  // of 2869 (its 23 graphs were in 2.5 s after the start). false: the first
  // call builds them all, and every run uses them.
  bool background_graph_plans = true;
  // With background_graph_plans: the graph plans the compile cache holds are
  // restored on the background threads too, so a warm-cache first call
  // runs at once on the fallback steps, as a cold one does, instead of
  // waiting for cuDNN to finalize every plan from its serialization
  // (cudnnBackendFinalize per plan: it loads the compiled kernels; ResNet-50
  // bfloat16's 23 graphs took 32-74 ms of a warm-cache first call on an
  // H100). The plans are installed, and the CUDA graph captured, by the
  // first run after they are in; until then ProgramStats::
  // dnn_graphs_pending is true. Measured (bench/RESULTS.md 2026-12-06, one
  // H100, same call): ResNet-50 bfloat16 batch 1's warm-cache first output
  // 58.8-60.7 ms instead of 75.9, its final plan run at 74-76 ms.
  // false: restored before the first run, which then already uses them.
  bool background_graph_restore = true;
  // Attention's materialized-score path (see "Attention" above): the most
  // arena bytes one attention step may take for scores (and bfloat16
  // probabilities). 0 = always the flash-style kernel; UINT64_MAX = always
  // materialized (one batch element at a time if need be). Tests force each
  // path with it; plans of different values are not shared.
  std::uint64_t attention_workspace_bytes = kDefaultAttentionWorkspaceBytes;
  // bfloat16 attention on the tensor-core flash kernel where the device has
  // bf16 tensor cores (sm_80 and later; see "Attention" above); false: the
  // two paths above, as for float32.
  bool attention_tensor_cores = true;
  // The materialized path over query/key/value whose heads step over b and h
  // with two strides (split from a [B, S, H*D] projection by view +
  // transpose, as HF BERT and GPT-2 do): cuBLASLt pointer-array batches
  // (CUBLASLT_BATCH_MODE_POINTER_ARRAY; one small launch per group fills the
  // arrays) read them in place and write the output with heads inside rows.
  // false, or a cuBLASLt without them: one GEMM batch per batch element, or
  // from 4 batch elements on contiguous copies of query, key and value.
  bool attention_pointer_arrays = true;
  // bfloat16 attention without a mask (or with is_causal) through cuDNN's
  // fused flash-attention engines (the kernel PyTorch 2.11 picks on sm_90:
  // ATen's cuDNN SDPA backend, aten/src/ATen/native/cudnn/MHA.cpp) instead
  // of the tensor-core flash kernel, where cuDNN 9 accepts the shapes (head
  // dims multiples of 8 up to 128, 16-byte aligned rows). cuDNN compiles its
  // kernel at plan time (kept in the persistent compile cache); a plan it
  // has no engine for, or whose first call it refuses, uses the kernel.
  // On an H100 (bench/RESULTS.md 2026-12-05) GPT-2 32x1024's attention took
  // 2.20 ms with it, 8.10 ms on the kernel; `bench-engine
  // --no-cudnn-attention` turns it off.
  bool cudnn_attention = true;
  // With cudnn_attention: bfloat16 attention with a mask (attn_mask, bool or
  // additive bfloat16) through cuDNN's fused attention too, the mask made
  // cuDNN's additive bias (cudnn-frontend's sdpa "bias" input; ATen's cuDNN
  // SDPA takes attn_mask so): one kernel per mask value writes a
  // bfloat16 [1 or B, 1 or H, L, S] bias (bool: 0 / -inf) and which rows
  // keep no key, once for all the attentions that read that mask (the
  // layers of a transformer); after each attention a small kernel writes
  // zeros to those rows (cuDNN gives them NaN; the kernels, the CPU
  // reference and math SDPA's _safe_softmax give zeros). On an H100
  // (bench/RESULTS.md 2026-12-06) BERT-base bf16 32x128 ran in 2.162 ms
  // with it against 2.309 on the tensor-core kernel (its attention 12 x 20
  // us + one bias step + 12 fix-ups of ~5 us, against 12 x 42.5 us);
  // `bench-engine --no-cudnn-attention-masks` turns it off.
  bool cudnn_attention_masks = true;
  // float32 attention on the tensor cores in 3xTF32 (each operand split
  // into two TF32 parts, three products: float32 accuracy within a few ulps,
  // as PyTorch's memory-efficient attention computes float32 on sm_80+,
  // aten/src/ATen/native/transformers/cuda/mem_eff_attention/
  // gemm_kernel_utils.h) through a flash-style kernel, instead of the
  // materialized path or the CUDA-core kernel (sm_80 and later; with
  // attention_tensor_cores). On an H100 (bench/RESULTS.md 2026-12-05)
  // GPT-2 32x1024's float32 attention took 23.7 ms with it, 45.0 ms
  // materialized (GEMMs, softmax, pointer fills); `bench-engine
  // --no-attention-3xtf32` turns it off.
  bool attention_3xtf32 = true;
  // Persistent compile cache of generated modules (see the top of this file).
  CacheMode cache = CacheMode::kReadWrite;
  // Its directory. Empty: enginecache::CompileCache::default_dir()
  // ($SAFECKPT_CACHE_DIR, else $XDG_CACHE_HOME/safeckpt, else
  // ~/.cache/safeckpt); when that cannot be used (no HOME, a directory or key
  // file failing the cache's checks, I/O errors) the engine runs without a
  // cache and EngineStats::warnings says why. A directory named here that
  // cannot be used is an error of Engine::create (kInvalidArgument or kIo,
  // CompileCache::open's message): the caller asked for that cache.
  // Ignored with CacheMode::kOff.
  std::filesystem::path cache_dir;
};

struct RunOptions {
  std::optional<Stance> stance;  // overrides the engine's stance for this call
};

// One input, borrowed for the call: a DLPack tensor on the program's device
// (kDLCUDA, same index) or in host memory (kDLCPU / kDLCUDAHost; copied in).
// Compact row-major only (strides NULL or the row-major ones).
struct NamedInput {
  std::string name;  // the program's user input name (e.g. "idx", "x")
  const DLTensor* tensor = nullptr;
};

// Counters of one CompiledProgram.
struct ProgramStats {
  std::size_t plans = 0;             // concrete shapes compiled and kept (<= max_plans)
  std::size_t plans_built = 0;       // plans built in total (evictions rebuild)
  std::size_t evictions = 0;         // LRU drops
  std::size_t graph_replays = 0;     // runs served by a CUDA graph replay
  std::size_t eager_runs = 0;        // runs executed step by step
  std::size_t kernels_compiled = 0;  // kernels in modules NVRTC compiled for this program (cache hits: none)
  // Persistent cache lookups of this program's modules (a module found in
  // the engine's in-process map counts in none of them):
  std::size_t cache_hits = 0;    // modules loaded from the cache directory
  std::size_t cache_misses = 0;  // lookups that found no usable entry (absent, ignored, refused by the driver)
  std::size_t cache_stores = 0;  // entries written
  std::vector<std::string> cache_warnings;  // why entries were ignored or not written (the first kMaxCacheWarnings)
  std::uint64_t arena_bytes = 0;            // activation arena of the most recent plan
  // The most of those bytes live at one step of that plan: no placement of
  // its buffers can be smaller, so arena_bytes / arena_live_bytes is the
  // planner's loss to fragmentation (graph::layout_arena,
  // safeckpt/graph_plan.hpp).
  std::uint64_t arena_live_bytes = 0;
  // Every device byte the most recent plan allocated: the arena, its fixed
  // input/output buffers, the GEMM/convolution workspace (what to compare
  // with PyTorch's peak memory of a call over weights and inputs).
  std::uint64_t plan_device_bytes = 0;
  std::uint64_t weight_bytes = 0;  // device bytes the engine allocated for weights (0 = all in place)
  // Weight copies the most recent plan made for its kernels (channels-last
  // convolution filters, filters and biases with a batch norm folded in,
  // sibling linears' concatenated weights and biases; made on its first
  // run), included in plan_device_bytes.
  std::uint64_t prepared_bytes = 0;
  double weight_upload_seconds = 0;  // compile(): allocating and copying those weights (synchronous)
  std::size_t steps = 0;             // launches of the most recent plan (GEMMs, fixed and fused kernels, copies)
  double last_compile_seconds = 0;   // plan + NVRTC + capture of the most recent plan
  // Where last_compile_seconds went (seconds, most recent plan):
  double last_lowering_seconds = 0;   // the IR lowered at its shapes, incl. cuBLASLt algorithm choice
  double last_heuristic_seconds = 0;  // of which cuBLASLt heuristic queries
  double last_module_seconds = 0;     // generated kernels: NVRTC, the persistent cache or the in-process map
  double last_alloc_seconds = 0;      // activation arena, I/O buffers, workspace (cudaMalloc)
  double last_capture_seconds = 0;    // CUDA-graph capture + instantiate (compiled plans, at the first run)
  double last_tune_seconds = 0;       // GEMM autotuning (compiled plans, at the first run; 0 from the cache)
  std::size_t gemms_tuned = 0;        // distinct GEMMs whose candidates were timed (most recent plan)
  // cuDNN operation-graph plans of the most recent plan (bfloat16 folded
  // convolutions, EngineOptions::cudnn_attention): wall time (part of
  // last_lowering_seconds), plans cuDNN built (runtime compilation, cold),
  // plans restored from the persistent cache, and the threads used.
  double last_dnn_graph_seconds = 0;
  std::size_t dnn_graphs_built = 0;
  std::size_t dnn_graphs_restored = 0;
  std::size_t dnn_graph_threads = 0;
  // EngineOptions::background_graph_plans, most recent plan: graph plans
  // handed to the background, whether they are still being built, the
  // seconds from the start of the plan to their install (0 until then;
  // last_dnn_graph_seconds then includes their build), and the compiled runs
  // served step by step meanwhile (over all plans).
  std::size_t dnn_graphs_background = 0;
  bool dnn_graphs_pending = false;
  double last_dnn_graphs_ready_seconds = 0;
  std::size_t background_runs = 0;
  // cuBLASLt heuristic queries of this program's plans. A GEMM of the same
  // shape, layout, dtype and epilogue as one the engine planned before (the
  // next layer's) or one in the persistent cache (EngineStats::
  // choices_from_cache; re-checked with cublasLtMatmulAlgoCheck) reuses that
  // algorithm: at most one query per distinct GEMM.
  std::size_t gemm_heuristics = 0;
  std::size_t gemm_heuristics_reused = 0;
};

// CompiledProgram::profile: a debug path that times each launch of a plan.
struct ProfileOptions {
  std::optional<Stance> stance;  // kForceEager: the eager plan (one kernel per node); else the compiled plan
  int warmup = 3;                // untimed runs first (1..1000)
  int iters = 20;                // timed runs; each step's time is its median (1..100000)
};
// One launch of the plan (a GEMM, a fixed or generated kernel, a copy).
struct StepProfile {
  std::string name;    // the node(s) it runs, as in the plan ("a+b+c" for a fused chain)
  std::string kind;    // gemm, attention, attention_gemm, attention_softmax, fused, copy, layer_norm,
                       // softmax, reduce, embedding (or the op's name for others)
  std::string shapes;  // operand shapes, e.g. "M=1024 N=2304 K=768" or "[1,12,1024,64] S=1024"
  double ms = 0;       // median device time between events before and after it
  double percent = 0;  // of Profile::steps_ms
};
struct Profile {
  std::vector<StepProfile> steps;            // sorted by ms, largest first; every launch of the plan once
  std::map<std::string, double> ms_by_kind;  // sum of the steps' ms per kind
  double steps_ms = 0;                       // sum of every step's ms
  double whole_ms = 0;                       // median of (last event - first event) per timed run
  double graph_ms = 0;                       // compiled plan: median of one CUDA-graph replay; eager: 0
  std::size_t launches = 0;                  // steps.size()
  int iters = 0;
};

// Warnings kept per ProgramStats / EngineStats; later ones are counted only.
inline constexpr std::size_t kMaxCacheWarnings = 32;

// Counters of one Engine, over all its CompiledPrograms.
struct EngineStats {
  std::filesystem::path cache_dir;   // the persistent cache in use; empty: none (kOff or unusable)
  std::size_t modules_compiled = 0;  // NVRTC compiles
  std::size_t cache_hits = 0, cache_misses = 0, cache_stores = 0;  // as in ProgramStats (modules)
  // Algorithm choices (cuBLASLt per GEMM, cuDNN per convolution) written to
  // the persistent cache, and found there (and accepted by the library's
  // re-check) instead of asking the library's heuristics.
  std::size_t choices_stored = 0, choices_from_cache = 0;
  // Cache problems: the default directory unusable at create(), ignored
  // entries, failed loads and stores (the first kMaxCacheWarnings).
  std::vector<std::string> warnings;
  std::size_t warnings_dropped = 0;  // warnings past kMaxCacheWarnings
};

namespace detail {
struct EngineImpl;
struct ProgramImpl;
}  // namespace detail

// A program compiled for one device with its weights bound. Move-only.
// Holds the weights it uploaded and, for a DeviceCheckpoint, a copy of it (so
// the arena outlives the program). Outputs returned by run() are views of
// fixed per-plan output buffers: each DLPack capsule keeps them allocated,
// but the NEXT run() of the same shape overwrites them (as PyTorch's
// reduce-overhead CUDA graphs do); copy them to keep them.
class CompiledProgram {
 public:
  CompiledProgram(CompiledProgram&&) noexcept;
  CompiledProgram& operator=(CompiledProgram&&) noexcept;
  ~CompiledProgram();

  // Runs the program on `inputs` (every user input once). Outputs in
  // signature order, DLPack 1.1 versioned capsules on the device (the caller
  // owns each: call its deleter). Errors:
  //   kInvalidArgument  missing/unknown/duplicate input, wrong dtype, rank,
  //                     static size or device, non-compact strides, a dynamic
  //                     size outside range_constraints (names input, dim and
  //                     range), sizes disagreeing with one symbol; with stance
  //                     fail_on_recompile, a new shape (names the input, the
  //                     dimension and both sizes);
  //   kMalformed        an index out of range in embedding, gather or
  //                     index.Tensor (names the nodes; outputs are not
  //                     returned; the bounds are the CPU interpreter's);
  //   kUnsupported      an op or dtype the engine has no kernel for;
  //   kDevice           a CUDA, cuBLASLt or NVRTC failure (the message says which).
  Result<std::vector<DLManagedTensorVersioned*>> run(const std::vector<NamedInput>& inputs,
                                                     const RunOptions& options = {});
  // Convenience for tests and the CLI: host tensors in, host tensors out
  // (copies both ways), same errors.
  Result<std::vector<graph::HostTensor>> run_host(const std::map<std::string, graph::HostTensor, std::less<>>& inputs,
                                                  const RunOptions& options = {});

  ProgramStats stats() const;

  // Waits until the background work of every plan this program holds
  // (EngineOptions::background_graph_plans) has finished and installs it, so
  // that the next run of each shape captures its final CUDA graph. Runs
  // nothing; returns at once when there is none. A server calls it after its
  // warm-up call to have every later call at full speed. Errors: kDevice (a
  // larger workspace the plans need could not be allocated; the plan keeps
  // its fallback steps).
  Status wait_compiled();

  // Debug path, not for serving: plans the inputs' shape like run() (the
  // compiled plan, or the eager one with stance kForceEager; a plan already
  // cached is reused, a new one counts in ProgramStats), then runs its steps
  // one at a time on the program's stream — `warmup` untimed runs, then
  // `iters` runs with a cudaEvent recorded before the first step and after
  // every step, synchronizing after each run — and reports each step's
  // median time in milliseconds of device time. The events add a few
  // microseconds per step and the steps are not in a CUDA graph, so
  // steps_ms (~ whole_ms) exceeds graph_ms by the launch gaps; graph_ms is
  // the replayed graph timed the same way (iters runs). Costs about
  // (warmup + 2 * iters) runs of the program. Outputs are computed into the
  // plan's buffers and not returned. Inputs and errors as run() (stance
  // fail_on_recompile is not applied: profiling never recompiles an
  // existing shape).
  Result<Profile> profile(const std::vector<NamedInput>& inputs, const ProfileOptions& options = {});
  Result<Profile> profile_host(const std::map<std::string, graph::HostTensor, std::less<>>& inputs,
                               const ProfileOptions& options = {});

 private:
  friend class Engine;
  explicit CompiledProgram(std::unique_ptr<detail::ProgramImpl> impl);
  std::unique_ptr<detail::ProgramImpl> impl_;
};

// One device, its cuBLASLt handle, its in-process NVRTC module map and the
// persistent compile cache it opened. Move-only.
class Engine {
 public:
  // Creates the device context if needed and opens the compile cache
  // (options.cache): an explicit cache_dir before the device is looked at (so
  // a bad one is reported with or without a device), the default directory
  // after (a process without the device creates nothing). Errors:
  // kInvalidArgument (options; an explicit cache_dir that fails the cache's
  // checks), kIo (an explicit cache_dir that cannot be created or read),
  // kDevice (no such device, CUDA/cuBLASLt initialisation).
  static Result<Engine> create(const EngineOptions& options = {});
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();
  const EngineOptions& options() const noexcept;
  // Cache counters and warnings (thread-safe).
  EngineStats stats() const;

  // Compiles `program` (validated: graph::validate) with the archive's own
  // weights and constants (graph::archive_weights), uploaded once (records
  // shared by several FQNs, i.e. tied weights, once). The program is copied.
  // Kernels for a shape are built on first use (stance) — compile() plans
  // nothing yet. Errors: kInvalidArgument (not validated, weights missing or
  // of the wrong dtype/shape), kUnsupported (an op without a GPU kernel,
  // naming the node), kDevice.
  Result<CompiledProgram> compile(const graph::Program& program, const graph::WeightMap& weights);
  // Same, with the parameters and buffers read in place (zero-copy,
  // read-only) from `weights`, bound by state_dict name like
  // load_state_dict(strict=True) (tied names that share a storage share it on
  // the device too). Entries the checkpoint lacks that are constants or
  // non-persistent buffers come from `fallback` (uploaded). `weights` must be
  // on this engine's device. Errors: as above, naming missing and misshapen
  // names.
  Result<CompiledProgram> compile(const graph::Program& program, const cuda::DeviceCheckpoint& weights,
                                  const graph::WeightMap* fallback = nullptr);
  // Streaming start: the same binding over a checkpoint whose bytes are
  // still landing (cuda::PendingDeviceCheckpoint::start). Binding, planning,
  // kernel compilation and CUDA-graph capture need only addresses, so they
  // overlap the transfer. A run while weights are still arriving: eager
  // steps (force_eager, eager_then_compile's first call) each wait for the
  // storages of the weights they read, so the first layers run while later
  // layers' weights are still on their way; a compiled run captures its
  // graph, then waits for every weight before launching it. Once the
  // transfer is complete, runs do not wait any more. A transfer that failed
  // fails the run (its error), before or after steps were launched: no
  // output of a run is returned unless every weight landed. The program
  // keeps `weights` alive. Errors: as above.
  Result<CompiledProgram> compile(const graph::Program& program,
                                  std::shared_ptr<const cuda::PendingDeviceCheckpoint> weights,
                                  const graph::WeightMap* fallback = nullptr);

 private:
  explicit Engine(std::shared_ptr<detail::EngineImpl> impl);
  std::shared_ptr<detail::EngineImpl> impl_;
};

}  // namespace safeckpt::engine
