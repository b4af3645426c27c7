// C entry points over safeckpt::cuda::load_to_device for the Python interop
// check (tests/cuda/check_dlpack.py): Python wraps the DLPack structs in
// capsules and hands them to torch.from_dlpack / cupy.from_dlpack.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "safeckpt/device_checkpoint.hpp"

namespace {
struct Handle {
  safeckpt::cuda::DeviceCheckpoint ckpt;
  std::vector<safeckpt::cuda::DeviceTensor> tensors;
};
}  // namespace

extern "C" {

void* sck_open(const char* path, const char* allow_file, char* err, int errlen) {
  safeckpt::Allowlist allow = safeckpt::Allowlist::default_policy();
  if (allow_file != nullptr && *allow_file) {
    auto st = allow.add_file(allow_file);
    if (!st) {
      std::snprintf(err, static_cast<std::size_t>(errlen), "%s", st.error().to_string().c_str());
      return nullptr;
    }
  }
  safeckpt::cuda::DeviceLoadOptions o;
  o.load.allowlist = &allow;
  auto r = safeckpt::cuda::load_to_device(path, o);
  if (!r) {
    std::snprintf(err, static_cast<std::size_t>(errlen), "%s", r.error().to_string().c_str());
    return nullptr;
  }
  auto* h = new Handle{std::move(r).value(), {}};
  h->tensors = h->ckpt.tensors();
  return h;
}

int sck_count(void* h) {
  return static_cast<int>(static_cast<Handle*>(h)->tensors.size());
}

const char* sck_name(void* h, int i) {
  return static_cast<Handle*>(h)->tensors[static_cast<std::size_t>(i)].name.c_str();
}

void* sck_dlpack(void* h, int i, int versioned, char* err, int errlen) {
  auto* hd = static_cast<Handle*>(h);
  std::uint32_t t = hd->tensors[static_cast<std::size_t>(i)].tensor;
  if (versioned) {
    auto r = hd->ckpt.to_dlpack(t);
    if (!r) {
      std::snprintf(err, static_cast<std::size_t>(errlen), "%s", r.error().to_string().c_str());
      return nullptr;
    }
    return *r;
  }
  auto r = hd->ckpt.to_dlpack_legacy(t);
  if (!r) {
    std::snprintf(err, static_cast<std::size_t>(errlen), "%s", r.error().to_string().c_str());
    return nullptr;
  }
  return *r;
}

void sck_close(void* h) {
  delete static_cast<Handle*>(h);
}

}  // extern "C"
