// src/engine/dnn_graph.cpp — cuDNN's backend graph API (cudnn_graph.h):
// bfloat16 convolutions with a folded batch norm epilogue and fused
// scaled dot product attention, each one operation graph whose execution
// plan cuDNN's heuristics pick (conv.hpp declares both). The rest of cuDNN
// (the legacy convolution API) is conv.cpp.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/conv.hpp"
#include "engine/dnn_internal.hpp"

namespace safeckpt::engine::detail {

std::string cudnn_load_error();  // lazy_cudnn.cpp

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

// A 4-D tensor (dims in the graph's order, e.g. N, C, H, W; strides in
// elements). `by_value`: a scalar passed by host pointer in the variant
// pack (copied when the graph is enqueued).
Status tensor_desc(Bd& b, std::int64_t uid, cudnnDataType_t ty, const std::int64_t (&dims)[4],
                   const std::int64_t (&strides)[4], bool is_virtual, bool by_value = false) {
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, b));
  const std::int64_t align = 16;
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ty));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
  SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
  if (by_value) SAFECKPT_CHECK(bd_set(b, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
  return dnn_ok(cudnnBackendFinalize(b.d), "tensor descriptor");
}

// A pointwise operation y = mode(x[, b][, t]) computed in `prec`; `axis`
// (>= 0) for CUDNN_POINTWISE_GEN_INDEX; `t` the third input of
// CUDNN_POINTWISE_BINARY_SELECT (y = t ? x : b).
struct PwExtra {
  const Bd* t = nullptr;
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  std::int64_t axis = -1;
};
Status pointwise_op(Bd& op, Bd& pw, cudnnPointwiseMode_t mode, const Bd& x, const Bd* b, const Bd& y,
                    PwExtra extra = {}) {
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw));
  SAFECKPT_CHECK(bd_set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  SAFECKPT_CHECK(bd_set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &extra.prec));
  if (extra.axis >= 0) SAFECKPT_CHECK(bd_set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &extra.axis));
  SAFECKPT_CHECK(dnn_ok(cudnnBackendFinalize(pw.d), "pointwise descriptor"));
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
  if (b != nullptr) SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b));
  if (extra.t != nullptr) SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *extra.t));
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

struct GraphPlan {
  std::shared_ptr<DnnHandle> handle;
  Bd plan;  // the finalized execution plan (keeps what it needs of the graph)
  std::uint64_t workspace = 0;
  bool with_z = false;
  std::string engine;  // "engine <global index>" of the chosen config
  bool runtime_compiled = false;
  bool sdpa_causal = false;  // graph_sdpa_prepare's: the variant pack has the -inf scalar
  bool sdpa_bias = false;    // and the bias tensor
};

namespace {

// The first of cuDNN's heuristic engine configs (CUDNN_HEUR_MODE_A) for the
// finalized operation `graph` whose execution plan finalizes within
// `max_workspace`; precompiled engines before runtime-compiled ones. nullptr
// when none does; errors: kDevice (a descriptor cuDNN refuses to create).
Result<std::shared_ptr<GraphPlan>> choose_graph_plan(const std::shared_ptr<DnnHandle>& handle, const Bd& graph,
                                                     std::uint64_t max_workspace) {
  Bd heur;
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, heur));
  const cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
  SAFECKPT_CHECK(bd_set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
  SAFECKPT_CHECK(bd_set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm));
  if (cudnnBackendFinalize(heur.d) != CUDNN_STATUS_SUCCESS) return std::shared_ptr<GraphPlan>();
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return std::shared_ptr<GraphPlan>();
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
    return std::shared_ptr<GraphPlan>();
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
      auto c = std::make_shared<GraphPlan>();
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
      c->engine = "engine " + std::to_string(global_index[static_cast<std::size_t>(i)]) +
                  (pass == 1 ? " (runtime-compiled)" : "");
      c->runtime_compiled = pass == 1;
      return c;
    }
  return std::shared_ptr<GraphPlan>();
}

}  // namespace

namespace {

// Enqueues `c` on its handle's stream with the variant pack (uids[i] ->
// ptrs[i], i < n; by-value scalars are host pointers, read now). Returns 0 or
// kDnnStatusBase + status.
int execute_plan(const GraphPlan& c, std::int64_t n, std::int64_t* uids, void** ptrs, void* workspace) {
  Bd vp;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp.d);
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

}  // namespace

Result<std::shared_ptr<GraphPlan>> graph_conv_prepare(std::shared_ptr<DnnHandle> handle, const ConvGeometry& g,
                                                      bool with_z, std::uint64_t max_workspace) {
  if (g.groups != 1) return std::shared_ptr<GraphPlan>();
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
  if (cudnnBackendFinalize(graph.d) != CUDNN_STATUS_SUCCESS) return std::shared_ptr<GraphPlan>();

  SAFECKPT_TRY(auto c, choose_graph_plan(handle, graph, max_workspace));
  if (c) c->with_z = with_z;
  return c;
}

std::vector<std::uint8_t> graph_conv_plan_bytes(const GraphPlan& c) {
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

std::shared_ptr<GraphPlan> graph_conv_from_bytes(std::shared_ptr<DnnHandle> handle, bool with_z,
                                                 std::uint64_t max_workspace, const std::vector<std::uint8_t>& bytes) {
  const auto nul = std::find(bytes.begin(), bytes.end(), std::uint8_t{0});
  if (nul == bytes.end() || nul + 1 == bytes.end()) return nullptr;
  if (!cudnn_load_error().empty()) return nullptr;
  auto c = std::make_shared<GraphPlan>();
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

std::uint64_t graph_conv_workspace_bytes(const GraphPlan& c) {
  return c.workspace;
}

int graph_conv_forward(const GraphPlan& c, const void* x, const void* w, const void* scale, const void* bias,
                       const void* z, void* y, void* workspace, std::uint64_t workspace_bytes, void* stream) {
  (void)workspace_bytes;  // at least c.workspace: the plan's workspace is the largest of its steps'
  const cudnnStatus_t st = cudnnSetStream(c.handle->h, static_cast<cudaStream_t>(stream));
  if (st != CUDNN_STATUS_SUCCESS) return kDnnStatusBase + static_cast<int>(st);
  std::int64_t uids[6] = {kUidX, kUidW, kUidY, kUidScale, kUidBias, kUidZ};
  void* ptrs[6] = {const_cast<void*>(x),     const_cast<void*>(w),    y,
                   const_cast<void*>(scale), const_cast<void*>(bias), const_cast<void*>(z)};
  const std::int64_t n = c.with_z ? 6 : 5;
  return execute_plan(c, n, uids, ptrs, workspace);
}

std::string graph_conv_name(const GraphPlan& c) {
  return "cuDNN graph " + c.engine;
}

// ------------------------------------------------ fused attention
// Scaled dot product attention as the operation graph cuDNN 9's fused
// flash-attention engines match (what cudnn-frontend's sdpa node emits for
// inference, and ATen's cuDNN attention, aten/src/ATen/native/cudnn/MHA.cpp,
// goes through): S = Q K^T (fp32), S * scale, [+ bias: cudnn-frontend's
// sdpa "bias" input, a bfloat16 tensor broadcast over b / h by dims of 1],
// [causal: gen_index(row, axis 2), gen_index(col, axis 3), row >= col,
// select(S, -inf)], the softmax as max, sub, exp, sum, div (P in the input
// dtype), log(sum) + max (the softmax statistics, virtual: the engine's
// pattern has them), O = P V. K^T is K's descriptor with its last two dims
// and strides swapped (no copy).
// cuDNN 9.19's single SDPA operation (CUDNN_BACKEND_OPERATION_SDPA_FWD_
// DESCRIPTOR) has no causal mask attribute, so the composite graph serves
// both cases.

namespace {

enum : std::int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidAttnScale,
  kUidNegInf,
  kUidAttnBias,
  kUidS1 = 101,
  kUidS2,
  kUidRow,
  kUidCol,
  kUidKeep,
  kUidMasked,
  kUidMax,
  kUidSub,
  kUidExp,
  kUidSum,
  kUidLog,
  kUidStats,
  kUidP,
  kUidAttnBiased
};

Status matmul_op(Bd& op, Bd& mm, const Bd& a, const Bd& b, const Bd& c) {
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, mm));
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  SAFECKPT_CHECK(bd_set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
  SAFECKPT_CHECK(dnn_ok(cudnnBackendFinalize(mm.d), "matmul descriptor"));
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, op));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm));
  return dnn_ok(cudnnBackendFinalize(op.d), "matmul operation");
}

Status reduction_op(Bd& op, Bd& rd, cudnnReduceTensorOp_t mode, const Bd& x, const Bd& y) {
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, rd));
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  SAFECKPT_CHECK(bd_set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
  SAFECKPT_CHECK(bd_set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
  SAFECKPT_CHECK(dnn_ok(cudnnBackendFinalize(rd.d), "reduction descriptor"));
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, op));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y));
  SAFECKPT_CHECK(bd_set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd));
  return dnn_ok(cudnnBackendFinalize(op.d), "reduction operation");
}

}  // namespace

bool sdpa_graph_applies(const SdpaGeometry& g) {
  auto dense_last = [](const std::int64_t(&s)[4]) { return s[3] == 1; };
  auto aligned = [](const std::int64_t(&s)[4]) { return s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0; };
  const bool bias_ok = !g.bias || ((g.bias_b == 1 || g.bias_b == g.b) && (g.bias_h == 1 || g.bias_h == g.h));
  return g.bf16 && g.b > 0 && g.h > 0 && g.l > 0 && g.s > 0 && g.d > 0 && g.dv > 0 && g.d % 8 == 0 && g.dv % 8 == 0 &&
         g.d <= 128 && g.dv <= 128 && dense_last(g.q_s) && dense_last(g.k_s) && dense_last(g.v_s) &&
         dense_last(g.o_s) && aligned(g.q_s) && aligned(g.k_s) && aligned(g.v_s) && aligned(g.o_s) && bias_ok;
}

std::string sdpa_choice_key(const SdpaGeometry& g, std::uint64_t max_workspace) {
  std::string k = "graph plan sdpa v1 cudnn " + std::to_string(cudnnGetVersion()) + ":";  // v: the graph as built
  for (long long v : {g.b, g.h, g.l, g.s, g.d, g.dv}) k += std::to_string(v) + ",";
  for (const auto* st : {&g.q_s, &g.k_s, &g.v_s, &g.o_s})
    for (std::int64_t v : *st) k += std::to_string(v) + ",";
  k += std::string(g.bf16 ? "bf16," : "fp32,") + (g.causal ? "causal," : "full,") + std::to_string(max_workspace);
  if (g.bias) k += ",bias " + std::to_string(g.bias_b) + "," + std::to_string(g.bias_h);
  return k;
}

Result<std::shared_ptr<GraphPlan>> graph_sdpa_prepare(std::shared_ptr<DnnHandle> handle, const SdpaGeometry& g,
                                                      std::uint64_t max_workspace) {
  if (!sdpa_graph_applies(g)) return std::shared_ptr<GraphPlan>();
  std::string load = cudnn_load_error();
  if (!load.empty()) return make_error(ErrorCode::kDevice, "cuDNN (attention): " + load);
  const cudnnDataType_t io = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32,
                        boolean = CUDNN_DATA_BOOLEAN;
  const std::int64_t qd[4] = {g.b, g.h, g.l, g.d}, ktd[4] = {g.b, g.h, g.d, g.s}, vd[4] = {g.b, g.h, g.s, g.dv},
                     od[4] = {g.b, g.h, g.l, g.dv}, sd[4] = {g.b, g.h, g.l, g.s}, rd[4] = {g.b, g.h, g.l, 1},
                     one[4] = {1, 1, 1, 1};
  const std::int64_t kts[4] = {g.k_s[0], g.k_s[1], g.k_s[3], g.k_s[2]};  // K^T: K's last two dims swapped
  const std::int64_t ss[4] = {g.h * g.l * g.s, g.l * g.s, g.s, 1}, rs[4] = {g.h * g.l, g.l, 1, 1};
  const std::int64_t bld = sdpa_bias_ld(g.s);
  const std::int64_t bd[4] = {g.bias_b, g.bias_h, g.l, g.s}, bs[4] = {g.bias_h * g.l * bld, g.l * bld, bld, 1};
  Bd q, kt, v, o, scale, neg_inf, s1, s2, bias, biased, row, col, keep, masked, mx, sub, ex, sum, lg, stats, p;
  SAFECKPT_CHECK(tensor_desc(q, kUidQ, io, qd, g.q_s, false));
  SAFECKPT_CHECK(tensor_desc(kt, kUidK, io, ktd, kts, false));
  SAFECKPT_CHECK(tensor_desc(v, kUidV, io, vd, g.v_s, false));
  SAFECKPT_CHECK(tensor_desc(o, kUidO, io, od, g.o_s, false));
  SAFECKPT_CHECK(tensor_desc(scale, kUidAttnScale, f32, one, one, false, true));
  SAFECKPT_CHECK(tensor_desc(s1, kUidS1, f32, sd, ss, true));
  SAFECKPT_CHECK(tensor_desc(s2, kUidS2, f32, sd, ss, true));
  if (g.bias) {
    SAFECKPT_CHECK(tensor_desc(bias, kUidAttnBias, io, bd, bs, false));
    SAFECKPT_CHECK(tensor_desc(biased, kUidAttnBiased, f32, sd, ss, true));
  }
  if (g.causal) {
    SAFECKPT_CHECK(tensor_desc(neg_inf, kUidNegInf, f32, one, one, false, true));
    SAFECKPT_CHECK(tensor_desc(row, kUidRow, i32, sd, ss, true));
    SAFECKPT_CHECK(tensor_desc(col, kUidCol, i32, sd, ss, true));
    SAFECKPT_CHECK(tensor_desc(keep, kUidKeep, boolean, sd, ss, true));
    SAFECKPT_CHECK(tensor_desc(masked, kUidMasked, f32, sd, ss, true));
  }
  SAFECKPT_CHECK(tensor_desc(mx, kUidMax, f32, rd, rs, true));
  SAFECKPT_CHECK(tensor_desc(sub, kUidSub, f32, sd, ss, true));
  SAFECKPT_CHECK(tensor_desc(ex, kUidExp, f32, sd, ss, true));
  SAFECKPT_CHECK(tensor_desc(sum, kUidSum, f32, rd, rs, true));
  SAFECKPT_CHECK(tensor_desc(lg, kUidLog, f32, rd, rs, true));
  SAFECKPT_CHECK(tensor_desc(stats, kUidStats, f32, rd, rs, true));
  SAFECKPT_CHECK(tensor_desc(p, kUidP, io, sd, ss, true));

  Bd mm1, mm1_d, mul, mul_pw, add, add_pw, gr, gr_pw, gc, gc_pw, ge, ge_pw, sel, sel_pw, rmax, rmax_d, sb, sb_pw, e,
      e_pw, rsum, rsum_d, l, l_pw, st, st_pw, dv, dv_pw, mm2, mm2_d;
  SAFECKPT_CHECK(matmul_op(mm1, mm1_d, q, kt, s1));
  SAFECKPT_CHECK(pointwise_op(mul, mul_pw, CUDNN_POINTWISE_MUL, s1, &scale, s2));
  const Bd* scores = &s2;
  if (g.bias) {
    SAFECKPT_CHECK(pointwise_op(add, add_pw, CUDNN_POINTWISE_ADD, s2, &bias, biased));
    scores = &biased;
  }
  if (g.causal) {
    SAFECKPT_CHECK(pointwise_op(gr, gr_pw, CUDNN_POINTWISE_GEN_INDEX, *scores, nullptr, row, {nullptr, f32, 2}));
    SAFECKPT_CHECK(pointwise_op(gc, gc_pw, CUDNN_POINTWISE_GEN_INDEX, *scores, nullptr, col, {nullptr, f32, 3}));
    SAFECKPT_CHECK(pointwise_op(ge, ge_pw, CUDNN_POINTWISE_CMP_GE, row, &col, keep, {nullptr, boolean, -1}));
    SAFECKPT_CHECK(
        pointwise_op(sel, sel_pw, CUDNN_POINTWISE_BINARY_SELECT, *scores, &neg_inf, masked, {&keep, f32, -1}));
    scores = &masked;
  }
  SAFECKPT_CHECK(reduction_op(rmax, rmax_d, CUDNN_REDUCE_TENSOR_MAX, *scores, mx));
  SAFECKPT_CHECK(pointwise_op(sb, sb_pw, CUDNN_POINTWISE_SUB, *scores, &mx, sub));
  SAFECKPT_CHECK(pointwise_op(e, e_pw, CUDNN_POINTWISE_EXP, sub, nullptr, ex));
  SAFECKPT_CHECK(reduction_op(rsum, rsum_d, CUDNN_REDUCE_TENSOR_ADD, ex, sum));
  SAFECKPT_CHECK(pointwise_op(l, l_pw, CUDNN_POINTWISE_LOG, sum, nullptr, lg));
  SAFECKPT_CHECK(pointwise_op(st, st_pw, CUDNN_POINTWISE_ADD, mx, &lg, stats));
  SAFECKPT_CHECK(pointwise_op(dv, dv_pw, CUDNN_POINTWISE_DIV, ex, &sum, p));
  SAFECKPT_CHECK(matmul_op(mm2, mm2_d, p, v, o));

  Bd graph;
  SAFECKPT_CHECK(bd_make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
  std::vector<cudnnBackendDescriptor_t> ops = {mm1.d, mul.d};
  if (g.bias) ops.push_back(add.d);
  if (g.causal) ops.insert(ops.end(), {gr.d, gc.d, ge.d, sel.d});
  ops.insert(ops.end(), {rmax.d, sb.d, e.d, rsum.d, l.d, st.d, dv.d, mm2.d});
  SAFECKPT_CHECK(bd_set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        static_cast<std::int64_t>(ops.size()), ops.data()));
  SAFECKPT_CHECK(bd_set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle->h));
  if (cudnnBackendFinalize(graph.d) != CUDNN_STATUS_SUCCESS) return std::shared_ptr<GraphPlan>();
  SAFECKPT_TRY(auto c, choose_graph_plan(handle, graph, max_workspace));
  if (c) {
    c->sdpa_causal = g.causal;
    c->sdpa_bias = g.bias;
  }
  return c;
}

std::shared_ptr<GraphPlan> graph_sdpa_from_bytes(std::shared_ptr<DnnHandle> handle, const SdpaGeometry& g,
                                                 std::uint64_t max_workspace, const std::vector<std::uint8_t>& bytes) {
  auto c = graph_conv_from_bytes(std::move(handle), false, max_workspace, bytes);
  if (c) {
    c->sdpa_causal = g.causal;
    c->sdpa_bias = g.bias;
  }
  return c;
}

int graph_sdpa_forward(const GraphPlan& c, const void* q, const void* k, const void* v, const void* bias, void* o,
                       float scale, void* workspace, void* stream) {
  const cudnnStatus_t st = cudnnSetStream(c.handle->h, static_cast<cudaStream_t>(stream));
  if (st != CUDNN_STATUS_SUCCESS) return kDnnStatusBase + static_cast<int>(st);
  // By-value scalars: read from these host addresses when the call is
  // enqueued (and baked into a captured CUDA graph's launch).
  float scale_v = scale, neg_inf = -INFINITY;
  std::int64_t uids[7] = {kUidQ, kUidK, kUidV, kUidO, kUidAttnScale};
  void* ptrs[7] = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, &scale_v};
  std::int64_t n = 5;
  if (c.sdpa_causal) {
    uids[n] = kUidNegInf;
    ptrs[n++] = &neg_inf;
  }
  if (c.sdpa_bias) {
    uids[n] = kUidAttnBias;
    ptrs[n++] = const_cast<void*>(bias);
  }
  return execute_plan(c, n, uids, ptrs, workspace);
}

}  // namespace safeckpt::engine::detail
