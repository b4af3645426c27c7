// src/engine/dnn_internal.hpp — what conv.cpp and dnn_graph.cpp share of
// cuDNN (includes cudnn.h; not for files that must build without it).
#pragma once

#include <cudnn.h>

#include <string>

#include "engine/conv.hpp"

namespace safeckpt::engine::detail {

struct DnnHandle {
  DnnHandle() = default;
  DnnHandle(const DnnHandle&) = delete;
  DnnHandle& operator=(const DnnHandle&) = delete;
  ~DnnHandle() {
    if (h != nullptr) cudnnDestroy(h);
  }
  cudnnHandle_t h = nullptr;
};

// A cuDNN status as the engine's error (kDevice, cuDNN's own text).
inline Status dnn_ok(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return {};
  return make_error(ErrorCode::kDevice, std::string("cuDNN ") + what + ": " + cudnnGetErrorString(st));
}

}  // namespace safeckpt::engine::detail
