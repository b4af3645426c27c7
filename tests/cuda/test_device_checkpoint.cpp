// Device loading proof (issue 5): every corpus checkpoint loaded to the GPU
// gives, storage by storage, the same bytes as the host load; DLPack views
// point into the arena. Skips where there is no CUDA device.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/safetensors.hpp"

namespace fs = std::filesystem;

using safeckpt::cuda_test::data_dir;
using safeckpt::cuda_test::have_device;

TEST_CASE("device checkpoint: corpus storages on the GPU equal the host load") {
  if (!have_device()) return;
  int files = 0;
  const fs::path data = data_dir();
  for (const char* which : {"torch-2.11", "torch-1.13"}) {
    for (const auto& e : fs::directory_iterator(data / "corpus" / which)) {
      if (e.path().extension() != ".pt") continue;
      auto host = safeckpt::load(e.path());
      if (!host) continue;  // refused files are the host tests' business
      auto dev = safeckpt::cuda::load_to_device(e.path());
      REQUIRE_MESSAGE(dev.has_value(), e.path().string() << ": " << (dev ? "" : dev.error().to_string()));
      ++files;
      const auto& ss = host->storages();
      REQUIRE(dev->arena().storage_count() == ss.size());
      for (std::size_t i = 0; i < ss.size(); ++i) {
        std::vector<std::uint8_t> back(ss[i].nbytes);
        auto st = dev->arena().copy_to_host(i, back);
        REQUIRE(st.has_value());
        CHECK_MESSAGE(std::equal(back.begin(), back.end(), ss[i].bytes.begin()),
                      e.path().filename().string() << " storage " << i << " differs on the device");
      }
      for (const auto& t : dev->tensors()) {
        if (t.nbytes == 0) continue;
        const auto& info = dev->checkpoint().tensors()[t.tensor];
        auto* expect = static_cast<std::uint8_t*>(dev->storage_data(info.storage)) +
                       static_cast<std::uint64_t>(info.storage_offset) * safeckpt::dtype_size(info.dtype);
        CHECK(t.data == expect);
        auto dl = dev->to_dlpack(t.tensor);
        if (!dl) continue;  // dtypes without a DLPack code (quantized) are reported, not exported
        CHECK((*dl)->dl_tensor.data == t.data);
        CHECK(((*dl)->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
        (*dl)->deleter(*dl);
      }
    }
  }
  CHECK(files >= 30);
}

TEST_CASE("device checkpoint: safetensors files land on the GPU byte for byte") {
  if (!have_device()) return;
  const fs::path data = data_dir();
  int files = 0;
  for (const auto& e : fs::directory_iterator(data / "safetensors-ref")) {
    if (e.path().extension() != ".safetensors") continue;
    auto host = safeckpt::load_safetensors(e.path());
    if (!host) continue;
    auto dev = safeckpt::cuda::load_to_device(e.path());
    REQUIRE_MESSAGE(dev.has_value(), e.path().string() << ": " << (dev ? "" : dev.error().to_string()));
    ++files;
    for (std::size_t i = 0; i < host->storages().size(); ++i) {
      const auto& s = host->storages()[i];
      std::vector<std::uint8_t> back(s.nbytes);
      REQUIRE(dev->arena().copy_to_host(i, back).has_value());
      CHECK(std::equal(back.begin(), back.end(), s.bytes.begin()));
    }
  }
  CHECK(files >= 3);
}

TEST_CASE("device checkpoint: map_location and a caller's engine must agree") {
  if (!have_device()) return;
  const fs::path data = data_dir();
  const fs::path file = data / "corpus" / "torch-2.11" / "mlp_state_dict.pt";
  auto engine = safeckpt::cuda::TransferEngine::create({});  // device 0
  REQUIRE(engine.has_value());
  safeckpt::cuda::DeviceLoadOptions o;
  o.map_location = "cuda:1";  // another device than the engine's: refused before any work
  auto bad = safeckpt::cuda::load_to_device(file, o, &*engine);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == safeckpt::ErrorCode::kInvalidArgument);
  CHECK(bad.error().message().find("engine was created for device 0") != std::string::npos);
  // "cuda" is the current device (0 here), as in torch.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  o.map_location = "cuda";
  auto ok = safeckpt::cuda::load_to_device(file, o, &*engine);
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  CHECK(ok->arena().device() == 0);
}

TEST_CASE("device checkpoint: a pending load hands out addresses first, then every storage as it lands") {
  if (!have_device()) return;
  int files = 0;
  const fs::path data = data_dir();
  for (const auto& e : fs::directory_iterator(data / "corpus" / "torch-2.11")) {
    if (e.path().extension() != ".pt") continue;
    auto host = safeckpt::load(e.path());
    if (!host) continue;
    auto pending = safeckpt::cuda::PendingDeviceCheckpoint::start(e.path());
    REQUIRE_MESSAGE(pending.has_value(), e.path().string() << ": " << (pending ? "" : pending.error().to_string()));
    ++files;
    const auto& p = **pending;
    const auto& ss = host->storages();
    REQUIRE(p.storage_count() == ss.size());
    // Addresses now (before waiting), and each storage's own bytes after its wait.
    for (std::uint32_t i = 0; i < ss.size(); ++i) {
      void* at = p.checkpoint().storage_data(i);
      if (ss[i].nbytes == 0) {
        CHECK(at == nullptr);
      } else {
        CHECK(p.storage_at(at) == i);
        CHECK(p.storage_at(static_cast<std::uint8_t*>(at) + ss[i].nbytes - 1) == i);
      }
      auto w = p.wait(i);
      REQUIRE_MESSAGE(w.has_value(), (w ? "" : w.error().to_string()));
      CHECK(p.ready(i));
      std::vector<std::uint8_t> back(ss[i].nbytes);
      REQUIRE(p.checkpoint().arena().copy_to_host(i, back).has_value());
      CHECK_MESSAGE(std::equal(back.begin(), back.end(), ss[i].bytes.begin()),
                    e.path().filename().string() << " storage " << i << " differs on the device");
    }
    auto all = p.wait_all();
    REQUIRE_MESSAGE(all.has_value(), (all ? "" : all.error().to_string()));
    CHECK(p.stats().bytes == [&] {
      std::uint64_t n = 0;
      for (const auto& s : ss) n += s.nbytes;
      return n;
    }());
    CHECK(p.storage_at(nullptr) == std::nullopt);
    CHECK_FALSE(p.ready(static_cast<std::uint32_t>(ss.size())));
    CHECK(p.wait(static_cast<std::uint32_t>(ss.size())).error().code() == safeckpt::ErrorCode::kInvalidArgument);
  }
  CHECK(files >= 10);
}

TEST_CASE("device checkpoint: a pending load whose record fails its CRC on the device fails every wait") {
  if (!have_device()) return;
  // A stored torch.save record with one byte flipped: the host parse (CRC
  // left to the reader threads) accepts it; the transfer must not.
  const fs::path src = data_dir() / "corpus" / "torch-2.11" / "conv_bn_state_dict.pt";
  auto host = safeckpt::load(src);
  REQUIRE(host.has_value());
  std::uint32_t victim = 0;
  for (std::uint32_t i = 0; i < host->storages().size(); ++i)
    if (host->storages()[i].nbytes > host->storages()[victim].nbytes) victim = i;
  const auto& vs = host->storages()[victim];
  REQUIRE(vs.file_offset != safeckpt::Location::kNoOffset);
  std::ifstream in(src, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes[vs.file_offset + vs.nbytes / 2] ^= 0x01;
  const fs::path bad = fs::temp_directory_path() / ("safeckpt_pending_crc_" + std::to_string(::getpid()) + ".pt");
  {
    std::ofstream out(bad, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto pending = safeckpt::cuda::PendingDeviceCheckpoint::start(bad);
  REQUIRE_MESSAGE(pending.has_value(), (pending ? "" : pending.error().to_string()));
  auto all = (*pending)->wait_all();
  REQUIRE_FALSE(all.has_value());
  CHECK(all.error().code() == safeckpt::ErrorCode::kMalformed);
  CHECK(all.error().to_string().find("CRC-32 mismatch") != std::string::npos);
  CHECK_FALSE((*pending)->ready(victim));
  CHECK_FALSE((*pending)->wait(victim).has_value());
  CHECK_FALSE((*pending)->wait(0).has_value());  // every wait once failed
  pending->reset();
  fs::remove(bad);
}
