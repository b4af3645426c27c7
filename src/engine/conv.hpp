// The engine's convolutional pieces (src/engine/*; not installed; no CUDA or
// cuDNN header): cuDNN convolutions (conv.cpp) and the pooling kernels
// (pool_device.cuh) that plan_conv.cpp lowers aten::convolution / conv2d,
// adaptive_avg_pool2d and max_pool2d to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "safeckpt/error.hpp"

namespace safeckpt::engine::detail {

// One 2-D convolution at concrete sizes: NCHW input, KCRS weight (C/groups
// input channels per filter), NKHW output, all contiguous — or, with `nhwc`,
// all three channels-last (PyTorch's torch.channels_last: input N,H,W,C,
// weight K,R,S,C/groups, output N,OH,OW,K in memory); PyTorch's
// cross-correlation with zero padding.
struct ConvGeometry {
  long long n = 0, c = 0, h = 0, w = 0;  // input
  long long k = 0, r = 0, s = 0;         // filters: k output channels, r x s taps
  long long oh = 0, ow = 0;              // output spatial sizes (the interpreter's formula)
  int pad[2] = {0, 0}, stride[2] = {1, 1}, dilation[2] = {1, 1};
  int groups = 1;
  bool bf16 = false;        // tensors bfloat16 (else float32); accumulation is float32 either way
  bool allow_tf32 = false;  // float32 only: cuDNN may use TF32 tensor cores (EngineOptions::cudnn_allow_tf32)
  bool nhwc = false;        // channels-last tensors (EngineOptions::conv_layout)
};

// A cuDNN handle (destroyed with its last owner, on the device it was made on).
struct DnnHandle;
// Loads cuDNN (lazy_cudnn.cpp) and creates a handle on the current device.
// Errors: kDevice naming the soname (library missing) or cuDNN's status.
Result<std::shared_ptr<DnnHandle>> dnn_create();

// The most workspace one convolution's algorithm may take (the plan owns one
// workspace of the largest). ATen caps it by the free memory; a fixed cap
// keeps a plan's footprint predictable, and cuDNN's heuristics rank
// algorithms within it.
inline constexpr std::uint64_t kMaxConvWorkspaceBytes = 256ull << 20;

// Builds `g`'s cuDNN descriptors and checks cuDNN's output size against
// g.oh / g.ow — host calls only (no handle, no device): what host tests can
// check of a convolution. Errors: kDevice (cuDNN missing or refusing a
// descriptor), kInternal (another output size).
Status conv_describe(const ConvGeometry& g);

// Descriptors and the algorithm chosen for one ConvGeometry.
struct ConvPlan;
// Chooses the algorithm (cuDNN's heuristics, cudnnGetConvolutionForward-
// Algorithm_v7: the first applicable one whose workspace is at most
// `max_workspace` bytes). Errors: kDevice (cuDNN failures, no algorithm).
Result<std::shared_ptr<ConvPlan>> conv_prepare(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                               std::uint64_t max_workspace);
std::uint64_t conv_workspace_bytes(const ConvPlan& c);
// The algorithm choice as a cache value (EngineImpl::find_choice /
// store_choice): its key is every field of `g`, the workspace cap and cuDNN's
// version; its bytes the algorithm, math type and workspace size.
std::string conv_choice_key(const ConvGeometry& g, std::uint64_t max_workspace);
std::vector<std::uint8_t> conv_choice_bytes(const ConvPlan& c);
// conv_prepare with a remembered choice instead of cuDNN's heuristics:
// nullptr when the bytes do not apply any more (wrong size, an algorithm
// cuDNN refuses for these descriptors now, or a workspace above the cap).
// Errors: as conv_prepare's descriptor errors.
Result<std::shared_ptr<ConvPlan>> conv_prepare_known(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                                     std::uint64_t max_workspace,
                                                     const std::vector<std::uint8_t>& choice);
// e.g. "IMPLICIT_PRECOMP_GEMM/tensor-op" (for step names and messages).
std::string conv_algo_name(const ConvPlan& c);

// Step return codes: 0, a cudaError_t, 1000 + cublasStatus_t, or
// kDnnStatusBase + cudnnStatus_t (Step::fn in runtime.hpp).
inline constexpr int kDnnStatusBase = 2000;
// Enqueues y = conv(x, w) on `stream` (a cudaStream_t); capturable (no
// allocation, no synchronization). Returns 0 or kDnnStatusBase + status.
int conv_forward(const ConvPlan& c, const void* x, const void* w, void* y, void* workspace,
                 std::uint64_t workspace_bytes, void* stream);
// cudnnGetErrorString of a status (without kDnnStatusBase).
const char* dnn_status_string(int status);

// The convolution with a batch norm folded into it (plan_conv.cpp, "Batch norm
// folding"): y = relu(conv(x, w) + bias + z), float32 only, through cuDNN's
// fused cudnnConvolutionBiasActivationForward (ATen's cudnn_convolution_relu
// / cudnn_convolution_add_relu, aten/src/ATen/native/cudnn/ConvShared.cpp,
// the same call with alpha1 = alpha2 = 1). Adds a [1, K, 1, 1] float32 bias
// descriptor and a ReLU (NaN-propagating, as torch.relu) activation to `c`
// (host calls). Errors: kDevice (cuDNN refusing a descriptor), kUnsupported
// (a bfloat16 geometry: cuDNN's fused call takes float32 only).
Status conv_enable_bias_relu(ConvPlan& c, const ConvGeometry& g);
// Enqueues y = relu(conv(x, w) + bias (+ z when z is not null; z has y's
// shape and layout)) on `stream`; capturable. `bias`: K float32. Returns 0 or
// kDnnStatusBase + status (CUDNN_STATUS_NOT_SUPPORTED when cuDNN has no fused
// kernel for this algorithm and geometry: the caller runs conv_forward and
// launch_bias_add_relu instead).
int conv_bias_relu_forward(const ConvPlan& c, const void* x, const void* w, const void* bias, const void* z, void* y,
                           void* workspace, std::uint64_t workspace_bytes, void* stream);

// The same epilogue for bfloat16 (and a batch norm kept exact: the filter
// is not changed), where cudnnConvolutionBiasActivationForward does not
// apply: y = relu(conv(x, w) * scale[k] + bias[k] (+ z)), one cuDNN
// operation graph of the backend API (cudnn_graph.h: conv_fprop, mul, add,
// [add,] relu; float32 intermediates that never reach memory; ATen's
// cudnn_convolution_add_relu builds this kind of graph through
// cudnn-frontend, aten/src/ATen/native/cudnn/Conv_v8.cpp), the first of
// cuDNN's heuristic engine configs (CUDNN_HEUR_MODE_A) that finalizes within
// `max_workspace`. Tensors 16-byte aligned; `scale` and `bias` K float32s;
// z (when `with_z`) y's shape and layout. groups == 1 only. Returns nullptr
// (not an error) when cuDNN has no engine for the graph; errors: kDevice
// (a descriptor cuDNN refuses, cuDNN missing).
struct GraphPlan;
Result<std::shared_ptr<GraphPlan>> graph_conv_prepare(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                                      bool with_z, std::uint64_t max_workspace);
// A runtime-compiled plan kept across processes: graph_conv_plan_bytes is
// the engine name, a NUL, then cuDNN's own serialization of the finalized
// execution plan (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, cudnn_graph.h;
// cuDNN serializes runtime-compiled engines only and the text carries the
// compiled kernel, so finalizing it again skips cuDNN's NVRTC step). Empty
// when the plan is precompiled (cheap to choose again) or cuDNN cannot
// serialize it. These bytes are handed to cuDNN's parser only from an entry of
// our HMAC-authenticated compile cache that this engine wrote (the choice
// key names the geometry, with_z, max_workspace and cuDNN's version).
std::vector<std::uint8_t> graph_conv_plan_bytes(const GraphPlan& c);
// The plan back from those bytes, re-checked: the workspace within
// `max_workspace`. nullptr (not an error) when cuDNN refuses them (a stale
// entry is a miss; the caller prepares the plan again and overwrites it).
std::shared_ptr<GraphPlan> graph_conv_from_bytes(std::shared_ptr<DnnHandle> handle, bool with_z,
                                                 std::uint64_t max_workspace, const std::vector<std::uint8_t>& bytes);
std::uint64_t graph_conv_workspace_bytes(const GraphPlan& c);
// e.g. "cuDNN graph engine 4 (runtime-compiled)" (cuDNN's global engine
// index; runtime-compiled engines are taken only when no precompiled one
// finalizes).
std::string graph_conv_name(const GraphPlan& c);
// Enqueues the graph on `stream` (capturable; the variant pack is made per
// call on the host). Returns 0 or kDnnStatusBase + status.
int graph_conv_forward(const GraphPlan& c, const void* x, const void* w, const void* scale, const void* bias,
                       const void* z, void* y, void* workspace, std::uint64_t workspace_bytes, void* stream);

// ------------------------------------------------ fused attention (dnn_graph.cpp)
// scaled_dot_product_attention at concrete sizes for cuDNN's fused
// flash-attention engines: query [b, h, l, d], key [b, h, s, d], value
// [b, h, s, dv], output [b, h, l, dv], each with its element strides (the
// last 1); the causal mask (PyTorch's is_causal: top-left, key j kept for
// query row i when j <= i) and/or an additive bfloat16 bias added to the
// scaled scores (cudnn-frontend's sdpa "bias" input, the order of its
// graph: scale, bias, causal), [bias_b, bias_h, l, s] with bias_b 1 or b
// and bias_h 1 or h (broadcast), rows of sdpa_bias_ld(s) elements (16-byte
// aligned), the rest dense; scale applied to Q K^T.
struct SdpaGeometry {
  long long b = 0, h = 0, l = 0, s = 0, d = 0, dv = 0;
  std::int64_t q_s[4] = {}, k_s[4] = {}, v_s[4] = {}, o_s[4] = {};
  bool bf16 = true;
  bool causal = false;
  bool bias = false;
  long long bias_b = 0, bias_h = 0;
};
// The row stride (elements) of an SdpaGeometry bias: s rounded up to 8.
inline long long sdpa_bias_ld(long long s) {
  return (s + 7) / 8 * 8;
}
// Whether cuDNN 9's fused attention can take `g` (its support surface,
// cudnn-frontend sdpa_support_surface.h): bfloat16, head dims multiples of 8
// and at most 128 (what this engine asks for), innermost strides 1, the
// other strides multiples of 8 elements (16-byte rows; the pointers must be
// 16-byte aligned too: the caller checks them); a bias of [1 or b, 1 or h].
bool sdpa_graph_applies(const SdpaGeometry& g);
// The compile cache key of `g`'s graph plan (every field, the workspace cap,
// cuDNN's version).
std::string sdpa_choice_key(const SdpaGeometry& g, std::uint64_t max_workspace);
// The operation graph (dnn_graph.cpp, "fused attention") and the first of
// cuDNN's heuristic engine configs that finalizes within `max_workspace`
// (cuDNN's fused attention engines are runtime-compiled: NVRTC inside cuDNN
// at this call, hundreds of milliseconds; graph_conv_plan_bytes keeps the
// result for the next process). nullptr (not an error) when `g` does not
// apply or cuDNN has no engine for it; errors: kDevice (cuDNN missing or
// refusing a descriptor).
Result<std::shared_ptr<GraphPlan>> graph_sdpa_prepare(std::shared_ptr<DnnHandle> handle, const SdpaGeometry& g,
                                                      std::uint64_t max_workspace);
// graph_conv_from_bytes for an attention plan (`g` as when prepared: its
// causal and bias fields decide the variant pack).
std::shared_ptr<GraphPlan> graph_sdpa_from_bytes(std::shared_ptr<DnnHandle> handle, const SdpaGeometry& g,
                                                 std::uint64_t max_workspace, const std::vector<std::uint8_t>& bytes);
// Enqueues o = softmax(scale * q k^T [+ bias] [causal]) v on `stream`
// (capturable; `scale` is passed by value, so a captured graph keeps it).
// `bias`: the [bias_b, bias_h, l, s] bfloat16 tensor of a plan prepared
// with one (16-byte aligned), else ignored. `workspace`: at least
// graph_conv_workspace_bytes(c). Returns 0 or kDnnStatusBase + status.
int graph_sdpa_forward(const GraphPlan& c, const void* q, const void* k, const void* v, const void* bias, void* o,
                       float scale, void* workspace, void* stream);

// ---------------------------------------------- pool.cu / pool_device.cuh
// NCHW contiguous planes of `h` x `w` (`planes` = N*C); y contiguous
// [planes, oh, ow] — or, with `channels` > 0, channels-last: x N,H,W,C and
// y N,OH,OW,C in memory (`planes` = N*C, C = `channels`). Return a
// cudaError_t value.
// adaptive_avg_pool2d: aten/src/ATen/native/AdaptiveAveragePooling.cpp
// windows [floor(o*H/OH), ceil((o+1)*H/OH)), float32 sums.
int launch_adaptive_avg_pool2d(const void* x, void* y, long long planes, long long h, long long w, long long oh,
                               long long ow, int bf16, long long channels, void* stream);
// max_pool2d values (PyTorch's CUDA kernel: a NaN wins; padding never does).
struct MaxPoolArgs {
  const void* x;
  void* y;
  long long planes, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw, dh, dw;
  int bf16;
  long long channels;  // > 0: channels-last x and y with this many channels (planes = N * channels)
};
int launch_max_pool2d(const MaxPoolArgs& a, void* stream);

// Batch norm folding's prep step (plan_conv.cpp), torch/nn/utils/fusion.py's
// fuse_conv_bn_weights: with s = gamma / sqrt(var + eps) per output channel
// k (gamma 1 when absent), the folded filter wf[k, c, r, s] = w[k, c, r, s]
// * s[k] and bias[k] = (conv_bias[k] - mean[k]) * s[k] + beta[k]; float32
// throughout. Filters are K x C x R x S (C per group) read and written
// through their own element strides (so the copy may change the layout,
// e.g. to K,R,S,C); the per-channel vectors
// through `vs` (strides; float32 or bfloat16, read as float; a null gamma,
// beta or conv_bias reads as 1, 0, 0).
// wf null: no filter written (the graph path keeps the filter and applies
// `scale`, when not null, K contiguous floats s[k], in its epilogue).
struct FoldBnArgs {
  const float* w;  // float32 filter (read only when wf is set)
  float* wf;
  long long k, c, r, s;
  long long ws[4], wfs[4];                            // element strides of w and wf, dimensions K, C, R, S
  const void *gamma, *beta, *mean, *var, *conv_bias;  // float32, or bfloat16 where vbf16[i]
  long long vs[5];                                    // element strides of gamma, beta, mean, var, conv_bias
  int vbf16[5];
  float eps;
  float* bias;   // K contiguous floats
  float* scale;  // null, or K contiguous floats
};
int launch_fold_batch_norm(const FoldBnArgs& a, void* stream);
// y = relu(y * scale[channel] + bias[channel] (+ z)) over `count` elements
// of y's dtype (float32, or bfloat16 with `bf16`; float arithmetic), channel
// = (i / inner) % channels (NCHW: inner = H * W; channels-last: inner = 1);
// scale null reads as 1; z null or y's dtype and layout: the fallback of the
// fused convolutions above when cuDNN refuses them at run time.
int launch_bias_add_relu(void* y, const float* scale, const float* bias, const void* z, long long count,
                         long long channels, long long inner, int bf16, void* stream);

}  // namespace safeckpt::engine::detail
