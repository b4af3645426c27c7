// DCP plans on the GPU (issue 17, safeckpt::cuda::load_dcp_to_device): for
// every PyTorch 2.11 directory in tests/data/dcp-2.11 and plans of 1 and 2
// simulated ranks (Shard(0) boxes, DcpPlan::uniform -> dtensor_box), the
// device bytes copied back equal the host load_dcp of the same plan. A
// directory written by save_dcp with world size 3 and loaded with each
// rank's own plan takes the direct path (file ranges through the engine) for
// every non-empty box. Skips where there is no CUDA device.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "safeckpt/device_checkpoint.hpp"

namespace fs = std::filesystem;
using namespace safeckpt;

namespace {

using cuda_test::data_dir;
using cuda_test::have_device;
using cuda_test::ScratchDir;

// Device bytes of every box equal the host load of the same plan.
void check_plan(const DcpCheckpoint& ckpt, const DcpPlan& plan, cuda::TransferEngine& engine, bool expect_direct) {
  auto host = load_dcp(ckpt, plan);
  REQUIRE_MESSAGE(host.has_value(), (host ? "" : host.error().to_string()));
  cuda::DeviceLoadOptions o;
  o.map_location = "cuda:0";
  auto dev = cuda::load_dcp_to_device(ckpt, plan, o, &engine);
  REQUIRE_MESSAGE(dev.has_value(), (dev ? "" : dev.error().to_string()));
  REQUIRE(dev->tensors().size() == host->size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < host->size(); ++i) {
    const DcpLoadedTensor& h = (*host)[i];
    const cuda::DcpDeviceTensor& d = dev->tensors()[i];
    CAPTURE(h.fqn);
    CHECK(d.fqn == h.fqn);
    CHECK(d.box.offsets == h.box.offsets);
    CHECK(d.box.sizes == h.box.sizes);
    REQUIRE(d.nbytes == h.data.size());
    total += d.nbytes;
    if (d.nbytes == 0) {
      CHECK(d.data == nullptr);
      continue;
    }
    CHECK(d.data != nullptr);
    if (expect_direct) CHECK(d.direct);
    std::vector<std::uint8_t> back(d.nbytes);
    auto st = dev->copy_to_host(i, back);
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    const bool same = back == h.data;
    CHECK(same);
    auto dl = dev->to_dlpack(i);
    if (dl) {
      CHECK((*dl)->dl_tensor.data == d.data);
      (*dl)->deleter(*dl);
    }
  }
  CHECK(dev->direct_bytes() + dev->host_bytes() == total);
}

}  // namespace

TEST_CASE("dcp device: PyTorch 2.11 directories, plans of 1 and 2 ranks, equal the host load_dcp") {
  if (!have_device()) return;
  cuda::TransferOptions to;
  to.device = 0;
  auto engine = cuda::TransferEngine::create(to);
  REQUIRE_MESSAGE(engine.has_value(), (engine ? "" : engine.error().to_string()));
  int dirs = 0;
  for (const auto& e : fs::directory_iterator(data_dir() / "dcp-2.11")) {
    if (!fs::exists(e.path() / "dcp" / ".metadata")) continue;
    CAPTURE(e.path().filename().string());
    auto ckpt = DcpCheckpoint::open(e.path() / "dcp");
    REQUIRE_MESSAGE(ckpt.has_value(), (ckpt ? "" : ckpt.error().to_string()));
    ++dirs;
    // The whole model of the FSDP2 directory (every tensor Shard(0) or a 0-dim
    // replicated one) is tiled by directly readable chunks: placed on the device.
    check_plan(*ckpt, DcpPlan::full(*ckpt), *engine, e.path().filename() == "fsdp2-adamw-ws2");
    for (std::int64_t rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      check_plan(*ckpt, DcpPlan::uniform(*ckpt, DcpPlacement{0}, rank, 2), *engine, false);
    }
  }
  CHECK(dirs == 6);
}

TEST_CASE("dcp device: each rank's own plan of a save_dcp world-size-3 directory goes straight from the files") {
  if (!have_device()) return;
  cuda::TransferOptions to;
  to.device = 0;
  auto engine = cuda::TransferEngine::create(to);
  REQUIRE_MESSAGE(engine.has_value(), (engine ? "" : engine.error().to_string()));
  auto src = load(data_dir() / "corpus" / "torch-2.11" / "training_checkpoint.pt");
  REQUIRE_MESSAGE(src.has_value(), (src ? "" : src.error().to_string()));
  ScratchDir tmp("safeckpt-dcp-device");
  DcpWriteOptions w;
  w.fsync = false;
  w.world_size = 3;
  auto wrote = save_dcp(*src, tmp.path / "ws3", w);
  REQUIRE_MESSAGE(wrote.has_value(), (wrote ? "" : wrote.error().to_string()));
  DcpOptions o;
  o.verify_storage_crc = false;  // the engine checks the direct records' CRC
  auto ckpt = DcpCheckpoint::open(tmp.path / "ws3", o);
  REQUIRE_MESSAGE(ckpt.has_value(), (ckpt ? "" : ckpt.error().to_string()));
  for (std::int64_t rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    check_plan(*ckpt, DcpPlan::uniform(*ckpt, DcpPlacement{0}, rank, 3), *engine, true);
  }
  // The whole model (world size 1 plan): every box is tiled by its 3 ranks'
  // chunks, each read straight from its file and placed on the device.
  check_plan(*ckpt, DcpPlan::full(*ckpt), *engine, true);
}
