// src/engine/conv.cpp — 2-D convolutions through cuDNN.
//
// API: cuDNN's convolution functions of cudnn_cnn.h (cudnnConvolutionForward
// with tensor / filter / convolution descriptors), not the backend graph API.
// Why: they are what PyTorch's own cuDNN v7 path calls (aten/src/ATen/native/
// cudnn/Conv_v7.cpp), cuDNN 9 still ships them (deprecated for new features,
// exported by libcudnn.so.9, which hands them to libcudnn_cnn.so.9), and one
// forward convolution is four small descriptors and one heuristic query —
// the backend API needs an operation graph, engine heuristics, engine
// configs and a variant pack per convolution for the same kernels. Should a
// future cuDNN drop them, this file is the one place to port. The backend
// graph API is used only where the legacy one has no kernel: bfloat16
// convolutions with a batch norm + relu epilogue (graph_conv_prepare, at the
// end of this file).
//
// Precision (the engine header's TF32 policy): float32 convolutions use
// CUDNN_FMA_MATH (no TF32) unless ConvGeometry::allow_tf32, then
// CUDNN_DEFAULT_MATH (TF32 tensor cores allowed), as ATen does for
// torch.backends.cudnn.allow_tf32 = False / True; bfloat16 uses
// CUDNN_TENSOR_OP_MATH with float32 accumulation (compute type FLOAT).
//
// The algorithm is chosen once per plan (cudnnGetConvolutionForward-
// Algorithm_v7: cuDNN's heuristics, no benchmarking — ATen's choice with
// torch.backends.cudnn.benchmark = False, its default): the first result
// that succeeded, has the math type the policy allows and whose workspace
// fits. Running it only enqueues kernels on the given stream with the plan's
// workspace, so steps are CUDA-graph capturable.
#include "engine/conv.hpp"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/dnn_internal.hpp"

namespace safeckpt::engine::detail {

std::string cudnn_load_error();  // lazy_cudnn.cpp

struct ConvPlan {
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
    if (bias != nullptr) cudnnDestroyTensorDescriptor(bias);
    if (act != nullptr) cudnnDestroyActivationDescriptor(act);
  }
  std::shared_ptr<DnnHandle> handle;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::uint64_t workspace = 0;
  // conv_enable_bias_relu's descriptors (null until then).
  cudnnTensorDescriptor_t bias = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
};

namespace {

const char* algo_text(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    default: return "algo?";
  }
}

}  // namespace

Result<std::shared_ptr<DnnHandle>> dnn_create() {
  std::string load = cudnn_load_error();
  if (!load.empty()) return make_error(ErrorCode::kDevice, "cuDNN (convolutions): " + load);
  // The headers this engine was built with and the library found must agree
  // on the major version (the soname says so) — the minor may differ.
  std::size_t v = cudnnGetVersion();
  if (v / 10000 != CUDNN_MAJOR)
    return make_error(ErrorCode::kDevice, "cuDNN " + std::to_string(v) + " loaded; the engine was built for cuDNN " +
                                              std::to_string(CUDNN_MAJOR) + ".x");
  auto h = std::make_shared<DnnHandle>();
  SAFECKPT_CHECK(dnn_ok(cudnnCreate(&h->h), "cudnnCreate"));
  return h;
}

namespace {

// The descriptors of `g` into `c` (host calls only: no handle or device),
// cuDNN's output size checked against the plan's.
Status describe(ConvPlan& c, const ConvGeometry& g) {
  const cudnnDataType_t ty = g.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  auto i = [](long long v) { return static_cast<int>(v); };  // plan_conv.cpp checked every size against INT_MAX
  SAFECKPT_CHECK(dnn_ok(cudnnCreateTensorDescriptor(&c.x), "cudnnCreateTensorDescriptor"));
  SAFECKPT_CHECK(dnn_ok(cudnnCreateTensorDescriptor(&c.y), "cudnnCreateTensorDescriptor"));
  SAFECKPT_CHECK(dnn_ok(cudnnCreateFilterDescriptor(&c.w), "cudnnCreateFilterDescriptor"));
  SAFECKPT_CHECK(dnn_ok(cudnnCreateConvolutionDescriptor(&c.conv), "cudnnCreateConvolutionDescriptor"));
  // The format names the memory order; the sizes are N, C, H, W either way.
  const cudnnTensorFormat_t fmt = g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  SAFECKPT_CHECK(dnn_ok(cudnnSetTensor4dDescriptor(c.x, fmt, ty, i(g.n), i(g.c), i(g.h), i(g.w)), "input descriptor"));
  SAFECKPT_CHECK(
      dnn_ok(cudnnSetTensor4dDescriptor(c.y, fmt, ty, i(g.n), i(g.k), i(g.oh), i(g.ow)), "output descriptor"));
  SAFECKPT_CHECK(
      dnn_ok(cudnnSetFilter4dDescriptor(c.w, ty, fmt, i(g.k), i(g.c / g.groups), i(g.r), i(g.s)), "filter descriptor"));
  SAFECKPT_CHECK(
      dnn_ok(cudnnSetConvolution2dDescriptor(c.conv, g.pad[0], g.pad[1], g.stride[0], g.stride[1], g.dilation[0],
                                             g.dilation[1], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             "convolution descriptor"));
  SAFECKPT_CHECK(dnn_ok(cudnnSetConvolutionGroupCount(c.conv, g.groups), "cudnnSetConvolutionGroupCount"));
  const bool fma_only = !g.bf16 && !g.allow_tf32;
  const cudnnMathType_t math = g.bf16 ? CUDNN_TENSOR_OP_MATH : fma_only ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  SAFECKPT_CHECK(dnn_ok(cudnnSetConvolutionMathType(c.conv, math), "cudnnSetConvolutionMathType"));
  int n = 0, k = 0, oh = 0, ow = 0;
  SAFECKPT_CHECK(dnn_ok(cudnnGetConvolution2dForwardOutputDim(c.conv, c.x, c.w, &n, &k, &oh, &ow), "output size"));
  if (n != g.n || k != g.k || oh != g.oh || ow != g.ow)
    return make_error(ErrorCode::kInternal, "cuDNN's convolution output size " + std::to_string(oh) + "x" +
                                                std::to_string(ow) + " differs from the planned " +
                                                std::to_string(g.oh) + "x" + std::to_string(g.ow));
  return {};
}

}  // namespace

Status conv_describe(const ConvGeometry& g) {
  std::string load = cudnn_load_error();
  if (!load.empty()) return make_error(ErrorCode::kDevice, "cuDNN (convolutions): " + load);
  ConvPlan c;
  return describe(c, g);
}

Result<std::shared_ptr<ConvPlan>> conv_prepare(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                               std::uint64_t max_workspace) {
  auto c = std::make_shared<ConvPlan>();
  c->handle = std::move(handle);
  SAFECKPT_CHECK(describe(*c, g));
  const bool fma_only = !g.bf16 && !g.allow_tf32;
  int max_algos = 0;
  SAFECKPT_CHECK(dnn_ok(cudnnGetConvolutionForwardAlgorithmMaxCount(c->handle->h, &max_algos), "algorithm count"));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(std::max(max_algos, 1)));
  int found = 0;
  SAFECKPT_CHECK(dnn_ok(
      cudnnGetConvolutionForwardAlgorithm_v7(c->handle->h, c->x, c->w, c->conv, c->y, max_algos, &found, perf.data()),
      "cudnnGetConvolutionForwardAlgorithm_v7"));
  // Pass 0: the results as ranked, each with its own math type. Pass 1
  // (full fp32 only, should cuDNN report no FMA_MATH result): the same
  // algorithms with the descriptor forced to CUDNN_FMA_MATH, kept when cuDNN
  // accepts that pair.
  for (int pass = 0; pass < (fma_only ? 2 : 1); ++pass)
    for (int a = 0; a < found; ++a) {
      const auto& p = perf[static_cast<std::size_t>(a)];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (pass == 0 && fma_only && p.mathType != CUDNN_FMA_MATH) continue;  // ATen's ASSERT_CORRECT_PRECISION
      // cuDNN 7.4+: the algorithm and the math type together select the
      // kernel (ATen sets the descriptor's math type from the result too).
      const cudnnMathType_t m = pass == 0 ? p.mathType : CUDNN_FMA_MATH;
      if (cudnnSetConvolutionMathType(c->conv, m) != CUDNN_STATUS_SUCCESS) continue;
      std::size_t ws = 0;
      if (cudnnGetConvolutionForwardWorkspaceSize(c->handle->h, c->x, c->w, c->conv, c->y, p.algo, &ws) !=
              CUDNN_STATUS_SUCCESS ||
          ws > max_workspace)
        continue;
      c->algo = p.algo;
      c->math = m;
      c->workspace = ws;
      return c;
    }
  return make_error(ErrorCode::kDevice, "cuDNN has no forward algorithm for this convolution within " +
                                            std::to_string(max_workspace >> 20) + " MiB of workspace (" +
                                            std::to_string(found) + " candidates)");
}

std::string conv_choice_key(const ConvGeometry& g, std::uint64_t max_workspace) {
  std::string k = "conv cudnn " + std::to_string(cudnnGetVersion()) + ":";
  for (long long v : {g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.oh, g.ow}) k += std::to_string(v) + ",";
  for (int v : {g.pad[0], g.pad[1], g.stride[0], g.stride[1], g.dilation[0], g.dilation[1], g.groups})
    k += std::to_string(v) + ",";
  k += std::string(g.bf16 ? "bf16," : "fp32,") + (g.allow_tf32 ? "tf32," : "fma,") + (g.nhwc ? "nhwc," : "nchw,") +
       std::to_string(max_workspace);
  return k;
}

std::vector<std::uint8_t> conv_choice_bytes(const ConvPlan& c) {
  std::vector<std::uint8_t> b(16);
  const auto algo = static_cast<std::int32_t>(c.algo);
  const auto math = static_cast<std::int32_t>(c.math);
  std::memcpy(b.data(), &algo, 4);
  std::memcpy(b.data() + 4, &math, 4);
  std::memcpy(b.data() + 8, &c.workspace, 8);
  return b;
}

Result<std::shared_ptr<ConvPlan>> conv_prepare_known(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                                     std::uint64_t max_workspace,
                                                     const std::vector<std::uint8_t>& choice) {
  if (choice.size() != 16) return std::shared_ptr<ConvPlan>();
  auto c = std::make_shared<ConvPlan>();
  c->handle = std::move(handle);
  SAFECKPT_CHECK(describe(*c, g));
  std::int32_t algo = 0, math = 0;
  std::uint64_t ws_saved = 0;
  std::memcpy(&algo, choice.data(), 4);
  std::memcpy(&math, choice.data() + 4, 4);
  std::memcpy(&ws_saved, choice.data() + 8, 8);
  if (algo < 0 || algo >= static_cast<std::int32_t>(CUDNN_CONVOLUTION_FWD_ALGO_COUNT) || math < 0 || math > 3)
    return std::shared_ptr<ConvPlan>();
  const bool fma_only = !g.bf16 && !g.allow_tf32;
  const auto m = static_cast<cudnnMathType_t>(math);
  if (fma_only && m != CUDNN_FMA_MATH) return std::shared_ptr<ConvPlan>();  // the policy forbids it
  if (cudnnSetConvolutionMathType(c->conv, m) != CUDNN_STATUS_SUCCESS) return std::shared_ptr<ConvPlan>();
  std::size_t ws = 0;
  if (cudnnGetConvolutionForwardWorkspaceSize(c->handle->h, c->x, c->w, c->conv, c->y,
                                              static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                              &ws) != CUDNN_STATUS_SUCCESS ||
      ws > max_workspace || ws != ws_saved)
    return std::shared_ptr<ConvPlan>();
  c->algo = static_cast<cudnnConvolutionFwdAlgo_t>(algo);
  c->math = m;
  c->workspace = ws;
  return c;
}

std::uint64_t conv_workspace_bytes(const ConvPlan& c) {
  return c.workspace;
}

std::string conv_algo_name(const ConvPlan& c) {
  const char* m = c.math == CUDNN_FMA_MATH ? "fma" : c.math == CUDNN_DEFAULT_MATH ? "default-math" : "tensor-op";
  return std::string(algo_text(c.algo)) + "/" + m;
}

int conv_forward(const ConvPlan& c, const void* x, const void* w, void* y, void* workspace,
                 std::uint64_t workspace_bytes, void* stream) {
  cudnnStatus_t st = cudnnSetStream(c.handle->h, static_cast<cudaStream_t>(stream));
  if (st == CUDNN_STATUS_SUCCESS) {
    const float alpha = 1.0f, beta = 0.0f;  // float scaling for FLOAT and BFLOAT16 data
    st = cudnnConvolutionForward(c.handle->h, &alpha, c.x, x, c.w, w, c.conv, c.algo, workspace,
                                 static_cast<std::size_t>(workspace_bytes), &beta, c.y, y);
  }
  return st == CUDNN_STATUS_SUCCESS ? 0 : kDnnStatusBase + static_cast<int>(st);
}

Status conv_enable_bias_relu(ConvPlan& c, const ConvGeometry& g) {
  if (g.bf16) return make_error(ErrorCode::kUnsupported, "cuDNN's fused convolution + bias + relu takes float32 only");
  if (c.bias == nullptr) {
    SAFECKPT_CHECK(dnn_ok(cudnnCreateTensorDescriptor(&c.bias), "cudnnCreateTensorDescriptor"));
    SAFECKPT_CHECK(
        dnn_ok(cudnnSetTensor4dDescriptor(c.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, static_cast<int>(g.k), 1, 1),
               "bias descriptor"));
  }
  if (c.act == nullptr) {
    SAFECKPT_CHECK(dnn_ok(cudnnCreateActivationDescriptor(&c.act), "cudnnCreateActivationDescriptor"));
    SAFECKPT_CHECK(dnn_ok(cudnnSetActivationDescriptor(c.act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
                          "activation descriptor"));
  }
  return {};
}

int conv_bias_relu_forward(const ConvPlan& c, const void* x, const void* w, const void* bias, const void* z, void* y,
                           void* workspace, std::uint64_t workspace_bytes, void* stream) {
  if (c.bias == nullptr || c.act == nullptr) return kDnnStatusBase + static_cast<int>(CUDNN_STATUS_NOT_INITIALIZED);
  cudnnStatus_t st = cudnnSetStream(c.handle->h, static_cast<cudaStream_t>(stream));
  if (st == CUDNN_STATUS_SUCCESS) {
    // Without a residual, z is y with alpha2 = 0: not read (ATen's
    // cudnn_convolution_relu passes its output the same way).
    const float alpha1 = 1.0f, alpha2 = z != nullptr ? 1.0f : 0.0f;
    st = cudnnConvolutionBiasActivationForward(c.handle->h, &alpha1, c.x, x, c.w, w, c.conv, c.algo, workspace,
                                               static_cast<std::size_t>(workspace_bytes), &alpha2, c.y,
                                               z != nullptr ? z : y, c.bias, bias, c.act, c.y, y);
  }
  return st == CUDNN_STATUS_SUCCESS ? 0 : kDnnStatusBase + static_cast<int>(st);
}

const char* dnn_status_string(int status) {
  return cudnnGetErrorString(static_cast<cudnnStatus_t>(status));
}

}  // namespace safeckpt::engine::detail
