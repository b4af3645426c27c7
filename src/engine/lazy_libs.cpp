// cuBLASLt and NVRTC, loaded on first use (dlopen) instead of at program
// start. Linking them made every process that links the engine — the
// `safeckpt` tool included, for `scan` and `inspect` too — map the 540 MB
// libcublasLt and run its static initialisers (~0.5 s of CPU per start, seen
// with strace/time on a CUDA 13 toolkit); PyTorch loads NVRTC lazily for the
// same reason (ATen's LazyNVRTC).
//
// Each entry point the engine calls is defined here with the header's own
// prototype (the compiler checks the match) and forwards to the symbol of the
// library, resolved once. When the library cannot be loaded, calls return
// CUBLAS_STATUS_NOT_INITIALIZED / NVRTC_ERROR_INTERNAL_ERROR and the
// error-string functions name the library, the soname and dlerror(), so
// Engine::create reports it as a kDevice error. Sonames follow the toolkit's
// major version (CUBLAS_VER_MAJOR, CUDART_VERSION / 1000); the loader's search
// path applies (LD_LIBRARY_PATH, e.g. PyTorch's nvidia-* wheels, HACKING.md).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <string>

#include "engine/lazy_library.hpp"

namespace {

using safeckpt::engine::detail::LazyLibrary;
using safeckpt::engine::detail::resolve;

LazyLibrary& cublaslt() {
  static LazyLibrary lib("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
  return lib;
}

LazyLibrary& nvrtc() {
  static LazyLibrary lib("libnvrtc.so." + std::to_string(CUDART_VERSION / 1000));
  return lib;
}

constexpr cublasStatus_t kLtUnavailable = CUBLAS_STATUS_NOT_INITIALIZED;
constexpr nvrtcResult kNvrtcUnavailable = NVRTC_ERROR_INTERNAL_ERROR;

}  // namespace

// ------------------------------------------------------------------ cuBLASLt

extern "C" const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  static const auto fn = resolve<decltype(&cublasLtGetStatusString)>(cublaslt(), "cublasLtGetStatusString");
  if (fn == nullptr) return cublaslt().ensure() ? "cuBLASLt: no cublasLtGetStatusString" : cublaslt().error().c_str();
  return fn(status);
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  static const auto fn = resolve<decltype(&cublasLtCreate)>(cublaslt(), "cublasLtCreate");
  return fn != nullptr ? fn(lightHandle) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  static const auto fn = resolve<decltype(&cublasLtDestroy)>(cublaslt(), "cublasLtDestroy");
  return fn != nullptr ? fn(lightHandle) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                                      const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                                      const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                                                      const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                                      cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                                      void* workspace, size_t workspaceSizeInBytes,
                                                      cudaStream_t stream) {
  static const auto fn = resolve<decltype(&cublasLtMatmul)>(cublaslt(), "cublasLtMatmul");
  return fn != nullptr ? fn(lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                            workspace, workspaceSizeInBytes, stream)
                       : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  static const auto fn =
      resolve<decltype(&cublasLtMatmulAlgoGetHeuristic)>(cublaslt(), "cublasLtMatmulAlgoGetHeuristic");
  return fn != nullptr ? fn(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
                            heuristicResultsArray, returnAlgoCount)
                       : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI
cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
                        cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                        const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  static const auto fn = resolve<decltype(&cublasLtMatmulAlgoCheck)>(cublaslt(), "cublasLtMatmulAlgoCheck");
  return fn != nullptr ? fn(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, algo, result) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                                         cublasLtMatmulAlgoCapAttributes_t attr,
                                                                         void* buf, size_t sizeInBytes,
                                                                         size_t* sizeWritten) {
  static const auto fn =
      resolve<decltype(&cublasLtMatmulAlgoCapGetAttribute)>(cublaslt(), "cublasLtMatmulAlgoCapGetAttribute");
  return fn != nullptr ? fn(algo, attr, buf, sizeInBytes, sizeWritten) : kLtUnavailable;
}

extern "C" size_t CUBLASWINAPI cublasLtGetVersion(void) {
  static const auto fn = resolve<decltype(&cublasLtGetVersion)>(cublaslt(), "cublasLtGetVersion");
  return fn != nullptr ? fn() : 0;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                                cublasComputeType_t computeType,
                                                                cudaDataType_t scaleType) {
  static const auto fn = resolve<decltype(&cublasLtMatmulDescCreate)>(cublaslt(), "cublasLtMatmulDescCreate");
  return fn != nullptr ? fn(matmulDesc, computeType, scaleType) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  static const auto fn = resolve<decltype(&cublasLtMatmulDescDestroy)>(cublaslt(), "cublasLtMatmulDescDestroy");
  return fn != nullptr ? fn(matmulDesc) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                                      cublasLtMatmulDescAttributes_t attr,
                                                                      const void* buf, size_t sizeInBytes) {
  static const auto fn =
      resolve<decltype(&cublasLtMatmulDescSetAttribute)>(cublaslt(), "cublasLtMatmulDescSetAttribute");
  return fn != nullptr ? fn(matmulDesc, attr, buf, sizeInBytes) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  static const auto fn =
      resolve<decltype(&cublasLtMatmulPreferenceCreate)>(cublaslt(), "cublasLtMatmulPreferenceCreate");
  return fn != nullptr ? fn(pref) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  static const auto fn =
      resolve<decltype(&cublasLtMatmulPreferenceDestroy)>(cublaslt(), "cublasLtMatmulPreferenceDestroy");
  return fn != nullptr ? fn(pref) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                            cublasLtMatmulPreferenceAttributes_t attr,
                                                                            const void* buf, size_t sizeInBytes) {
  static const auto fn =
      resolve<decltype(&cublasLtMatmulPreferenceSetAttribute)>(cublaslt(), "cublasLtMatmulPreferenceSetAttribute");
  return fn != nullptr ? fn(pref, attr, buf, sizeInBytes) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                                                  uint64_t rows, uint64_t cols, int64_t ld) {
  static const auto fn = resolve<decltype(&cublasLtMatrixLayoutCreate)>(cublaslt(), "cublasLtMatrixLayoutCreate");
  return fn != nullptr ? fn(matLayout, type, rows, cols, ld) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  static const auto fn = resolve<decltype(&cublasLtMatrixLayoutDestroy)>(cublaslt(), "cublasLtMatrixLayoutDestroy");
  return fn != nullptr ? fn(matLayout) : kLtUnavailable;
}

extern "C" cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                                        cublasLtMatrixLayoutAttribute_t attr,
                                                                        const void* buf, size_t sizeInBytes) {
  static const auto fn =
      resolve<decltype(&cublasLtMatrixLayoutSetAttribute)>(cublaslt(), "cublasLtMatrixLayoutSetAttribute");
  return fn != nullptr ? fn(matLayout, attr, buf, sizeInBytes) : kLtUnavailable;
}

// --------------------------------------------------------------------- NVRTC

extern "C" const char* nvrtcGetErrorString(nvrtcResult result) {
  static const auto fn = resolve<decltype(&nvrtcGetErrorString)>(nvrtc(), "nvrtcGetErrorString");
  if (fn == nullptr) return nvrtc().ensure() ? "NVRTC: no nvrtcGetErrorString" : nvrtc().error().c_str();
  return fn(result);
}

extern "C" nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int numHeaders,
                                          const char* const* headers, const char* const* includeNames) {
  static const auto fn = resolve<decltype(&nvrtcCreateProgram)>(nvrtc(), "nvrtcCreateProgram");
  return fn != nullptr ? fn(prog, src, name, numHeaders, headers, includeNames) : kNvrtcUnavailable;
}

extern "C" nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char* const* options) {
  static const auto fn = resolve<decltype(&nvrtcCompileProgram)>(nvrtc(), "nvrtcCompileProgram");
  return fn != nullptr ? fn(prog, numOptions, options) : kNvrtcUnavailable;
}

extern "C" nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  static const auto fn = resolve<decltype(&nvrtcDestroyProgram)>(nvrtc(), "nvrtcDestroyProgram");
  return fn != nullptr ? fn(prog) : kNvrtcUnavailable;
}

extern "C" nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* cubinSizeRet) {
  static const auto fn = resolve<decltype(&nvrtcGetCUBINSize)>(nvrtc(), "nvrtcGetCUBINSize");
  return fn != nullptr ? fn(prog, cubinSizeRet) : kNvrtcUnavailable;
}

extern "C" nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
  static const auto fn = resolve<decltype(&nvrtcGetCUBIN)>(nvrtc(), "nvrtcGetCUBIN");
  return fn != nullptr ? fn(prog, cubin) : kNvrtcUnavailable;
}

extern "C" nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* logSizeRet) {
  static const auto fn = resolve<decltype(&nvrtcGetProgramLogSize)>(nvrtc(), "nvrtcGetProgramLogSize");
  return fn != nullptr ? fn(prog, logSizeRet) : kNvrtcUnavailable;
}

extern "C" nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  static const auto fn = resolve<decltype(&nvrtcGetProgramLog)>(nvrtc(), "nvrtcGetProgramLog");
  return fn != nullptr ? fn(prog, log) : kNvrtcUnavailable;
}
