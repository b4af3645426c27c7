// The engine's use of the persistent compile cache (safeckpt/compile_cache.hpp)
// for its NVRTC modules: the key of a generated module, the entry's blob
// names, the compile flags. Host only, no CUDA header, so the key builder is
// a pure function the host tests call (tests/engine/test_engine_cache.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/compile_cache.hpp"

namespace safeckpt::engine::detail {

// Revision of the code generator, part of CacheKey::engine_version. Bump it
// when what a cached cubin means changes without the generated text changing:
// the host side of the kernel ABI (FusedParams in internal.hpp, launch_fused's
// block shape), how module_for() uses the module, or the blob layout below.
// Edits to fused.cpp's templates change the generated source and so the
// program_hash by themselves; bumping then too costs nothing but one recompile.
inline constexpr int kCodegenRevision = 1;

// The blob of a module entry: the cubin NVRTC produced (nvrtcGetCUBIN), as
// handed to cudaLibraryLoadData. One entry per module (= per distinct source).
inline constexpr const char* kCubinBlob = "cubin";

// What the device and the toolchain contribute to a module's key
// (Engine::create reads them once).
struct DeviceFacts {
  std::string name;                  // cudaDeviceProp::name
  std::uint32_t sm = 0;              // major * 10 + minor
  std::int32_t driver_version = 0;   // cudaDriverGetVersion
  std::int32_t runtime_version = 0;  // cudaRuntimeGetVersion (static cudart: the toolkit we were built with)
  std::int32_t nvrtc_version = 0;    // nvrtc_key_version(): the NVRTC we would load, see there
};

// The NVRTC version put in the key: the major of the soname lazy_libs.cpp
// loads (libnvrtc.so.<CUDART_VERSION / 1000>) as major * 1000, i.e. not
// nvrtcVersion(). Calling nvrtcVersion would dlopen the 100 MB NVRTC on every
// cache hit, which is what the cache exists to avoid (PyTorch's inductor
// cache likewise keys on torch's CUDA version, not on a loaded compiler).
// A cubin is finished machine code for one sm: which NVRTC minor made it
// changes code quality, not validity; the driver version is in the key
// (a driver update recompiles), and a cubin the driver refuses to load is
// treated as a miss (module_for recompiles and overwrites it).
std::int32_t nvrtc_key_version(int cudart_version);

// The NVRTC flags of a generated module for sm_<sm>; the key's `options` is
// them joined by spaces.
std::vector<std::string> nvrtc_options(int sm);

// "safeckpt <project version> codegen <kCodegenRevision>".
std::string engine_version();

// The cache key of the module compiled from `source` on `device`:
//   program_hash   SHA-256 hex of `source`. The source is generated only from
//                  the validated plan (op codes, dtypes, numbers: fused.cpp),
//                  and it is the whole input NVRTC compiles (no headers, no
//                  include paths), so addressing by content is exact: equal
//                  text = equal module;
//   device_name, sm, driver/runtime/nvrtc versions  from `device`;
//   engine_version engine_version();
//   shapes         empty: sizes and strides are kernel parameters, one module
//                  serves every shape;
//   options        nvrtc_options(device.sm).
enginecache::CacheKey module_cache_key(std::string_view source, const DeviceFacts& device);

// Algorithm choices (a cuBLASLt algorithm, a cuDNN algorithm + math type +
// workspace) are cached too: `choice` is everything that decided one — the
// GEMM or convolution's dtypes, sizes, layouts, epilogue, math policy and the
// library's version — and program_hash = SHA-256 of "choice\n" + choice,
// options "choice", the device fields as for modules, shapes empty (they are
// in `choice`). The blob holds the library's own bytes for it; the engine
// re-checks them with the library before use (cublasLtMatmulAlgoCheck, the
// workspace query), so a stale entry is a miss, never a wrong kernel.
inline constexpr const char* kChoiceBlob = "choice";
enginecache::CacheKey choice_cache_key(std::string_view choice, const DeviceFacts& device);

// An entry holding `cubin` under `key`, and the cubin of a loaded entry
// (nullptr when the blob is missing or empty: a miss for the engine).
enginecache::CacheEntry module_cache_entry(const enginecache::CacheKey& key, std::vector<std::uint8_t> cubin);
const std::vector<std::uint8_t>* module_cubin(const enginecache::CacheEntry& entry);

}  // namespace safeckpt::engine::detail
