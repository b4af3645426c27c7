// src/engine/module_cache.cpp — keys and blobs of the engine's cached NVRTC
// modules (module_cache.hpp says what each field holds and why).
#include "engine/module_cache.hpp"

#include <span>

#include "safeckpt/hash.hpp"
#include "safeckpt/version.hpp"

namespace safeckpt::engine::detail {

std::int32_t nvrtc_key_version(int cudart_version) {
  return cudart_version / 1000 * 1000;
}

std::vector<std::string> nvrtc_options(int sm) {
  // --split-compile=0: NVRTC (12.1+) optimizes and assembles the module's
  // kernels on every core instead of one. The PTX is the same and ptxas
  // compiles each kernel on its own, so the generated code is the same
  // kernels (sections compared byte for byte here: the .text of 38 of 39
  // kernels of three programs identical, one rescheduled). The cold module
  // of pt2-2.11-extra's bert.train (15 kernels) took 0.85 s without it and
  // 0.36 s with it on the 16-core H100 host (bench/RESULTS.md 2026-12-05 "NVRTC").
  return {"--gpu-architecture=sm_" + std::to_string(sm), "--std=c++17", "-default-device", "--split-compile=0"};
}

std::string engine_version() {
  return std::string("safeckpt ") + SAFECKPT_VERSION_STRING + " codegen " + std::to_string(kCodegenRevision);
}

namespace {

// The device and engine fields every key of the engine carries.
enginecache::CacheKey device_key(std::string_view hashed, const DeviceFacts& device) {
  enginecache::CacheKey k;
  k.program_hash = sha256_hex(std::span(reinterpret_cast<const std::uint8_t*>(hashed.data()), hashed.size()));
  k.device_name = device.name;
  k.sm = device.sm;
  k.driver_version = device.driver_version;
  k.runtime_version = device.runtime_version;
  k.engine_version = engine_version();
  return k;
}

}  // namespace

enginecache::CacheKey module_cache_key(std::string_view source, const DeviceFacts& device) {
  enginecache::CacheKey k = device_key(source, device);
  k.nvrtc_version = device.nvrtc_version;
  for (const auto& o : nvrtc_options(static_cast<int>(device.sm))) k.options += (k.options.empty() ? "" : " ") + o;
  return k;
}

enginecache::CacheKey choice_cache_key(std::string_view choice, const DeviceFacts& device) {
  enginecache::CacheKey k = device_key("choice\n" + std::string(choice), device);
  k.options = "choice";
  return k;
}

enginecache::CacheEntry module_cache_entry(const enginecache::CacheKey& key, std::vector<std::uint8_t> cubin) {
  enginecache::CacheEntry e;
  e.key = key;
  e.blobs.emplace(kCubinBlob, std::move(cubin));
  return e;
}

const std::vector<std::uint8_t>* module_cubin(const enginecache::CacheEntry& entry) {
  auto it = entry.blobs.find(kCubinBlob);
  if (it == entry.blobs.end() || it->second.empty()) return nullptr;
  return &it->second;
}

}  // namespace safeckpt::engine::detail
