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

namespace safeckpt::engine::detail {

std::string cudnn_load_error();  // lazy_cudnn.cpp

struct DnnHandle {
  DnnHandle() = default;
  DnnHandle(const DnnHandle&) = delete;
  DnnHandle& operator=(const DnnHandle&) = delete;
  ~DnnHandle() {
    if (h != nullptr) cudnnDestroy(h);
  }
  cudnnHandle_t h = nullptr;
};

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

// A cuDNN status as the engine's error (kDevice, cuDNN's own text).
Status dnn_ok(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return {};
  return make_error(ErrorCode::kDevice, std::string("cuDNN ") + what + ": " + cudnnGetErrorString(st));
}

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
  auto i = [](long long v) { return static_cast<int>(v); };  // plan.cpp checked every size against INT_MAX
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

// ------------------------------------------------ the backend graph API
// For bfloat16 convolutions with a batch norm (+ add) + relu epilogue, which
// cudnnConvolutionBiasActivationForward refuses (float32 only): one
// operation graph, conv_fprop -> mul(scale) -> add(bias) [-> add(z)] ->
// relu, the intermediates virtual float32 tensors (never in memory), the
// batch norm exact in float (the filter unchanged). ATen builds the same kind
// of graph for cudnn_convolution_add_relu through cudnn-frontend
// (aten/src/ATen/native/cudnn/Conv_v8.cpp); here it is the C API of
// cudnn_graph.h, which the frontend wraps.

namespace {

// One backend descriptor, destroyed with its owner.
struct Bd {
  Bd() = default;
  Bd(const Bd&) = delete;
  Bd& operator=(const Bd&) = delete;
  Bd(Bd&& o) noexcept : d(o.d) { o.d = nullptr; }
  Bd& operator=(Bd&& o) noexcept {
    std::swap(d, o.d);
    return *this;
  }
  ~Bd() {
    if (d != nullptr) cudnnBackendDestroyDescriptor(d);
  }
  cudnnBackendDescriptor_t d = nullptr;
};

Status bd_make(cudnnBackendDescriptorType_t t, Bd& b) {
  return dnn_ok(cudnnBackendCreateDescriptor(t, &b.d), "cudnnBackendCreateDescriptor");
}
Status bd_set(Bd& b, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, std::int64_t n, const void* v) {
  return dnn_ok(cudnnBackendSetAttribute(b.d, a, t, n, v), "cudnnBackendSetAttribute");
}
Status bd_set_desc(Bd& b, cudnnBackendAttributeName_t a, const Bd& v) {
  return bd_set(b, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v.d);
}

// A 4-D tensor (dims N, C, H, W order; strides in elements).
Status tensor_desc(Bd& b, std::int64_t uid, cudnnDataType_t ty, const std::int64_t (&dims)[4],
                   const std::int64_t (&strides)[4], bool is_virtual) {
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, b));
  const std::int64_t align = 16;
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ty));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
  return dnn_ok(cudnnBackendFinalize(b.d), "tensor descriptor");
}

// A pointwise operation y = mode(x[, b]) computed in float.
Status pointwise_op(Bd& op, Bd& pw, cudnnPointwiseMode_t mode, const Bd& x, const Bd* b, const Bd& y) {
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw));
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  SAFECKPT_CHECK(bd_set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  SAFECKPT_CHECK(bd_set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
  SAFECKPT_CHECK(dnn_ok(cudnnBackendFinalize(pw.d), "pointwise descriptor"));
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
  if (b != nullptr) SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
  return dnn_ok(cudnnBackendFinalize(op.d), "pointwise operation");
}

enum : std::int64_t {
  kUidX = 1,
  kUidW,
  kUidY,
  kUidScale,
  kUidBias,
  kUidZ,
  kUidConv = 101,
  kUidMul,
  kUidBiased,
  kUidAdd
};

}  // namespace

struct GraphConvPlan {
  std::shared_ptr<DnnHandle> handle;
  Bd plan;  // the finalized execution plan (keeps what it needs of the graph)
  std::uint64_t workspace = 0;
  bool with_z = false;
  std::string engine;  // "engine <global index>" of the chosen config
  bool runtime_compiled = false;
};

Result<std::shared_ptr<GraphConvPlan>> graph_conv_prepare(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                                          bool with_z, std::uint64_t max_workspace) {
  if (g.groups != 1) return std::shared_ptr<GraphConvPlan>();
  std::string load = cudnn_load_error();
  if (!load.empty()) return make_error(ErrorCode::kDevice, "cuDNN (convolutions): " + load);
  const cudnnDataType_t io = g.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT, f32 = CUDNN_DATA_FLOAT;
  auto strides = [&](std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t(&out)[4]) {
    if (g.nhwc) {
      out[0] = h * w * c, out[1] = 1, out[2] = w * c, out[3] = c;
    } else {
      out[0] = c * h * w, out[1] = h * w, out[2] = w, out[3] = 1;
    }
  };
  const std::int64_t xd[4] = {g.n, g.c, g.h, g.w}, wd[4] = {g.k, g.c, g.r, g.s}, yd[4] = {g.n, g.k, g.oh, g.ow},
                     vd[4] = {1, g.k, 1, 1}, vs[4] = {g.k, 1, 1, 1};
  std::int64_t xs[4], ws[4], ys[4];
  strides(g.c, g.h, g.w, xs);
  strides(g.c, g.r, g.s, ws);
  strides(g.k, g.oh, g.ow, ys);
  Bd x, w, y, scale, bias, z, t_conv, t_mul, t_biased, t_add;
  SAFECKPT_CHECK(tensor_desc(x, kUidX, io, xd, xs, false));
  SAFECKPT_CHECK(tensor_desc(w, kUidW, io, wd, ws, false));
  SAFECKPT_CHECK(tensor_desc(y, kUidY, io, yd, ys, false));
  SAFECKPT_CHECK(tensor_desc(scale, kUidScale, f32, vd, vs, false));
  SAFECKPT_CHECK(tensor_desc(bias, kUidBias, f32, vd, vs, false));
  if (with_z) SAFECKPT_CHECK(tensor_desc(z, kUidZ, io, yd, ys, false));
  SAFECKPT_CHECK(tensor_desc(t_conv, kUidConv, f32, yd, ys, true));
  SAFECKPT_CHECK(tensor_desc(t_mul, kUidMul, f32, yd, ys, true));
  SAFECKPT_CHECK(tensor_desc(t_biased, kUidBiased, f32, yd, ys, true));
  if (with_z) SAFECKPT_CHECK(tensor_desc(t_add, kUidAdd, f32, yd, ys, true));

  Bd conv, conv_op;
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, conv));
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t dims = 2, pad[2] = {g.pad[0], g.pad[1]}, stride[2] = {g.stride[0], g.stride[1]},
                     dil[2] = {g.dilation[0], g.dilation[1]};
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims));
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil));
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride));
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
  SAFECKPT_CHECK(bd_set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
  SAFECKPT_CHECK(dnn_ok(cudnnBackendFinalize(conv.d), "convolution descriptor"));
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, conv_op));
  const float one = 1.0f, zero = 0.0f;
  SAFECKPT_CHECK(bd_set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x));
  SAFECKPT_CHECK(bd_set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w));
  SAFECKPT_CHECK(bd_set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, t_conv));
  SAFECKPT_CHECK(bd_set_desc(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv));
  SAFECKPT_CHECK(bd_set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &one));
  SAFECKPT_CHECK(bd_set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &zero));
  SAFECKPT_CHECK(dnn_ok(cudnnBackendFinalize(conv_op.d), "convolution operation"));

  Bd mul_op, mul_pw, bias_op, bias_pw, add_op, add_pw, relu_op, relu_pw;
  SAFECKPT_CHECK(pointwise_op(mul_op, mul_pw, CUDNN_POINTWISE_MUL, t_conv, &scale, t_mul));
  SAFECKPT_CHECK(pointwise_op(bias_op, bias_pw, CUDNN_POINTWISE_ADD, t_mul, &bias, t_biased));
  if (with_z) SAFECKPT_CHECK(pointwise_op(add_op, add_pw, CUDNN_POINTWISE_ADD, t_biased, &z, t_add));
  SAFECKPT_CHECK(pointwise_op(relu_op, relu_pw, CUDNN_POINTWISE_RELU_FWD, with_z ? t_add : t_biased, nullptr, y));

  Bd graph;
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
  std::vector<cudnnBackendDescriptor_t> ops = {conv_op.d, mul_op.d, bias_op.d};
  if (with_z) ops.push_back(add_op.d);
  ops.push_back(relu_op.d);
  SAFECKPT_CHECK(bd_set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        static_cast<std::int64_t>(ops.size()), ops.data()));
  SAFECKPT_CHECK(bd_set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle->h));
  if (cudnnBackendFinalize(graph.d) != CUDNN_STATUS_SUCCESS) return std::shared_ptr<GraphConvPlan>();

  Bd heur;
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, heur));
  const cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
  SAFECKPT_CHECK(bd_set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
  SAFECKPT_CHECK(bd_set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm));
  if (cudnnBackendFinalize(heur.d) != CUDNN_STATUS_SUCCESS) return std::shared_ptr<GraphConvPlan>();
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return std::shared_ptr<GraphConvPlan>();
  count = std::min<std::int64_t>(count, 16);
  std::vector<Bd> cfgs(static_cast<std::size_t>(count));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& c : cfgs) {
    SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, c));
    raw.push_back(c.d);
  }
  std::int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return std::shared_ptr<GraphConvPlan>();
  // Engines that compile their kernels at run time (NVRTC inside cuDNN:
  // hundreds of milliseconds per geometry, in every process) are tried only
  // when no precompiled one finalizes.
  std::vector<char> runtime_compiled(static_cast<std::size_t>(count), 0);
  std::vector<std::int64_t> global_index(static_cast<std::size_t>(count), -1);
  for (std::int64_t i = 0; i < got && i < count; ++i) {
    Bd engine;
    SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, engine));
    std::int64_t n = 0;
    if (cudnnBackendGetAttribute(raw[static_cast<std::size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine.d) != CUDNN_STATUS_SUCCESS)
      continue;
    cudnnBackendBehaviorNote_t notes[16];
    std::int64_t nn = 0;
    if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, 16, &nn, notes) ==
        CUDNN_STATUS_SUCCESS)
      for (std::int64_t k = 0; k < nn && k < 16; ++k)
        if (notes[k] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) runtime_compiled[static_cast<std::size_t>(i)] = 1;
    std::int64_t gi = -1;
    if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &gi) ==
        CUDNN_STATUS_SUCCESS)
      global_index[static_cast<std::size_t>(i)] = gi;
  }
  for (int pass = 0; pass < 2; ++pass)
    for (std::int64_t i = 0; i < got && i < count; ++i) {
      if (runtime_compiled[static_cast<std::size_t>(i)] != (pass == 1 ? 1 : 0)) continue;
      auto c = std::make_shared<GraphConvPlan>();
      SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, c->plan));
      SAFECKPT_CHECK(bd_set(c->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle->h));
      SAFECKPT_CHECK(bd_set(c->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                            &raw[static_cast<std::size_t>(i)]));
      if (cudnnBackendFinalize(c->plan.d) != CUDNN_STATUS_SUCCESS) continue;
      std::int64_t wsb = 0, n = 0;
      if (cudnnBackendGetAttribute(c->plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                   &wsb) != CUDNN_STATUS_SUCCESS ||
          wsb < 0 || static_cast<std::uint64_t>(wsb) > max_workspace)
        continue;
      c->handle = handle;
      c->workspace = static_cast<std::uint64_t>(wsb);
      c->with_z = with_z;
      c->engine = "engine " + std::to_string(global_index[static_cast<std::size_t>(i)]) +
                  (pass == 1 ? " (runtime-compiled)" : "");
      c->runtime_compiled = pass == 1;
      return c;
    }
  return std::shared_ptr<GraphConvPlan>();
}

std::vector<std::uint8_t> graph_conv_plan_bytes(const GraphConvPlan& c) {
  if (!c.runtime_compiled) return {};
  std::int64_t n = 0;
  if (cudnnBackendGetAttribute(c.plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return {};
  std::vector<std::uint8_t> b(c.engine.begin(), c.engine.end());
  b.push_back(0);
  const std::size_t at = b.size();
  b.resize(at + static_cast<std::size_t>(n));
  std::int64_t got = 0;
  if (cudnnBackendGetAttribute(c.plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &got,
                               b.data() + at) != CUDNN_STATUS_SUCCESS ||
      got <= 0 || got > n)
    return {};
  b.resize(at + static_cast<std::size_t>(got));
  return b;
}

std::shared_ptr<GraphConvPlan> graph_conv_from_bytes(std::shared_ptr<DnnHandle> handle, bool with_z,
                                                     std::uint64_t max_workspace,
                                                     const std::vector<std::uint8_t>& bytes) {
  const auto nul = std::find(bytes.begin(), bytes.end(), std::uint8_t{0});
  if (nul == bytes.end() || nul + 1 == bytes.end()) return nullptr;
  if (!cudnn_load_error().empty()) return nullptr;
  auto c = std::make_shared<GraphConvPlan>();
  c->engine.assign(bytes.begin(), nul);
  const auto at = static_cast<std::size_t>(nul - bytes.begin()) + 1;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &c->plan.d) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendSetAttribute(c->plan.d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle->h) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendSetAttribute(c->plan.d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                               static_cast<std::int64_t>(bytes.size() - at),
                               bytes.data() + at) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendFinalize(c->plan.d) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  std::int64_t wsb = 0, n = 0;
  if (cudnnBackendGetAttribute(c->plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &wsb) !=
          CUDNN_STATUS_SUCCESS ||
      wsb < 0 || static_cast<std::uint64_t>(wsb) > max_workspace)
    return nullptr;
  c->handle = std::move(handle);
  c->workspace = static_cast<std::uint64_t>(wsb);
  c->with_z = with_z;
  c->runtime_compiled = true;
  c->engine += " from the compile cache";
  return c;
}

std::uint64_t graph_conv_workspace_bytes(const GraphConvPlan& c) {
  return c.workspace;
}

int graph_conv_forward(const GraphConvPlan& c, const void* x, const void* w, const void* scale, const void* bias,
                       const void* z, void* y, void* workspace, std::uint64_t workspace_bytes, void* stream) {
  (void)workspace_bytes;  // at least c.workspace: the plan's workspace is the largest of its steps'
  cudnnStatus_t st = cudnnSetStream(c.handle->h, static_cast<cudaStream_t>(stream));
  if (st != CUDNN_STATUS_SUCCESS) return kDnnStatusBase + static_cast<int>(st);
  std::int64_t uids[6] = {kUidX, kUidW, kUidY, kUidScale, kUidBias, kUidZ};
  void* ptrs[6] = {const_cast<void*>(x),     const_cast<void*>(w),    y,
                   const_cast<void*>(scale), const_cast<void*>(bias), const_cast<void*>(z)};
  const std::int64_t n = c.with_z ? 6 : 5;
  Bd vp;
  st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp.d);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(vp.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(vp.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(vp.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(vp.d);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(c.handle->h, c.plan.d, vp.d);
  return st == CUDNN_STATUS_SUCCESS ? 0 : kDnnStatusBase + static_cast<int>(st);
}

std::string graph_conv_name(const GraphConvPlan& c) {
  return "cuDNN graph " + c.engine;
}

}  // namespace safeckpt::engine::detail
