// cuDNN, loaded on first use (dlopen) like cuBLASLt and NVRTC (lazy_libs.cpp
// says why): only a plan with a convolution opens libcudnn.so.<CUDNN_MAJOR>,
// so the `safeckpt` tool and programs without convolutions never map it.
//
// The engine uses cuDNN's convolution API of cudnn_cnn.h (cudnnConvolution-
// Forward and its descriptors; conv.cpp says why). In cuDNN 9 these entry
// points are exported by libcudnn.so.9, which forwards them to the
// sub-libraries beside it (libcudnn_cnn.so.9, libcudnn_ops.so.9,
// libcudnn_graph.so.9, engines); PyTorch's nvidia-cudnn wheel ships the same
// set in site-packages/nvidia/cudnn/lib (HACKING.md, GPU machine).
//
// Each entry point is defined with the header's prototype (the compiler
// checks the match) and forwards to the library's symbol, resolved once. When
// the library cannot be loaded, calls return CUDNN_STATUS_NOT_INITIALIZED and
// cudnnGetErrorString names the soname and dlerror(), which the engine
// reports as a kDevice error of the plan.
#include <cudnn.h>

#include <string>

#include "engine/lazy_library.hpp"

namespace {

using safeckpt::engine::detail::LazyLibrary;
using safeckpt::engine::detail::resolve;

LazyLibrary& cudnn() {
  static LazyLibrary lib("libcudnn.so." + std::to_string(CUDNN_MAJOR));
  return lib;
}

constexpr cudnnStatus_t kDnnUnavailable = CUDNN_STATUS_NOT_INITIALIZED;

}  // namespace

// The loader's message when libcudnn could not be opened; empty when it was.
namespace safeckpt::engine::detail {
std::string cudnn_load_error() {
  return cudnn().ensure() ? std::string() : cudnn().error();
}
}  // namespace safeckpt::engine::detail

extern "C" size_t CUDNNWINAPI cudnnGetVersion(void) {
  static const auto fn = resolve<decltype(&cudnnGetVersion)>(cudnn(), "cudnnGetVersion");
  return fn != nullptr ? fn() : 0;
}

extern "C" const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
  static const auto fn = resolve<decltype(&cudnnGetErrorString)>(cudnn(), "cudnnGetErrorString");
  if (fn == nullptr) return cudnn().ensure() ? "cuDNN: no cudnnGetErrorString" : cudnn().error().c_str();
  return fn(status);
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t* handle) {
  static const auto fn = resolve<decltype(&cudnnCreate)>(cudnn(), "cudnnCreate");
  return fn != nullptr ? fn(handle) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  static const auto fn = resolve<decltype(&cudnnDestroy)>(cudnn(), "cudnnDestroy");
  return fn != nullptr ? fn(handle) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  static const auto fn = resolve<decltype(&cudnnSetStream)>(cudnn(), "cudnnSetStream");
  return fn != nullptr ? fn(handle, streamId) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  static const auto fn = resolve<decltype(&cudnnCreateTensorDescriptor)>(cudnn(), "cudnnCreateTensorDescriptor");
  return fn != nullptr ? fn(tensorDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                                cudnnTensorFormat_t format, cudnnDataType_t dataType,
                                                                int n, int c, int h, int w) {
  static const auto fn = resolve<decltype(&cudnnSetTensor4dDescriptor)>(cudnn(), "cudnnSetTensor4dDescriptor");
  return fn != nullptr ? fn(tensorDesc, format, dataType, n, c, h, w) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  static const auto fn = resolve<decltype(&cudnnDestroyTensorDescriptor)>(cudnn(), "cudnnDestroyTensorDescriptor");
  return fn != nullptr ? fn(tensorDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) {
  static const auto fn = resolve<decltype(&cudnnCreateFilterDescriptor)>(cudnn(), "cudnnCreateFilterDescriptor");
  return fn != nullptr ? fn(filterDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
                                                                cudnnDataType_t dataType, cudnnTensorFormat_t format,
                                                                int k, int c, int h, int w) {
  static const auto fn = resolve<decltype(&cudnnSetFilter4dDescriptor)>(cudnn(), "cudnnSetFilter4dDescriptor");
  return fn != nullptr ? fn(filterDesc, dataType, format, k, c, h, w) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  static const auto fn = resolve<decltype(&cudnnDestroyFilterDescriptor)>(cudnn(), "cudnnDestroyFilterDescriptor");
  return fn != nullptr ? fn(filterDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  static const auto fn =
      resolve<decltype(&cudnnCreateConvolutionDescriptor)>(cudnn(), "cudnnCreateConvolutionDescriptor");
  return fn != nullptr ? fn(convDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  static const auto fn =
      resolve<decltype(&cudnnDestroyConvolutionDescriptor)>(cudnn(), "cudnnDestroyConvolutionDescriptor");
  return fn != nullptr ? fn(convDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h,
                                                                     int pad_w, int u, int v, int dilation_h,
                                                                     int dilation_w, cudnnConvolutionMode_t mode,
                                                                     cudnnDataType_t computeType) {
  static const auto fn =
      resolve<decltype(&cudnnSetConvolution2dDescriptor)>(cudnn(), "cudnnSetConvolution2dDescriptor");
  return fn != nullptr ? fn(convDesc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
                                                                   int groupCount) {
  static const auto fn = resolve<decltype(&cudnnSetConvolutionGroupCount)>(cudnn(), "cudnnSetConvolutionGroupCount");
  return fn != nullptr ? fn(convDesc, groupCount) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                                                 cudnnMathType_t mathType) {
  static const auto fn = resolve<decltype(&cudnnSetConvolutionMathType)>(cudnn(), "cudnnSetConvolutionMathType");
  return fn != nullptr ? fn(convDesc, mathType) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnGetConvolution2dForwardOutputDim(
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t inputTensorDesc,
    const cudnnFilterDescriptor_t filterDesc, int* n, int* c, int* h, int* w) {
  static const auto fn =
      resolve<decltype(&cudnnGetConvolution2dForwardOutputDim)>(cudnn(), "cudnnGetConvolution2dForwardOutputDim");
  return fn != nullptr ? fn(convDesc, inputTensorDesc, filterDesc, n, c, h, w) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  static const auto fn = resolve<decltype(&cudnnGetConvolutionForwardAlgorithmMaxCount)>(
      cudnn(), "cudnnGetConvolutionForwardAlgorithmMaxCount");
  return fn != nullptr ? fn(handle, count) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  static const auto fn =
      resolve<decltype(&cudnnGetConvolutionForwardAlgorithm_v7)>(cudnn(), "cudnnGetConvolutionForwardAlgorithm_v7");
  return fn != nullptr
             ? fn(handle, srcDesc, filterDesc, convDesc, destDesc, requestedAlgoCount, returnedAlgoCount, perfResults)
             : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t algo,
    size_t* sizeInBytes) {
  static const auto fn =
      resolve<decltype(&cudnnGetConvolutionForwardWorkspaceSize)>(cudnn(), "cudnnGetConvolutionForwardWorkspaceSize");
  return fn != nullptr ? fn(handle, xDesc, wDesc, convDesc, yDesc, algo, sizeInBytes) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                                             const cudnnFilterDescriptor_t wDesc, const void* w,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             cudnnConvolutionFwdAlgo_t algo, void* workSpace,
                                                             size_t workSpaceSizeInBytes, const void* beta,
                                                             const cudnnTensorDescriptor_t yDesc, void* y) {
  static const auto fn = resolve<decltype(&cudnnConvolutionForward)>(cudnn(), "cudnnConvolutionForward");
  return fn != nullptr
             ? fn(handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, yDesc, y)
             : kDnnUnavailable;
}

// The fused convolution of a folded batch norm (conv.cpp, conv_bias_relu_forward).
extern "C" cudnnStatus_t CUDNNWINAPI cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* activationDesc) {
  static const auto fn =
      resolve<decltype(&cudnnCreateActivationDescriptor)>(cudnn(), "cudnnCreateActivationDescriptor");
  return fn != nullptr ? fn(activationDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
                                                                  cudnnActivationMode_t mode,
                                                                  cudnnNanPropagation_t reluNanOpt, double coef) {
  static const auto fn = resolve<decltype(&cudnnSetActivationDescriptor)>(cudnn(), "cudnnSetActivationDescriptor");
  return fn != nullptr ? fn(activationDesc, mode, reluNanOpt, coef) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc) {
  static const auto fn =
      resolve<decltype(&cudnnDestroyActivationDescriptor)>(cudnn(), "cudnnDestroyActivationDescriptor");
  return fn != nullptr ? fn(activationDesc) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void* alpha1, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* alpha2,
    const cudnnTensorDescriptor_t zDesc, const void* z, const cudnnTensorDescriptor_t biasDesc, const void* bias,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t yDesc, void* y) {
  static const auto fn =
      resolve<decltype(&cudnnConvolutionBiasActivationForward)>(cudnn(), "cudnnConvolutionBiasActivationForward");
  return fn != nullptr ? fn(handle, alpha1, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes, alpha2,
                            zDesc, z, biasDesc, bias, activationDesc, yDesc, y)
                       : kDnnUnavailable;
}

// The backend graph API (cudnn_graph.h) for the bfloat16 fused convolution
// (conv.cpp, graph_conv_prepare).
extern "C" cudnnStatus_t CUDNNWINAPI cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                                  cudnnBackendDescriptor_t* descriptor) {
  static const auto fn = resolve<decltype(&cudnnBackendCreateDescriptor)>(cudnn(), "cudnnBackendCreateDescriptor");
  return fn != nullptr ? fn(descriptorType, descriptor) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  static const auto fn = resolve<decltype(&cudnnBackendDestroyDescriptor)>(cudnn(), "cudnnBackendDestroyDescriptor");
  return fn != nullptr ? fn(descriptor) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  static const auto fn = resolve<decltype(&cudnnBackendFinalize)>(cudnn(), "cudnnBackendFinalize");
  return fn != nullptr ? fn(descriptor) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                                              cudnnBackendAttributeName_t attributeName,
                                                              cudnnBackendAttributeType_t attributeType,
                                                              int64_t elementCount, const void* arrayOfElements) {
  static const auto fn = resolve<decltype(&cudnnBackendSetAttribute)>(cudnn(), "cudnnBackendSetAttribute");
  return fn != nullptr ? fn(descriptor, attributeName, attributeType, elementCount, arrayOfElements) : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                                              cudnnBackendAttributeName_t attributeName,
                                                              cudnnBackendAttributeType_t attributeType,
                                                              int64_t requestedElementCount, int64_t* elementCount,
                                                              void* arrayOfElements) {
  static const auto fn = resolve<decltype(&cudnnBackendGetAttribute)>(cudnn(), "cudnnBackendGetAttribute");
  return fn != nullptr
             ? fn(descriptor, attributeName, attributeType, requestedElementCount, elementCount, arrayOfElements)
             : kDnnUnavailable;
}

extern "C" cudnnStatus_t CUDNNWINAPI cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                                         cudnnBackendDescriptor_t variantPack) {
  static const auto fn = resolve<decltype(&cudnnBackendExecute)>(cudnn(), "cudnnBackendExecute");
  return fn != nullptr ? fn(handle, executionPlan, variantPack) : kDnnUnavailable;
}
