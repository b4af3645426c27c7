// tests/engine/cuda_host_sim.hpp — a small SIMT emulator that runs the
// engine's CUDA kernels on the host, so CI (no GPU) checks their indexing,
// barriers, warp shuffles, vector accesses and launch geometry.
//
// Include it first, then the kernel file (src/engine/kernels_device.cuh,
// which is written to compile both ways). What it provides:
// - the CUDA C++ spellings the kernels use (__global__, __shared__, dim3,
//   float4 / uint2 with CUDA's alignment, bfloat16 conversions with round to
//   nearest even, __uint_as_float, rsqrtf, atomicExch, ...);
// - threadIdx / blockIdx / blockDim / gridDim;
// - a launcher (SimLaunch) with the launch policy signature of
//   kernels_device.cuh: every block runs in turn, each CUDA thread of a block
//   on its own OS thread, so __syncthreads() and warp shuffles are real
//   rendezvous: a kernel that races on shared memory, or whose threads do not
//   all reach a barrier, misbehaves here too. Only one CUDA thread runs at a
//   time, each up to its next barrier, in thread order (or reversed): a
//   missing __syncthreads between a read and an overwrite of shared memory
//   corrupts the read deterministically, and a barrier some threads never
//   reach aborts with a message instead of hanging.
// Shared memory is one object per kernel (`static`), reused by the blocks in
// turn; dynamic shared memory is 128-byte aligned, poisoned with NaN bytes
// before each block (a read of a value the block never wrote shows up).
//
// What it does not model: memory ordering between blocks (blocks run one
// after another), warp-synchronous code without __shfl/__syncthreads, and
// partial shuffle masks (asserted full). Device math (expf, erff) may differ
// from the host's in the last bit; tests compare with tolerances that say so.
#pragma once

#ifdef __CUDACC__
#error "cuda_host_sim.hpp is the host emulation; nvcc compiles the kernels for the device"
#endif

#include <math.h>  // NOLINT: the kernels call fmaxf / expf / isnan unqualified, as in CUDA

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#define SAFECKPT_HOST_SIM 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define SAFECKPT_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::cuda_host_sim::dynamic_shared())
// (the emulator's dynamic shared memory is 128-byte aligned)
#define SAFECKPT_DYNAMIC_SHARED_ALIGNED(type, name, align) SAFECKPT_DYNAMIC_SHARED(type, name)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint2 make_uint2(unsigned a, unsigned b) {
  return uint2{a, b};
}
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return uint4{a, b, c, d};
}
inline float4 make_float4(float a, float b, float c, float d) {
  return float4{a, b, c, d};
}

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}

// bfloat16 as cuda_bf16.h stores it (the high 16 bits of a float32).
struct alignas(2) __nv_bfloat16 {
  unsigned short bits;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return __uint_as_float(static_cast<unsigned>(h.bits) << 16);
}
// Round to nearest even; NaN stays NaN (cuda_bf16.h returns 0x7fff).
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};
  return __nv_bfloat16{static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
  return h.bits;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}

inline int atomicExch(int* p, int v) {
  return std::atomic_ref<int>(*p).exchange(v);
}

// Unqualified in the kernels, as in CUDA: found from any namespace.
inline thread_local dim3 threadIdx;
inline dim3 blockIdx, blockDim, gridDim;

namespace cuda_host_sim {

// A barrier of the block's scheduler: `expected` threads must arrive;
// threads that exit leave it (as an exited GPU thread no longer holds up
// __syncthreads).
struct Barrier {
  const char* what = "";
  unsigned expected = 0;
  unsigned arrived = 0;
};

// One block. Its CUDA threads are OS threads, but only the one holding the
// token runs: it runs until it arrives at a barrier (or exits), then hands
// the token to the next runnable thread of its warp, or when none can run,
// of the next warp (thread 0 up, or down with SimLaunch::reverse). Between
// two barriers, threads therefore run one after another, whole, and a warp
// runs through its shuffles ahead of the other warps: a thread that overwrites shared memory another thread of
// the same phase still has to read (a missing __syncthreads) corrupts that
// read here every time, not once in a while. No runnable thread while some
// wait is a barrier not every thread reaches: a message, then abort.
class BlockState {
 public:
  BlockState(unsigned threads, unsigned char* smem, bool reverse)
      : threads_(threads),
        smem_(smem),
        reverse_(reverse),
        cvs_(new std::condition_variable[threads]),
        waiting_on_(threads, nullptr),
        done_(threads, false) {
    block_.what = "__syncthreads()";
    block_.expected = threads;
    for (unsigned w = 0; w * 32 < threads; ++w) {
      auto b = std::make_unique<Barrier>();
      b->what = "a warp shuffle";
      b->expected = threads - w * 32 < 32 ? threads - w * 32 : 32;
      warps_.push_back(std::move(b));
    }
    for (auto& v : slots_) v.assign(static_cast<std::size_t>(threads) * kSlotBytes, 0);
    current_ = reverse ? threads - 1 : 0;
  }
  unsigned threads() const { return threads_; }
  unsigned char* smem() const { return smem_; }
  // Per thread kSlotBytes of warp-exchange space, two buffers.
  static constexpr unsigned kSlotBytes = 32;
  unsigned char* slot(unsigned parity, unsigned t) {
    return slots_[parity].data() + static_cast<std::size_t>(t) * kSlotBytes;
  }

  void start(unsigned t) {
    std::unique_lock<std::mutex> lk(m_);
    cvs_[t].wait(lk, [&] { return current_ == t; });
  }
  void sync_block(unsigned t) { arrive(t, block_); }
  void sync_warp(unsigned t) { arrive(t, *warps_[t / 32]); }
  // bar.sync `id`, `count` threads (PTX named barriers).
  void sync_named(unsigned t, unsigned id, unsigned count) {
    Barrier* b = nullptr;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto& slot = named_[id % 16];
      if (!slot) {
        slot = std::make_unique<Barrier>();
        slot->what = "bar.sync";
        slot->expected = count;
      }
      b = slot.get();
    }
    arrive(t, *b);
  }
  void finish(unsigned t) {
    std::unique_lock<std::mutex> lk(m_);
    done_[t] = true;
    leave(block_);
    leave(*warps_[t / 32]);
    pass_token(t);
  }

 private:
  void arrive(unsigned t, Barrier& b) {
    std::unique_lock<std::mutex> lk(m_);
    if (++b.arrived >= b.expected) {
      release(b);
      return;  // the last to arrive goes on
    }
    waiting_on_[t] = &b;
    pass_token(t);
    cvs_[t].wait(lk, [&] { return current_ == t; });
  }
  void leave(Barrier& b) {
    --b.expected;
    if (b.arrived > 0 && b.arrived >= b.expected) release(b);
  }
  void release(Barrier& b) {
    b.arrived = 0;
    for (auto& w : waiting_on_)
      if (w == &b) w = nullptr;
  }
  // Called with m_ held by thread `t`, which stops running. The token stays
  // in t's warp while a thread there can run (a warp runs ahead of the
  // others, as one may on the GPU), then goes to the next warp in order.
  void pass_token(unsigned t) {
    bool any_waiting = false;
    const unsigned warps = (threads_ + 31) / 32, w0 = t / 32;
    for (unsigned i = 0; i < warps; ++i) {
      const unsigned w = reverse_ ? (w0 + warps - i) % warps : (w0 + i) % warps;
      const unsigned lo = w * 32, hi = lo + 32 < threads_ ? lo + 32 : threads_;
      for (unsigned j = 0; j < hi - lo; ++j) {
        const unsigned n = reverse_ ? hi - 1 - j : lo + j;
        if (done_[n]) continue;
        if (waiting_on_[n] != nullptr) {
          any_waiting = true;
          continue;
        }
        current_ = n;
        cvs_[n].notify_one();
        return;
      }
    }
    if (any_waiting) {
      for (unsigned n = 0; n < threads_; ++n)
        if (!done_[n] && waiting_on_[n] != nullptr) {
          std::fprintf(stderr,
                       "cuda_host_sim: block (%u, %u, %u): thread %u waits at %s that the rest of its threads never "
                       "reach (%u of %u arrived)\n",
                       blockIdx.x, blockIdx.y, blockIdx.z, n, waiting_on_[n]->what, waiting_on_[n]->arrived,
                       waiting_on_[n]->expected);
          break;
        }
      std::abort();
    }
  }

  unsigned threads_;
  unsigned char* smem_;
  bool reverse_;
  std::mutex m_;
  std::unique_ptr<std::condition_variable[]> cvs_;
  std::vector<Barrier*> waiting_on_;
  std::vector<bool> done_;
  unsigned current_ = 0;
  Barrier block_;
  std::vector<std::unique_ptr<Barrier>> warps_;
  std::unique_ptr<Barrier> named_[16];
  std::vector<unsigned char> slots_[2];  // warp exchanges, double-buffered by parity
};
inline BlockState* g_block = nullptr;
inline bool g_async_at_issue = false;  // SimLaunch::async_at_issue of the running launch

struct ThreadState {
  unsigned tid = 0;  // linear thread index in the block
  unsigned shfl_parity = 0;
};
inline thread_local ThreadState t_state;

// This thread's cp.async copies not yet landed (cp_async_16 below).
struct AsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local std::vector<AsyncCopy> t_async_open;
inline thread_local std::vector<std::vector<AsyncCopy>> t_async_groups;

inline void* dynamic_shared() {
  return g_block->smem();
}

inline unsigned lane_id() {
  return t_state.tid % 32;
}

// A warp exchange: every lane of the warp publishes `v`; then `all[i]` is
// lane i's value (a lane past the block's end: the caller's own). Two
// exchanges in a row use the two slot buffers in turn: a lane writes a
// buffer again only after the whole warp passed the exchange in between, so
// after every read of it.
template <class T>
void warp_exchange(const T& v, T (&all)[32]) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= BlockState::kSlotBytes, "a register value");
  const unsigned tid = t_state.tid, w = tid / 32, parity = t_state.shfl_parity;
  t_state.shfl_parity ^= 1;
  std::memcpy(g_block->slot(parity, tid), &v, sizeof v);
  g_block->sync_warp(tid);
  for (unsigned i = 0; i < 32; ++i) {
    const unsigned from = w * 32 + i;
    if (from < g_block->threads())
      std::memcpy(&all[i], g_block->slot(parity, from), sizeof(T));
    else
      all[i] = v;
  }
}

// One warp shuffle: lane `src`'s value.
template <class T>
T shuffle_from(T v, unsigned src) {
  T all[32];
  warp_exchange(v, all);
  return all[src % 32];
}

inline void check_full_mask(unsigned mask) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "cuda_host_sim: partial shuffle masks are not emulated\n");
    std::abort();
  }
}

// Launches recorded for the tests to check which kernel and geometry a
// dispatcher chose.
struct LaunchRecord {
  const void* kernel;
  dim3 grid, block;
  unsigned smem;
};

// The launch policy (kernels_device.cuh): runs `kernel` over the grid and
// returns 0, or cudaErrorInvalidConfiguration's value (9) for a geometry the
// H100/H200 refuses (more than 1024 threads a block, grid.y or grid.z over
// 65535, more than 227 KiB of dynamic shared memory). `reverse`: the
// threads of each block take turns from the last one down.
struct SimLaunch {
  std::vector<LaunchRecord>* log = nullptr;
  bool reverse = false;
  bool async_at_issue = false;  // cp.async copies land at their issue, else at their wait_group

  template <class... P, class... A>
  int operator()(dim3 grid, dim3 block, unsigned smem, void (*kernel)(P...), A&&... args) const {
    const unsigned threads = block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || grid.x > 0x7fffffffu || smem > 227u * 1024u)
      return 9;
    if (log) log->push_back(LaunchRecord{reinterpret_cast<const void*>(kernel), grid, block, smem});
    const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);  // the launch copies its arguments
    gridDim = grid;
    blockDim = block;
    g_async_at_issue = async_at_issue;
    std::unique_ptr<unsigned char, void (*)(unsigned char*)> smem_buf(
        static_cast<unsigned char*>(::operator new(smem + 1, std::align_val_t(128))),
        [](unsigned char* p) { ::operator delete(p, std::align_val_t(128)); });
    // One OS thread per CUDA thread of a block, kept for every block of the
    // launch: each waits for the next block (a generation count), runs the
    // kernel there and reports done.
    std::mutex m;
    std::condition_variable go, done;
    unsigned long long gen = 0;
    unsigned running = 0;
    bool stop = false;
    BlockState* cur = nullptr;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (unsigned long long seen = 0;;) {
          BlockState* st = nullptr;
          {
            std::unique_lock<std::mutex> lk(m);
            go.wait(lk, [&] { return stop || gen != seen; });
            if (gen == seen) return;
            seen = gen;
            st = cur;
          }
          t_state = ThreadState{t, 0};
          t_async_open.clear();  // copies of the block before never land in this one
          t_async_groups.clear();
          threadIdx = dim3(t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y));
          st->start(t);
          std::apply(kernel, params);
          st->finish(t);
          std::lock_guard<std::mutex> lk(m);
          if (--running == 0) done.notify_one();
        }
      });
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          std::memset(smem_buf.get(), 0xff, smem + 1);  // NaN floats, -1 integers
          BlockState st(threads, smem_buf.get(), reverse);
          std::unique_lock<std::mutex> lk(m);
          blockIdx = dim3(x, y, z);
          g_block = &st;
          cur = &st;
          running = threads;
          ++gen;
          go.notify_all();
          done.wait(lk, [&] { return running == 0; });
          g_block = nullptr;
        }
    {
      std::lock_guard<std::mutex> lk(m);
      stop = true;
    }
    go.notify_all();
    for (auto& th : pool) th.join();
    return 0;
  }
};

// ---------------------------------------------------------------- PTX models
// (src/engine/attention_tc_device.cuh; PTX ISA 8.x, "Warp-level matrix
// instructions" and "cp.async").

inline void named_barrier(unsigned id, unsigned count) {
  g_block->sync_named(t_state.tid, id, count);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the
// addresses of the 8 rows (8 b16 each) of matrix i; r[i] of lane l holds
// matrix i's elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), or with
// .trans (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4); the first in the low
// half. Addresses must be 16-byte aligned.
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* p, bool trans) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) {
    std::fprintf(stderr, "cuda_host_sim: ldmatrix row address %p is not 16-byte aligned\n", p);
    std::abort();
  }
  const void* rows[32];
  warp_exchange(p, rows);
  const unsigned l = lane_id();
  auto elem = [&](unsigned m, unsigned row, unsigned col) {
    std::uint16_t e;
    std::memcpy(&e, static_cast<const unsigned char*>(rows[m * 8 + row]) + col * 2, 2);
    return static_cast<std::uint32_t>(e);
  };
  for (unsigned m = 0; m < 4; ++m) {
    const unsigned a = l / 4, c = 2 * (l % 4);
    r[m] = trans ? elem(m, c, a) | elem(m, c + 1, a) << 16 : elem(m, a, c) | elem(m, a, c + 1) << 16;
  }
}

// Every lane's A and B registers of one mma.sync, gathered (lane order).
struct MmaFrag {
  std::uint32_t a[4], b[2];
};
inline void exchange_mma_frags(const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1, MmaFrag (&all)[32]) {
  MmaFrag mine{};
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
  mine.b[0] = b0;
  mine.b[1] = b1;
  warp_exchange(mine, all);
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += A B over the
// warp (g = lane / 4, t = lane % 4): A 16 x 16 with a[0] = (g, 2t..2t+1),
// a[1] = (g + 8, 2t..), a[2] = (g, 2t + 8..), a[3] = (g + 8, 2t + 8..); B
// 16 x 8 with b0 = (2t..2t+1, g), b1 = (2t + 8.., g); d[0..1] = (g, 2t..2t+1),
// d[2..3] = (g + 8, 2t..). Products exact in fp32, summed in k order (the
// tensor core's order and rounding may differ in the last bits).
inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  MmaFrag all[32];
  exchange_mma_frags(a, b0, b1, all);
  auto half = [](std::uint32_t w, unsigned hi) { return __uint_as_float((hi ? w >> 16 : w & 0xffffu) << 16); };
  auto A = [&](unsigned row, unsigned k) {
    const unsigned g = row % 8, t = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return half(all[g * 4 + t].a[reg], k % 2);
  };
  auto B = [&](unsigned k, unsigned col) {
    const unsigned t = (k % 8) / 2;
    return half(all[col * 4 + t].b[k >= 8 ? 1 : 0], k % 2);
  };
  const unsigned l = lane_id(), g = l / 4, t = l % 4;
  for (unsigned e = 0; e < 4; ++e) {
    const unsigned row = g + (e >= 2 ? 8 : 0), col = 2 * t + e % 2;
    float acc = 0.f;
    for (unsigned k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    d[e] += acc;
  }
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, warp-collective (PTX
// ISA "Matrix Fragments for mma.m16n8k8", .tf32): A 16 x 8 with a0 = (g, t),
// a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4); B 8 x 8 with b0 =
// (t, g), b1 = (t + 4, g); d as mma_m16n8k16_bf16's. The tensor core reads
// the upper 19 bits of each operand (the low 13 are ignored: modelled by
// clearing them); products exact in fp32, summed in k order.
inline void mma_m16n8k8_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  MmaFrag all[32];
  exchange_mma_frags(a, b0, b1, all);
  auto tf32 = [](std::uint32_t w) { return __uint_as_float(w & 0xffffe000u); };
  auto A = [&](unsigned row, unsigned k) {
    return tf32(all[(row % 8) * 4 + k % 4].a[(row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)]);
  };
  auto B = [&](unsigned k, unsigned col) { return tf32(all[col * 4 + k % 4].b[k >= 4 ? 1 : 0]); };
  const unsigned l = lane_id(), g = l / 4, t = l % 4;
  for (unsigned e = 0; e < 4; ++e) {
    const unsigned row = g + (e >= 2 ? 8 : 0), col = 2 * t + e % 2;
    float acc = 0.f;
    for (unsigned k = 0; k < 8; ++k) acc += A(row, k) * B(k, col);
    d[e] += acc;
  }
}

// cp.async.cg.shared.global 16 bytes (zero-filled when !valid), commit_group
// and wait_group N. The PTX lets a copy land any time between its issue and
// the wait_group that leaves fewer groups in flight; the emulator takes one
// extreme or the other (SimLaunch::async_at_issue). Landing at the wait, a
// read of the destination before the wait sees the old bytes (the block's
// poison, or the tile before); landing at the issue, a copy issued into a
// buffer other threads still read (a missing barrier before the reuse)
// overwrites it under them.
inline void cp_async_16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 || (valid && reinterpret_cast<std::uintptr_t>(src) % 16 != 0)) {
    std::fprintf(stderr, "cuda_host_sim: cp.async of 16 bytes from %p to %p is not 16-byte aligned\n", src, dst);
    std::abort();
  }
  if (g_async_at_issue) {
    if (valid)
      std::memcpy(dst, src, 16);
    else
      std::memset(dst, 0, 16);
    return;
  }
  t_async_open.push_back(AsyncCopy{dst, src, valid});
}
inline void cp_async_commit() {
  t_async_groups.push_back(std::move(t_async_open));
  t_async_open.clear();
}
inline void cp_async_wait(int pending) {
  while (t_async_groups.size() > static_cast<std::size_t>(pending)) {
    for (const AsyncCopy& c : t_async_groups.front()) {
      if (c.valid)
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
    }
    t_async_groups.erase(t_async_groups.begin());
  }
}

}  // namespace cuda_host_sim

inline void __syncthreads() {
  cuda_host_sim::g_block->sync_block(cuda_host_sim::t_state.tid);
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  cuda_host_sim::check_full_mask(mask);
  return cuda_host_sim::shuffle_from(v, cuda_host_sim::lane_id() ^ static_cast<unsigned>(lane_mask));
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane) {
  cuda_host_sim::check_full_mask(mask);
  return cuda_host_sim::shuffle_from(v, static_cast<unsigned>(src_lane));
}
