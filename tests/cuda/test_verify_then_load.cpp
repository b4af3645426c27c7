// Verify-then-load on the GPU path (issue 15): DeviceLoadOptions::load.verify_bytes
// (sign::make_load_verifier) hashes the mapping load_to_device then parses
// and uploads. A file renamed over the path after the verifier has run, and
// before the upload, must not reach the device: the device holds the signed
// bytes. A load of the path once it holds other bytes fails with kIntegrity
// before anything is uploaded. Skips where there is no CUDA device.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/sign.hpp"

namespace fs = std::filesystem;
namespace sc = safeckpt::cuda;
namespace sg = safeckpt::sign;

namespace {

using safeckpt::cuda_test::data_dir;
using safeckpt::cuda_test::have_device;

std::vector<std::vector<std::uint8_t>> device_storages(const sc::DeviceCheckpoint& d) {
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t i = 0; i < d.arena().storage_count(); ++i) {
    out.emplace_back(d.checkpoint().storages()[i].nbytes);
    auto st = d.arena().copy_to_host(i, out.back());
    REQUIRE(st.has_value());
  }
  return out;
}

std::vector<std::vector<std::uint8_t>> host_storages(const safeckpt::Checkpoint& c) {
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& s : c.storages()) out.emplace_back(s.bytes.begin(), s.bytes.end());
  return out;
}

}  // namespace

TEST_CASE("cuda: verify-then-load puts the signed bytes on the GPU; a file swapped after verifying never gets there") {
  if (!have_device()) return;
  const fs::path data = data_dir();
  const fs::path keys = data / "oms" / "model-transparency" / "scripts" / "tests" / "keys" / "certificate";
  safeckpt::cuda_test::ScratchDir scratch("safeckpt_verify_gpu", fs::current_path());
  const fs::path& dir = scratch.path;
  auto signer = sg::signer_from_files(keys / "signing-key.pem", {}, {});
  REQUIRE_MESSAGE(signer.has_value(), (signer ? "" : signer.error().to_string()));
  auto trust = sg::trust_from_public_key_file(keys / "signing-key-pub.pem");
  REQUIRE_MESSAGE(trust.has_value(), (trust ? "" : trust.error().to_string()));

  // A torch.save zip and a safetensors file (the two formats with and
  // without per-record checksums), each swapped for another real file.
  struct Case {
    const char* signed_file;
    const char* other_file;
  };
  for (const Case c : {Case{"corpus/torch-2.11/mlp_state_dict.pt", "corpus/torch-2.11/conv_bn_state_dict.pt"},
                       Case{"safetensors-ref/basic.safetensors", "safetensors-ref/names.safetensors"}}) {
    for (sg::Method m : {sg::Method::kFiles, sg::Method::kShards}) {
      CAPTURE(c.signed_file);
      CAPTURE(static_cast<int>(m));
      const fs::path model = dir / fs::path(c.signed_file).filename();
      const fs::path swap = dir / "swap.tmp";
      if (!fs::exists(data / c.other_file)) {
        MESSAGE("SKIP: " << c.other_file << " missing");
        continue;
      }
      fs::copy_file(data / c.signed_file, model, fs::copy_options::overwrite_existing);
      sg::SignOptions so;
      so.hash.method = m;
      so.hash.shard_size = 4096;
      auto bundle = sg::sign_model(model, dir / "model.sig", *signer, so);
      REQUIRE_MESSAGE(bundle.has_value(), (bundle ? "" : bundle.error().to_string()));
      auto verifier = sg::make_load_verifier(*bundle, *trust);
      REQUIRE_MESSAGE(verifier.has_value(), (verifier ? "" : verifier.error().to_string()));
      auto expect = safeckpt::open(data / c.signed_file);
      REQUIRE_MESSAGE(expect.has_value(), (expect ? "" : expect.error().to_string()));

      // The verifier runs, then the path is swapped, then the upload: the
      // device must hold the signed bytes.
      int calls = 0;
      sc::DeviceLoadOptions o;
      o.load.verify_bytes = [&](safeckpt::Bytes b, const fs::path& p) -> safeckpt::Status {
        ++calls;
        auto st = (*verifier)(b, p);
        fs::copy_file(data / c.other_file, swap, fs::copy_options::overwrite_existing);
        fs::rename(swap, model);
        return st;
      };
      auto dev = sc::load_to_device(model, o);
      REQUIRE_MESSAGE(dev.has_value(), (dev ? "" : dev.error().to_string()));
      CHECK(calls == 1);
      CHECK(device_storages(*dev) == host_storages(*expect));

      // The path now holds the other file: verify-then-load refuses it
      // before any upload, whatever engine is used.
      sc::DeviceLoadOptions plain;
      plain.load.verify_bytes = *verifier;
      auto swapped = sc::load_to_device(model, plain);
      REQUIRE(!swapped.has_value());
      CHECK(swapped.error().code() == safeckpt::ErrorCode::kIntegrity);
      auto engine = sc::TransferEngine::create({});
      REQUIRE_MESSAGE(engine.has_value(), (engine ? "" : engine.error().to_string()));
      auto swapped2 = sc::load_to_device(model, plain, &*engine);
      REQUIRE(!swapped2.has_value());
      CHECK(swapped2.error().code() == safeckpt::ErrorCode::kIntegrity);
      // Control: without the verifier the swapped file would have loaded.
      auto unverified = sc::load_to_device(model);
      REQUIRE_MESSAGE(unverified.has_value(), (unverified ? "" : unverified.error().to_string()));
      CHECK(device_storages(*unverified) != host_storages(*expect));
    }
  }
}
