// Tests of the CUDA layer (safeckpt/cuda.hpp): transfer engine round trips in
// every I/O mode, byte swaps, CRC checks, host_bytes, failure cleanup, DLPack
// export. Compiled into safeckpt_tests only when safeckpt_cuda is built
// (SAFECKPT_HAVE_CUDA); ctest label `cuda`. Tests that need a GPU print
// "SKIP: no CUDA device" and return when cudaGetDeviceCount finds none.
#include <doctest/doctest.h>

#ifndef SAFECKPT_HAVE_CUDA

TEST_CASE("cuda: not built") {
  MESSAGE("SKIP: safeckpt built without CUDA (SAFECKPT_CUDA=OFF or no toolkit)");
}

#else

#include <cuda_runtime_api.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "safeckpt/cuda.hpp"
#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/open.hpp"

namespace sc = safeckpt::cuda;
using safeckpt::DType;
using safeckpt::ErrorCode;

namespace {

bool have_device() {
  if (sc::device_count() > 0) return true;
  MESSAGE("SKIP: no CUDA device");
  return false;
}

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<std::uint8_t>(rng());
  return v;
}

// A temp file removed on destruction. Placed in TMPDIR (or /tmp): where that
// is tmpfs, O_DIRECT falls back to pread and the test says so.
struct TempFile {
  std::filesystem::path path;
  std::vector<std::uint8_t> bytes;
  TempFile(std::size_t n, std::uint64_t seed) : bytes(random_bytes(n, seed)) {
    path = std::filesystem::temp_directory_path() /
           ("safeckpt_test_cuda_" + std::to_string(::getpid()) + "_" + std::to_string(seed) + ".bin");
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

std::uint32_t zlib_crc(const std::uint8_t* p, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32(0, p, static_cast<uInt>(n)));
}

std::vector<std::uint8_t> swapped(const std::uint8_t* p, std::size_t n, std::uint32_t unit) {
  std::vector<std::uint8_t> v(p, p + n);
  for (std::size_t i = 0; i + unit <= n; i += unit)
    std::reverse(v.begin() + static_cast<std::ptrdiff_t>(i), v.begin() + static_cast<std::ptrdiff_t>(i + unit));
  return v;
}

std::vector<std::uint8_t> copy_back(const sc::DeviceArena& a, std::size_t i) {
  std::vector<std::uint8_t> out(a.storage_nbytes(i));
  auto st = a.copy_to_host(i, out);
  REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
  return out;
}

// Small chunks and ring so that a few MiB exercise many chunks, slot reuse
// and several streams.
sc::TransferOptions small_options(sc::IoMode mode) {
  sc::TransferOptions o;
  o.io_mode = mode;
  o.chunk_bytes = 256 << 10;
  o.ring_bytes = 2 << 20;
  o.reader_threads = 4;
  o.streams = 3;
  return o;
}

constexpr sc::IoMode kModes[] = {sc::IoMode::kPread, sc::IoMode::kODirect, sc::IoMode::kMmapRegister,
                                 sc::IoMode::kAuto};

std::uint64_t free_device_bytes() {
  auto m = sc::device_memory(0);
  REQUIRE(m.has_value());
  return m->free_bytes;
}

}  // namespace

TEST_CASE("cuda: crc32_update matches zlib") {
  const auto data = random_bytes(1 << 20, 7);
  std::mt19937 rng(3);
  for (int t = 0; t < 2000; ++t) {
    const std::size_t off = rng() % 64;
    const std::size_t n = (t < 1000) ? rng() % 300 : rng() % ((1 << 20) - 64);
    const std::uint32_t init = (t % 3 == 0) ? static_cast<std::uint32_t>(rng()) : 0u;
    const auto want = static_cast<std::uint32_t>(::crc32(init, data.data() + off, static_cast<uInt>(n)));
    REQUIRE(sc::crc32_update(init, data.data() + off, n) == want);
  }
}

TEST_CASE("cuda: options are validated before any device work") {
  sc::TransferOptions o;
  o.chunk_bytes = 100000;  // not a multiple of 4096
  auto e = sc::TransferEngine::create(o);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code() == ErrorCode::kInvalidArgument);
  o = {};
  o.ring_bytes = o.chunk_bytes - 4096;
  CHECK(sc::TransferEngine::create(o).error().code() == ErrorCode::kInvalidArgument);
  o = {};
  o.streams = 0;
  CHECK(sc::TransferEngine::create(o).error().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("cuda: DLPack dtype codes") {
  struct Row {
    DType d;
    std::uint8_t code, bits;
  };
  const Row rows[] = {
      {DType::kFloat64, kDLFloat, 64},
      {DType::kFloat32, kDLFloat, 32},
      {DType::kFloat16, kDLFloat, 16},
      {DType::kBFloat16, kDLBfloat, 16},
      {DType::kInt64, kDLInt, 64},
      {DType::kInt8, kDLInt, 8},
      {DType::kUInt8, kDLUInt, 8},
      {DType::kUInt64, kDLUInt, 64},
      {DType::kBool, kDLBool, 8},
      {DType::kComplex64, kDLComplex, 64},
      {DType::kComplex128, kDLComplex, 128},
      {DType::kComplex32, kDLComplex, 32},
      {DType::kFloat8_e4m3fn, kDLFloat8_e4m3fn, 8},
      {DType::kFloat8_e5m2, kDLFloat8_e5m2, 8},
      {DType::kFloat8_e4m3fnuz, kDLFloat8_e4m3fnuz, 8},
      {DType::kFloat8_e5m2fnuz, kDLFloat8_e5m2fnuz, 8},
      {DType::kFloat8_e8m0fnu, kDLFloat8_e8m0fnu, 8},
  };
  for (const auto& r : rows) {
    auto t = sc::dlpack_dtype(r.d);
    REQUIRE(t.has_value());
    CHECK(t->code == r.code);
    CHECK(t->bits == r.bits);
    CHECK(t->lanes == 1);
  }
  for (DType d : {DType::kQInt8, DType::kQUInt8, DType::kQInt32, DType::kQUInt4x2, DType::kQUInt2x4,
                  DType::kFloat4_e2m1fn_x2, DType::kBits8, DType::kBits1x8}) {
    auto t = sc::dlpack_dtype(d);
    REQUIRE_FALSE(t.has_value());
    CHECK(t.error().code() == ErrorCode::kUnsupported);
  }
}

TEST_CASE("cuda: DLPack export keeps the owner alive until the deleter runs") {
  // No device needed: a fake device pointer and an owner that records its release.
  auto released = std::make_shared<int>(0);
  alignas(256) static std::uint8_t fake_storage[4096];
  std::shared_ptr<const void> owner(new int(1), [released](const int* p) {
    ++*released;
    delete p;
  });
  const std::int64_t shape[] = {3, 4};
  const std::int64_t strides[] = {1, 3};  // a transposed (column-major) view
  sc::TensorView v;
  v.storage_data = fake_storage;
  v.storage_nbytes = 100;
  v.dtype = DType::kBFloat16;
  v.shape = shape;
  v.strides = strides;
  v.storage_offset = 5;

  auto t = sc::to_dlpack_versioned(v, owner, /*read_only=*/true);
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error().to_string()));
  auto l = sc::to_dlpack_legacy(v, owner);
  REQUIRE(l.has_value());
  owner.reset();
  CHECK(*released == 0);

  DLManagedTensorVersioned* m = *t;
  CHECK(m->version.major == 1);
  CHECK(m->version.minor == DLPACK_MINOR_VERSION);
  CHECK((m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
  CHECK(m->dl_tensor.data == fake_storage + 10);
  CHECK(m->dl_tensor.byte_offset == 0);
  CHECK(m->dl_tensor.device.device_type == kDLCUDA);
  CHECK(m->dl_tensor.ndim == 2);
  CHECK(m->dl_tensor.shape[0] == 3);
  CHECK(m->dl_tensor.shape[1] == 4);
  CHECK(m->dl_tensor.strides[0] == 1);
  CHECK(m->dl_tensor.strides[1] == 3);
  CHECK(m->dl_tensor.dtype.code == kDLBfloat);
  m->deleter(m);
  CHECK(*released == 0);  // the legacy tensor still holds it
  (*l)->deleter(*l);
  CHECK(*released == 1);

  // Bounds: last element index 5 + 2*1 + 3*3 = 16, needs 34 bytes.
  v.storage_nbytes = 33;
  auto bad = sc::to_dlpack_versioned(v, std::make_shared<int>(0));
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == ErrorCode::kMalformed);
  v.storage_nbytes = 34;
  auto ok = sc::to_dlpack_versioned(v, std::make_shared<int>(0), /*read_only=*/false);
  REQUIRE(ok.has_value());
  CHECK(((*ok)->flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0);
  (*ok)->deleter(*ok);

  // Overflowing extent, negative stride, rank mismatch, missing owner.
  const std::int64_t huge[] = {INT64_MAX};
  const std::int64_t one[] = {INT64_MAX};
  v.shape = huge;
  v.strides = one;
  CHECK(sc::to_dlpack_versioned(v, std::make_shared<int>(0)).error().code() == ErrorCode::kMalformed);
  const std::int64_t neg[] = {-1};
  const std::int64_t two[] = {2};
  v.shape = two;
  v.strides = neg;
  CHECK(sc::to_dlpack_versioned(v, std::make_shared<int>(0)).error().code() == ErrorCode::kInvalidArgument);
  v.strides = strides;
  CHECK(sc::to_dlpack_versioned(v, std::make_shared<int>(0)).error().code() == ErrorCode::kInvalidArgument);
  v.strides = two;
  CHECK(sc::to_dlpack_versioned(v, nullptr).error().code() == ErrorCode::kInvalidArgument);

  // Empty tensor: data NULL, no bounds needed.
  const std::int64_t zero[] = {0};
  v.shape = zero;
  v.strides = two;
  v.storage_nbytes = 0;
  auto empty = sc::to_dlpack_legacy(v, std::make_shared<int>(0));
  REQUIRE(empty.has_value());
  CHECK((*empty)->dl_tensor.data == nullptr);
  (*empty)->deleter(*empty);

  // Quantized: unsupported.
  v.dtype = DType::kQInt8;
  CHECK(sc::to_dlpack_versioned(v, std::make_shared<int>(0)).error().code() == ErrorCode::kUnsupported);
}

TEST_CASE("cuda: round trip of file ranges in every I/O mode") {
  if (!have_device()) return;
  const std::size_t n = (13 << 20) + 4321;
  TempFile f(n, 11);
  const std::vector<sc::StorageSource> sources = {
      {0, 0, 1, 0, nullptr},                  // empty
      {1, 1, 1, 0, nullptr},                  // one byte, odd offset
      {3, 4097, 1, 0, nullptr},               // odd size, unaligned
      {4096, (5 << 20) + 13, 1, 0, nullptr},  // many chunks, aligned start
      {12345, 3 << 20, 1, 0, nullptr},        // overlaps the previous one
      {n - 77, 77, 1, 0, nullptr},            // ends at EOF (O_DIRECT tail)
      {(7 << 20) + 1, (6 << 20) - 100, 1, 0, nullptr},
  };
  for (sc::IoMode mode : kModes)
    for (bool pageable : {false, true}) {
      CAPTURE(sc::io_mode_name(mode));
      CAPTURE(pageable);
      std::vector<std::size_t> ready;
      std::mutex ready_mu;
      auto opt = small_options(mode);
      opt.pageable_staging = pageable;
      opt.on_storage_ready = [&](std::size_t i) {
        std::lock_guard<std::mutex> lock(ready_mu);
        ready.push_back(i);
      };
      sc::LoadStats stats;
      auto arena = sc::load_storages(f.path, sources, opt, &stats);
      REQUIRE_MESSAGE(arena.has_value(), (arena ? "" : arena.error().to_string()));
      MESSAGE("mode ", sc::io_mode_name(mode), " ran as ", sc::io_mode_name(stats.io_mode), ", ", stats.chunks,
              " chunks (", stats.pageable_chunks, " staged in pageable memory), peak ring ", stats.peak_ring_bytes,
              " bytes");
      if (stats.io_mode != sc::IoMode::kMmapRegister) {
        CHECK(stats.pageable_chunks == (pageable ? stats.chunks : 0));
      }
      REQUIRE(arena->storage_count() == sources.size());
      std::uint64_t total = 0;
      for (std::size_t i = 0; i < sources.size(); ++i) {
        CAPTURE(i);
        total += sources[i].nbytes;
        CHECK(arena->storage_nbytes(i) == sources[i].nbytes);
        if (sources[i].nbytes == 0) {
          CHECK(arena->storage_data(i) == nullptr);
          continue;
        }
        CHECK(reinterpret_cast<std::uintptr_t>(arena->storage_data(i)) % sc::kArenaAlignment == 0);
        const auto got = copy_back(*arena, i);
        CHECK(
            std::equal(got.begin(), got.end(), f.bytes.begin() + static_cast<std::ptrdiff_t>(sources[i].file_offset)));
      }
      CHECK(stats.bytes == total);
      CHECK(stats.peak_ring_bytes <= opt.ring_bytes);
      std::sort(ready.begin(), ready.end());
      CHECK(ready.size() == sources.size());
      for (std::size_t i = 0; i < ready.size(); ++i) CHECK(ready[i] == i);
    }
}

TEST_CASE("cuda: a new engine pins its whole ring in the background while loading") {
  if (!have_device()) return;
  TempFile f(3 << 20, 21);
  auto opt = small_options(sc::IoMode::kPread);
  opt.ring_bytes = 24 << 20;  // 91 slots of 256 KiB + 8 KiB
  const std::uint64_t slot = opt.chunk_bytes + 8192;
  const std::uint64_t full = opt.ring_bytes / slot * slot;

  // Destroyed at once: the background thread is stopped and joined.
  for (int i = 0; i < 3; ++i) REQUIRE(sc::TransferEngine::create(opt).has_value());

  auto engine = sc::TransferEngine::create(opt);
  REQUIRE(engine.has_value());
  // One chunk, loaded at once: it takes whichever slot is pinned first. A
  // lazily pinned ring would stop at the one slot this load needs.
  const std::vector<sc::StorageSource> one = {{4096, 100000, 1, zlib_crc(f.bytes.data() + 4096, 100000), nullptr}};
  sc::LoadStats stats;
  auto a = engine->load(f.path, one, &stats);
  REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.error().to_string()));
  CHECK(copy_back(*a, 0) == std::vector<std::uint8_t>(f.bytes.begin() + 4096, f.bytes.begin() + 4096 + 100000));
  // Wait (bounded, so a broken engine fails instead of hanging) for the ring.
  for (int i = 0; i < 3000 && engine->pinned_bytes() < full; ++i) usleep(10000);
  CHECK(engine->pinned_bytes() == full);
  // Slots pinned in the background carry data like any other.
  std::vector<sc::StorageSource> many;
  for (std::uint64_t off = 0; off + opt.chunk_bytes <= f.bytes.size(); off += opt.chunk_bytes / 2)
    many.push_back({off, opt.chunk_bytes, 1, zlib_crc(f.bytes.data() + off, opt.chunk_bytes), nullptr});
  auto b = engine->load(f.path, many, &stats);
  REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
  for (std::size_t i = 0; i < many.size(); ++i) {
    CAPTURE(i);
    const auto off = static_cast<std::ptrdiff_t>(many[i].file_offset);
    CHECK(copy_back(*b, i) ==
          std::vector<std::uint8_t>(f.bytes.begin() + off,
                                    f.bytes.begin() + off + static_cast<std::ptrdiff_t>(opt.chunk_bytes)));
  }
  CHECK(stats.slots_pinned == 0);  // nothing left to pin
  CHECK(stats.seconds_ring_ready > 0);
  CHECK(engine->pinned_bytes() == full);
  MESSAGE("ring of ", full >> 10, " KiB pinned ", stats.seconds_ring_ready * 1e3, " ms after engine creation");
}

TEST_CASE("cuda: byte swap of 2, 4 and 8-byte units on the device") {
  if (!have_device()) return;
  const std::size_t n = 9 << 20;
  TempFile f(n, 12);
  // Aligned and unaligned file offsets (an offset that is not a multiple of
  // the unit takes the staged path in mmap_register mode), one- and
  // many-chunk sizes, sizes that leave a sub-16-byte tail.
  const std::vector<sc::StorageSource> sources = {
      {64, 2, 2, 0, nullptr},
      {130, (1 << 20) + 6, 2, 0, nullptr},
      {1, 4 * 1001, 4, 0, nullptr},
      {4096, (3 << 20) + 4, 4, 0, nullptr},
      {8, 8, 8, 0, nullptr},
      {5, (2 << 20) + 8 * 3, 8, 0, nullptr},
      {(4 << 20) + 64, 3 << 20, 8, 0, nullptr},
      {100, 1000, 1, 0, nullptr},
  };
  for (sc::IoMode mode : kModes) {
    CAPTURE(sc::io_mode_name(mode));
    auto arena = sc::load_storages(f.path, sources, small_options(mode));
    REQUIRE_MESSAGE(arena.has_value(), (arena ? "" : arena.error().to_string()));
    for (std::size_t i = 0; i < sources.size(); ++i) {
      CAPTURE(i);
      const auto want = swapped(f.bytes.data() + sources[i].file_offset, sources[i].nbytes, sources[i].swap_unit);
      CHECK(copy_back(*arena, i) == want);
    }
  }
  // nbytes not a multiple of the unit, and a bad unit.
  const sc::StorageSource odd[] = {{0, 6, 4, 0, nullptr}};
  auto e = sc::load_storages(f.path, odd, small_options(sc::IoMode::kPread));
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code() == ErrorCode::kInvalidArgument);
  const sc::StorageSource bad_unit[] = {{0, 6, 3, 0, nullptr}};
  CHECK(sc::load_storages(f.path, bad_unit, small_options(sc::IoMode::kPread)).error().code() ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("cuda: CRC-32 checked per storage, mismatch names storage and both CRCs") {
  if (!have_device()) return;
  const std::size_t n = 6 << 20;
  TempFile f(n, 13);
  std::vector<sc::StorageSource> sources = {
      {0, 1000, 1, 0, nullptr},
      {1000, (2 << 20) + 1, 1, 0, nullptr},
      {3 << 20, (3 << 20) - 2, 2, 0, nullptr},  // CRC is of the stored (unswapped) bytes
  };
  for (auto& s : sources) s.expected_crc32 = zlib_crc(f.bytes.data() + s.file_offset, s.nbytes);
  for (sc::IoMode mode : kModes) {
    CAPTURE(sc::io_mode_name(mode));
    auto ok = sc::load_storages(f.path, sources, small_options(mode));
    REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
    auto bad = sources;
    bad[1].expected_crc32 ^= 0x10u;
    auto e = sc::load_storages(f.path, bad, small_options(mode));
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().code() == ErrorCode::kMalformed);
    const std::string msg = e.error().to_string();
    CAPTURE(msg);
    char want[64], got[64];
    std::snprintf(want, sizeof want, "expected %08x", bad[1].expected_crc32);
    std::snprintf(got, sizeof got, "computed %08x", sources[1].expected_crc32);
    CHECK(msg.find("storage 1") != std::string::npos);
    CHECK(msg.find(want) != std::string::npos);
    CHECK(msg.find(got) != std::string::npos);
    // verify_crc off: the wrong CRC is not looked at.
    auto opt = small_options(mode);
    opt.verify_crc = false;
    CHECK(sc::load_storages(f.path, bad, opt).has_value());
  }
}

TEST_CASE("cuda: load_into places ranges of several files at the caller's offsets in every I/O mode") {
  if (!have_device()) return;
  TempFile f0((5 << 20) + 999, 21), f1((3 << 20) + 17, 22), f2(6 << 20, 23);
  auto m0 = safeckpt::MappedFile::open(f0.path);
  auto m1 = safeckpt::MappedFile::open(f1.path);
  auto m2 = safeckpt::MappedFile::open(f2.path);
  REQUIRE((m0 && m1 && m2));
  const std::vector<const safeckpt::MappedFile*> files = {&*m0, &*m1, &*m2};
  const std::vector<const TempFile*> temp = {&f0, &f1, &f2};
  const std::vector<std::uint8_t> host = random_bytes(3001, 24);
  // Pieces of three files and host memory interleaved in one destination,
  // out of order, some unaligned, one empty, one swapped; the gaps between
  // them must stay as they were.
  std::vector<sc::PlacedSource> placed = {
      {{0, (2 << 20) + 3, 1, 0, nullptr}, 1, 7},
      {{4096, 3 << 20, 1, 0, nullptr}, 0, (9 << 20) + 256},
      {{1, 12345, 1, 0, nullptr}, 2, (2 << 20) + 100},
      {{0, 0, 1, 0, nullptr}, 2, 0},
      {{0, host.size(), 1, 0, host.data()}, 7, (6 << 20)},
      {{(4 << 20) + 8, (1 << 20) - 8, 4, 0, nullptr}, 2, (7 << 20)},
      {{(5 << 20) + 999 - 500, 500, 1, 0, nullptr}, 0, (12 << 20) + 256},
  };
  for (auto& p : placed)
    if (p.source.host_bytes == nullptr && p.source.nbytes > 0)
      p.source.expected_crc32 = zlib_crc(temp[p.file]->bytes.data() + p.source.file_offset, p.source.nbytes);
  const std::uint64_t bytes = 13 << 20;
  auto want = [&] {
    std::vector<std::uint8_t> w(bytes, 0xA5);
    for (const auto& p : placed) {
      const std::uint8_t* from =
          p.source.host_bytes != nullptr ? p.source.host_bytes : temp[p.file]->bytes.data() + p.source.file_offset;
      const auto v = swapped(from, p.source.nbytes, p.source.swap_unit);
      std::copy(v.begin(), v.end(), w.begin() + static_cast<std::ptrdiff_t>(p.device_offset));
    }
    return w;
  }();
  void* base = nullptr;
  REQUIRE(cudaMalloc(&base, bytes) == cudaSuccess);
  std::unique_ptr<void, decltype(&cudaFree)> owner(base, &cudaFree);
  for (sc::IoMode mode : kModes) {
    CAPTURE(sc::io_mode_name(mode));
    REQUIRE(cudaMemset(base, 0xA5, bytes) == cudaSuccess);
    auto engine = sc::TransferEngine::create(small_options(mode));
    REQUIRE(engine.has_value());
    sc::LoadStats stats;
    auto st = engine->load_into(files, placed, base, bytes, &stats);
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    MESSAGE("mode ", sc::io_mode_name(mode), " ran as ", sc::io_mode_name(stats.io_mode), ", ", stats.chunks,
            " chunks");
    CHECK(stats.arena_bytes == 0);
    std::uint64_t total = 0;
    for (const auto& p : placed) total += p.source.nbytes;
    CHECK(stats.bytes == total);
    std::vector<std::uint8_t> got(bytes);
    REQUIRE(cudaMemcpy(got.data(), base, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(got == want);
  }
  auto engine = sc::TransferEngine::create(small_options(sc::IoMode::kPread));
  REQUIRE(engine.has_value());
  const auto refused = [&](std::vector<sc::PlacedSource> ps, const char* what) {
    auto st = engine->load_into(files, ps, base, bytes);
    REQUIRE_FALSE(st.has_value());
    const std::string msg = st.error().to_string();
    CAPTURE(msg);
    CHECK(msg.find(what) != std::string::npos);
    return st.error().code();
  };
  SUBCASE("overlapping destinations") {
    auto ps = placed;
    ps[2].device_offset = ps[0].device_offset + ps[0].source.nbytes - 1;
    CHECK(refused(ps, "overlap") == ErrorCode::kInvalidArgument);
  }
  SUBCASE("a destination past the end") {
    auto ps = placed;
    ps[1].device_offset = bytes - ps[1].source.nbytes + 1;
    CHECK(refused(ps, "outside") == ErrorCode::kInvalidArgument);
  }
  SUBCASE("a file index past the files") {
    auto ps = placed;
    ps[0].file = 3;
    CHECK(refused(ps, "names file 3 of 3") == ErrorCode::kInvalidArgument);
  }
  SUBCASE("a misaligned swapped destination") {
    auto ps = placed;
    ps[5].device_offset += 2;
    CHECK(refused(ps, "swap unit") == ErrorCode::kInvalidArgument);
  }
  SUBCASE("a range past the end of its own file") {
    auto ps = placed;
    ps[0].source.file_offset = (3 << 20);  // inside f0 (5 MiB), past f1
    ps[0].source.expected_crc32 = 0;
    CHECK(refused(ps, "end past the end of the file") == ErrorCode::kMalformed);
  }
  SUBCASE("a CRC mismatch names the storage and its file") {
    auto ps = placed;
    ps[2].source.expected_crc32 ^= 1u;
    CHECK(refused(ps, "storage 2: CRC-32 mismatch") == ErrorCode::kMalformed);
    auto st = engine->load_into(files, ps, base, bytes);
    REQUIRE_FALSE(st.has_value());
    CHECK(st.error().to_string().find(f2.path.filename().string()) != std::string::npos);
  }
}

TEST_CASE("cuda: host_bytes sources, alone and mixed with file ranges") {
  if (!have_device()) return;
  TempFile f(3 << 20, 14);
  const auto inflated = random_bytes((2 << 20) + 10, 15);
  std::vector<sc::StorageSource> sources = {
      {0, inflated.size(), 1, zlib_crc(inflated.data(), inflated.size()), inflated.data()},
      {17, 1 << 20, 1, zlib_crc(f.bytes.data() + 17, 1 << 20), nullptr},
      {0, 1024, 4, zlib_crc(inflated.data() + 100, 1024), inflated.data() + 100},
      {0, 0, 1, 0, inflated.data()},
  };
  for (sc::IoMode mode : kModes) {
    CAPTURE(sc::io_mode_name(mode));
    auto arena = sc::load_storages(f.path, sources, small_options(mode));
    REQUIRE_MESSAGE(arena.has_value(), (arena ? "" : arena.error().to_string()));
    CHECK(copy_back(*arena, 0) == inflated);
    const auto got1 = copy_back(*arena, 1);
    CHECK(std::equal(got1.begin(), got1.end(), f.bytes.begin() + 17));
    CHECK(copy_back(*arena, 2) == swapped(inflated.data() + 100, 1024, 4));
  }
  // Only host bytes: no file needed.
  const std::vector<sc::StorageSource> only(sources.begin(), sources.begin() + 1);
  auto arena = sc::load_storages({}, only, small_options(sc::IoMode::kAuto));
  REQUIRE_MESSAGE(arena.has_value(), (arena ? "" : arena.error().to_string()));
  CHECK(copy_back(*arena, 0) == inflated);
  // A file range without a file.
  auto e = sc::load_storages({}, sources, small_options(sc::IoMode::kAuto));
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("cuda: a failed load frees everything") {
  if (!have_device()) return;
  const std::size_t n = 72 << 20;
  TempFile f(n, 16);
  // A big arena, so a leak would show in cudaMemGetInfo.
  std::vector<sc::StorageSource> sources;
  for (std::uint64_t off = 0; off + (8 << 20) <= n; off += 8 << 20)
    sources.push_back({off, 8 << 20, 1, zlib_crc(f.bytes.data() + off, 8 << 20), nullptr});
  auto opt = small_options(sc::IoMode::kPread);
  auto engine = sc::TransferEngine::create(opt);
  REQUIRE(engine.has_value());
  {
    auto warm = engine->load(f.path, sources);  // creates events, pins the ring, loads the kernel
    REQUIRE_MESSAGE(warm.has_value(), (warm ? "" : warm.error().to_string()));
  }
  const std::uint64_t baseline = free_device_bytes();
  const std::uint64_t slack = 8 << 20;  // against driver bookkeeping; the arena is 64 MiB

  // (a) CRC mismatch in a middle storage: detected after earlier storages landed.
  auto bad = sources;
  bad[4].expected_crc32 ^= 1u;
  for (sc::IoMode mode : kModes) {
    CAPTURE(sc::io_mode_name(mode));
    auto e = sc::load_storages(f.path, bad, small_options(mode));
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().code() == ErrorCode::kMalformed);
    CHECK(free_device_bytes() + slack >= baseline);
  }
  auto e = engine->load(f.path, bad);
  REQUIRE_FALSE(e.has_value());
  CHECK(free_device_bytes() + slack >= baseline);

  // (b) A range past the end of the file.
  auto past = sources;
  past.push_back({n - 10, 11, 1, 0, nullptr});
  e = engine->load(f.path, past);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code() == ErrorCode::kMalformed);
  CHECK(e.error().to_string().find("storage " + std::to_string(past.size() - 1)) != std::string::npos);
  CHECK(free_device_bytes() + slack >= baseline);

  // (c) The file shrinks under the loader: a short read midway (kIo).
  {
    TempFile g(n, 17);
    std::vector<sc::StorageSource> all;
    for (std::uint64_t off = 0; off + (8 << 20) <= n; off += 8 << 20) all.push_back({off, 8 << 20, 1, 0, nullptr});
    auto shrink_opt = small_options(sc::IoMode::kPread);
    bool truncated = false;
    shrink_opt.on_storage_ready = [&](std::size_t) {
      if (!truncated) {
        truncated = true;
        std::filesystem::resize_file(g.path, 1 << 20);
      }
    };
    auto r = sc::load_storages(g.path, all, shrink_opt);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::kIo);
    MESSAGE("shrunk file: ", r.error().to_string());
    CHECK(free_device_bytes() + slack >= baseline);
  }

  // (d) Missing file.
  e = engine->load(f.path.string() + ".missing", sources);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code() == ErrorCode::kIo);

  // The engine is still usable after failures.
  auto again = engine->load(f.path, sources);
  REQUIRE_MESSAGE(again.has_value(), (again ? "" : again.error().to_string()));
  CHECK(copy_back(*again, 3) == std::vector<std::uint8_t>(f.bytes.begin() + (24 << 20), f.bytes.begin() + (32 << 20)));
}

TEST_CASE("cuda: an arena larger than the device fails with kDevice while the readers run") {
  if (!have_device()) return;
  const std::size_t n = 64 << 20;
  TempFile f(n, 23);
  auto mem = sc::device_memory(0);
  REQUIRE(mem.has_value());
  // The same 64 MiB range many times over: more bytes than the device has.
  // The readers start reading before cudaMalloc of the arena fails.
  const std::uint64_t count = mem->total_bytes / n + 16;
  std::vector<sc::StorageSource> sources(count, sc::StorageSource{0, n, 1, 0, nullptr});
  auto opt = small_options(sc::IoMode::kPread);
  opt.chunk_bytes = 4 << 20;
  opt.ring_bytes = 32 << 20;
  auto engine = sc::TransferEngine::create(opt);
  REQUIRE(engine.has_value());
  const std::uint64_t baseline = free_device_bytes();
  sc::LoadStats stats;
  auto r = engine->load(f.path, sources, &stats);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::kDevice);
  CHECK(r.error().to_string().find("cudaMalloc") != std::string::npos);
  MESSAGE(r.error().to_string());
  CHECK(free_device_bytes() + (8 << 20) >= baseline);
  // Still usable.
  const std::vector<sc::StorageSource> one = {{4096, 1 << 20, 1, zlib_crc(f.bytes.data() + 4096, 1 << 20), nullptr}};
  auto ok = engine->load(f.path, one);
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  CHECK(copy_back(*ok, 0) == std::vector<std::uint8_t>(f.bytes.begin() + 4096, f.bytes.begin() + 4096 + (1 << 20)));
}

TEST_CASE("cuda: DLPack tensors keep a shared arena alive") {
  if (!have_device()) return;
  const std::size_t n = 65 << 20;
  TempFile f(n, 18);
  const sc::StorageSource sources[] = {{256, 64 << 20, 1, 0, nullptr}};
  const std::uint64_t before = free_device_bytes();
  const std::uint64_t slack = 8 << 20;
  DLManagedTensorVersioned* t = nullptr;
  DLManagedTensor* legacy = nullptr;
  {
    auto arena = sc::load_storages(f.path, sources, small_options(sc::IoMode::kPread));
    REQUIRE(arena.has_value());
    auto shared = std::make_shared<sc::DeviceArena>(std::move(*arena));
    sc::TensorView v = sc::arena_view(*shared, 0);
    const std::int64_t shape[] = {1024, 1000};
    const std::int64_t strides[] = {1024, 1};
    v.dtype = DType::kFloat16;
    v.shape = shape;
    v.strides = strides;
    v.storage_offset = 8;
    auto r = sc::to_dlpack_versioned(v, shared);
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
    t = *r;
    auto l = sc::to_dlpack_legacy(v, shared);
    REQUIRE(l.has_value());
    legacy = *l;
  }  // the arena's named owner is gone; the tensors hold it
  CHECK(free_device_bytes() + (64 << 20) <= before + slack);
  std::vector<std::uint8_t> head(64);
  REQUIRE(cudaMemcpy(head.data(), t->dl_tensor.data, head.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::equal(head.begin(), head.end(), f.bytes.begin() + 256 + 8 * 2));
  CHECK(t->dl_tensor.device.device_type == kDLCUDA);
  CHECK(t->dl_tensor.device.device_id == 0);
  t->deleter(t);
  CHECK(free_device_bytes() + (64 << 20) <= before + slack);  // legacy still holds it
  legacy->deleter(legacy);
  CHECK(free_device_bytes() + slack >= before);
}

// Issue 11 item 3: the bytes validated are the bytes uploaded. Parse a real
// checkpoint (zip, legacy, safetensors), rename a file with other tensor
// bytes over its path, then upload: the device must hold the original bytes
// in every I/O mode (pread on the loader's descriptor, its mapping
// registered, O_DIRECT through /proc/self/fd/N). The engine's path overload,
// which opens the path at upload time, is the control: it reads the
// replacement, so a reopen anywhere would make this test fail.
TEST_CASE("cuda: a file renamed over the path between parse and upload never reaches the device") {
  if (!have_device()) return;
  namespace fs = std::filesystem;
  const char* env = std::getenv("SAFECKPT_TEST_DATA_DIR");
  const fs::path data = env ? fs::path(env) : fs::path(SAFECKPT_TEST_DATA);
  // On the working directory's file system (not /tmp, often tmpfs, where
  // O_DIRECT is refused).
  safeckpt::cuda_test::ScratchDir scratch("safeckpt_swap_test", fs::current_path());
  const fs::path& dir = scratch.path;
  auto read_all = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  for (const char* which : {"corpus/torch-2.11/mlp_state_dict.pt", "corpus/torch-1.13/legacy_format.pt",
                            "safetensors-ref/basic.safetensors"}) {
    for (sc::IoMode mode : {sc::IoMode::kPread, sc::IoMode::kODirect, sc::IoMode::kMmapRegister}) {
      for (bool verify : {false, true}) {
        CAPTURE(which);
        CAPTURE(sc::io_mode_name(mode));
        CAPTURE(verify);
        const fs::path orig = dir / "orig", path = dir / "ckpt", other = dir / "other";
        fs::copy_file(data / which, orig, fs::copy_options::overwrite_existing);
        fs::copy_file(data / which, path, fs::copy_options::overwrite_existing);
        auto expect = safeckpt::open(orig);
        REQUIRE_MESSAGE(expect.has_value(), (expect ? "" : expect.error().to_string()));
        auto host = safeckpt::open(path);
        REQUIRE_MESSAGE(host.has_value(), (host ? "" : host.error().to_string()));
        // The replacement: same layout, every in-file storage byte flipped.
        std::vector<std::uint8_t> bytes = read_all(orig);
        std::vector<sc::StorageSource> in_file;
        std::vector<std::size_t> in_file_index;
        for (std::size_t i = 0; i < host->storages().size(); ++i) {
          const auto& s = host->storages()[i];
          if (s.file_offset == safeckpt::Location::kNoOffset || s.nbytes == 0) continue;
          for (std::uint64_t k = 0; k < s.nbytes; ++k) bytes[s.file_offset + k] ^= 0x5A;
          sc::StorageSource src;
          src.file_offset = s.file_offset;
          src.nbytes = s.nbytes;
          in_file.push_back(src);
          in_file_index.push_back(i);
        }
        REQUIRE(!in_file.empty());
        {
          std::ofstream f(other, std::ios::binary | std::ios::trunc);
          f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        }
        REQUIRE(std::rename(other.c_str(), path.c_str()) == 0);

        sc::TransferOptions to = small_options(mode);
        to.verify_crc = verify;
        auto engine = sc::TransferEngine::create(to);
        REQUIRE_MESSAGE(engine.has_value(), (engine ? "" : engine.error().to_string()));
        // Control: opening the path now reads the replacement.
        auto by_path = engine->load(path, in_file);
        REQUIRE_MESSAGE(by_path.has_value(), (by_path ? "" : by_path.error().to_string()));
        bool differs = false;
        for (std::size_t j = 0; j < in_file.size(); ++j) {
          const auto& s = expect->storages()[in_file_index[j]];
          differs |= copy_back(*by_path, j) != std::vector<std::uint8_t>(s.bytes.begin(), s.bytes.end());
        }
        CHECK(differs);
        // The engine on the loader's descriptor: the validated bytes.
        sc::LoadStats stats;
        auto by_fd = engine->load(host->file(), in_file, &stats);
        REQUIRE_MESSAGE(by_fd.has_value(), (by_fd ? "" : by_fd.error().to_string()));
        MESSAGE(std::string(which) << " " << sc::io_mode_name(mode) << " -> " << sc::io_mode_name(stats.io_mode));
        for (std::size_t j = 0; j < in_file.size(); ++j) {
          const auto& s = expect->storages()[in_file_index[j]];
          CHECK(copy_back(*by_fd, j) == std::vector<std::uint8_t>(s.bytes.begin(), s.bytes.end()));
        }
        // The whole checkpoint through load_to_device.
        sc::DeviceLoadOptions dopt;
        auto dev = sc::load_to_device(std::move(*host), dopt, &*engine);
        REQUIRE_MESSAGE(dev.has_value(), (dev ? "" : dev.error().to_string()));
        REQUIRE(dev->arena().storage_count() == expect->storages().size());
        for (std::size_t i = 0; i < expect->storages().size(); ++i) {
          const auto& s = expect->storages()[i];
          CHECK(copy_back(dev->arena(), i) == std::vector<std::uint8_t>(s.bytes.begin(), s.bytes.end()));
        }
      }
    }
  }
}

#endif  // SAFECKPT_HAVE_CUDA
