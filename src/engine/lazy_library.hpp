// A shared library opened on first use (dlopen), for the engine's lazily
// loaded CUDA libraries (lazy_libs.cpp: cuBLASLt, NVRTC; lazy_cudnn.cpp:
// cuDNN). Not installed.
#pragma once

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace safeckpt::engine::detail {

class LazyLibrary {
 public:
  explicit LazyLibrary(std::string soname) : soname_(std::move(soname)) {}

  // Loads the library once (thread-safe); false when it could not be loaded.
  bool ensure() {
    std::call_once(once_, [this] {
      handle_ = dlopen(soname_.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_ == nullptr) {
        const char* e = dlerror();
        error_ = "could not load " + soname_ + " (" + (e != nullptr ? e : "unknown error") +
                 "); install the CUDA toolkit's library or put PyTorch's nvidia wheels on LD_LIBRARY_PATH";
      }
    });
    return handle_ != nullptr;
  }
  void* symbol(const char* name) { return ensure() ? dlsym(handle_, name) : nullptr; }
  const std::string& error() const { return error_; }
  const std::string& soname() const { return soname_; }

 private:
  std::string soname_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
};

template <class Fn>
Fn resolve(LazyLibrary& lib, const char* name) {
  return reinterpret_cast<Fn>(lib.symbol(name));
}

}  // namespace safeckpt::engine::detail
