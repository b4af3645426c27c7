// The engine's generated pointwise kernels (src/engine/fused.cpp) run on the
// host: the CUDA C++ text fused_source emits is compiled as C++ by the
// build's own compiler, behind a small shim (__global__, blockIdx, uint4,
// float4, the bit casts), and each kernel is called once per (block, thread)
// of launch_fused's grid, in order. The generated kernels have no barriers,
// shared memory or warp operations, so one thread after another computes what
// the GPU computes — which lets CI (no GPU) check the index arithmetic, the
// fast path's vector loads and stores (FusedParams::vec) against the element
// path, broadcasts, strided tensors and bfloat16 rounding. Device math
// (erff, expf on the GPU) can differ from the host's in the last bit; every
// comparison here is between two runs of the same host-compiled code, or
// against a reference computed with the same host functions.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/internal.hpp"

using namespace safeckpt;
using namespace safeckpt::engine::detail;

namespace {

// What NVRTC provides and host C++ lacks, for the text fused_source emits.
const char* kHostShim = R"(// host shim: tests/engine/test_fused_host.cpp
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __global__
struct HostDim3 { unsigned x, y, z; };
static HostDim3 gridDim, blockDim, blockIdx, threadIdx;
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline double __longlong_as_double(unsigned long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
)";

const char* kHostLauncher = R"(
extern "C" unsigned long long host_params_size() { return sizeof(P); }
extern "C" void host_launch(void (*fn)(P), const void* params, unsigned blocks, unsigned threads) {
  P p;
  std::memcpy(&p, params, sizeof p);
  gridDim = HostDim3{blocks, 1, 1};
  blockDim = HostDim3{threads, 1, 1};
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) {
      blockIdx = HostDim3{b, 0, 0};
      threadIdx = HostDim3{t, 0, 0};
      fn(p);
    }
}
)";

// fused_source(kernels) compiled into a shared object and loaded.
class HostModule {
 public:
  explicit HostModule(const std::vector<FusedKernel>& kernels) {
    char tmpl[] = "/tmp/safeckpt-fused-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    const std::string src = dir_ + "/kernels.cpp", so = dir_ + "/kernels.so", log = dir_ + "/cc.log";
    {
      std::ofstream f(src);
      f << kHostShim << fused_source(kernels) << kHostLauncher;
    }
    // -fno-strict-aliasing: the text reads bfloat16 rows through uint4
    // pointers, as CUDA code may.
    const std::string cmd = std::string(SAFECKPT_TEST_CXX) + " -std=c++17 -O1 -fPIC -shared -fno-strict-aliasing " +
                            src + " -o " + so + " > " + log + " 2>&1";
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::ifstream f(log);
      std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      FAIL("host compile of the generated kernels failed: " << text.substr(0, 4000));
    }
    handle_ = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* err = handle_ == nullptr ? ::dlerror() : nullptr;
    REQUIRE_MESSAGE(handle_ != nullptr, (err != nullptr ? err : ""));
    launch_ = reinterpret_cast<LaunchFn>(::dlsym(handle_, "host_launch"));
    auto size = reinterpret_cast<unsigned long long (*)()>(::dlsym(handle_, "host_params_size"));
    const bool found = launch_ != nullptr && size != nullptr;
    REQUIRE(found);
    // The generated struct P and the host's FusedParams: one layout.
    REQUIRE(size() == sizeof(FusedParams));
  }
  HostModule(const HostModule&) = delete;
  HostModule& operator=(const HostModule&) = delete;
  ~HostModule() {
    if (handle_ != nullptr) ::dlclose(handle_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // One launch with launch_fused's grid.
  void launch(const std::string& name, const FusedParams& p) const {
    void* fn = ::dlsym(handle_, name.c_str());
    REQUIRE_MESSAGE(fn != nullptr, name);
    launch_(fn, &p, fused_grid_blocks(p.n), kFusedBlockThreads);
  }

 private:
  using LaunchFn = void (*)(void*, const void*, unsigned, unsigned);
  std::string dir_;
  void* handle_ = nullptr;
  LaunchFn launch_ = nullptr;
};

MicroOp op(MicroKind kind, DType d, int a = -1, int b = -1, int store = -1, double s0 = 0) {
  MicroOp o;
  o.kind = kind;
  o.dtype = d;
  o.a = a;
  o.b = b;
  o.store = store;
  o.s0 = s0;
  return o;
}

// bfloat16 as the kernels store it (round to nearest even; NaN quieted).
std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 64u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float rbf(float f) {
  return from_bf16(to_bf16(f));
}

// A host buffer of `elems` elements of `esize` bytes, 64-byte aligned, plus
// `shift` elements in front (shift 1: a pointer no vector access may use).
struct Buffer {
  Buffer(std::size_t elems, std::size_t elem_bytes, std::size_t shift)
      : bytes((elems + shift) * elem_bytes + 64), mem(new unsigned char[bytes + 64]()) {
    auto base = reinterpret_cast<std::uintptr_t>(mem.get());
    p = reinterpret_cast<unsigned char*>((base + 63) / 64 * 64) + shift * elem_bytes;
  }
  std::size_t bytes;
  std::unique_ptr<unsigned char[]> mem;
  unsigned char* p = nullptr;
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(p);
  }
};

std::uint32_t lcg(std::uint32_t& s) {
  s = s * 1664525u + 1013904223u;
  return s;
}
float uniform(std::uint32_t& s) {  // [-4, 4)
  return static_cast<float>(lcg(s) >> 8) / static_cast<float>(1u << 24) * 8.f - 4.f;
}

// Parameters of one launch over `shape` (row-major iteration), tensors with
// their strides, the vector mask as the planner's step computes it unless
// `force_scalar`.
FusedParams params(const std::vector<std::int64_t>& shape, const std::vector<const Buffer*>& bufs,
                   const std::vector<DType>& dtypes, const std::vector<std::vector<std::int64_t>>& strides,
                   bool force_scalar) {
  FusedParams p{};
  p.n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    p.shape[d] = shape[d];
    p.n *= shape[d];
  }
  std::vector<const void*> ptrs;
  for (std::size_t t = 0; t < bufs.size(); ++t) {
    p.t[t].ptr = bufs[t]->p;
    ptrs.push_back(bufs[t]->p);
    for (std::size_t d = 0; d < strides[t].size(); ++d) p.t[t].strides[d] = strides[t][d];
  }
  p.vec = force_scalar || shape.empty() ? 0u : fused_vector_mask(dtypes, ptrs, strides, shape.back());
  return p;
}

}  // namespace

TEST_CASE("engine: vector access of generated kernels (fused_vector_mask), no device") {
  const std::vector<std::int64_t> inner{16, 1};
  alignas(64) static unsigned char mem[256];
  const void* a16 = mem;     // 16-byte aligned
  const void* a8 = mem + 8;  // 8 bytes: neither a float4 nor a uint4 of eight bfloat16
  const void* a2 = mem + 2;  // one bfloat16 element off
  const DType f = DType::kFloat32, b = DType::kBFloat16, i64 = DType::kInt64, bo = DType::kBool;
  CHECK(fused_vector_mask({f, b}, {a16, a16}, {inner, inner}, 16) == 0b11u);
  CHECK(fused_vector_mask({f, b}, {a8, a8}, {inner, inner}, 16) == 0u);
  CHECK(fused_vector_mask({f, b}, {a2, a2}, {inner, inner}, 16) == 0u);
  // Integer and boolean tensors are read element by element.
  CHECK(fused_vector_mask({i64, bo, f}, {a16, a16, a16}, {inner, inner, inner}, 16) == 0b100u);
  // Innermost stride other than 1: a broadcast (0) or a transposed read.
  CHECK(fused_vector_mask({f, f, f}, {a16, a16, a16}, {{16, 0}, {1, 16}, inner}, 16) == 0b100u);
  // Every row start must be 16-byte aligned: a row stride of 12 elements is
  // 48 bytes of float32 (aligned) and 24 of bfloat16 (not); 18 float32, 72.
  CHECK(fused_vector_mask({f, b}, {a16, a16}, {{12, 1}, {12, 1}}, 8) == 0b01u);
  CHECK(fused_vector_mask({f}, {a16}, {{18, 1}}, 16) == 0u);
  // An innermost extent that is not a multiple of kFusedUnroll (8): the
  // kernel's general path, no vectors.
  CHECK(fused_vector_mask({f}, {a16}, {inner}, 18) == 0u);
  CHECK(fused_vector_mask({f, b}, {a16, a16}, {{12, 1}, {12, 1}}, 12) == 0u);
  // Rank 1 (one collapsed contiguous dimension).
  CHECK(fused_vector_mask({b}, {a16}, {{1}}, 1024) == 1u);
}

TEST_CASE("engine: generated kernels run on the host: vector and element paths agree bit for bit with a reference") {
  // k0: bfloat16 x [R, C] + bias [C] (broadcast rows), exact-erf GELU: the
  //     FFN epilogue a transformer's plan generates; a second output keeps
  //     the sum in float32.
  // k1: float32 where(mask, x, -inf) with a boolean mask: dtypes read
  //     element by element beside vector ones.
  // k2: a transposed float32 read cast into a bfloat16 row-major copy.
  const DType f = DType::kFloat32, b = DType::kBFloat16, bo = DType::kBool;
  FusedKernel k0;
  k0.name = "k0";
  k0.rank = 2;
  k0.index32 = true;
  k0.in_dtypes = {b, b};
  k0.out_dtypes = {b, f};
  k0.ops = {op(MicroKind::kLoad, b, 0), op(MicroKind::kLoad, b, 1), op(MicroKind::kAdd, b, 0, 1, 1, 1.0),
            op(MicroKind::kGeluErf, b, 2, -1, 0)};
  FusedKernel k1;
  k1.name = "k1";
  k1.rank = 2;
  k1.index32 = true;
  k1.in_dtypes = {bo, f};
  k1.out_dtypes = {f};
  MicroOp ninf = op(MicroKind::kConst, f, -1, -1, -1, -INFINITY);
  MicroOp where = op(MicroKind::kWhere, f, 0, 1, 0);
  where.c = 2;
  k1.ops = {op(MicroKind::kLoad, bo, 0), op(MicroKind::kLoad, f, 1), ninf, where};
  FusedKernel k2;
  k2.name = "k2";
  k2.rank = 2;
  k2.index32 = false;  // the 64-bit index decomposition too
  k2.in_dtypes = {f};
  k2.out_dtypes = {b};
  k2.ops = {op(MicroKind::kLoad, f, 0), op(MicroKind::kCast, b, 0, -1, 0)};
  const HostModule mod({k0, k1, k2});

  // Columns 64 and 40 (the fast path: rows of 40 bfloat16 are 80 bytes, each
  // row start 16-byte aligned), 36 (a multiple of 4, not of kFusedUnroll:
  // the general path) and 37 (general path); shift 0 (vector accesses) and
  // 1 (none).
  for (std::int64_t cols : {64, 40, 36, 37}) {
    const std::int64_t rows = 37;  // a grid of several blocks, and a ragged last trip
    const std::size_t n = static_cast<std::size_t>(rows * cols);
    CAPTURE(cols);
    std::uint32_t seed = 12345u + static_cast<std::uint32_t>(cols);
    std::vector<std::uint16_t> x(n), bias(static_cast<std::size_t>(cols));
    std::vector<float> xf(n);
    std::vector<unsigned char> mask(n);
    for (auto& v : x) v = to_bf16(uniform(seed));
    for (auto& v : bias) v = to_bf16(uniform(seed));
    for (auto& v : xf) v = uniform(seed);
    for (auto& v : mask) v = static_cast<unsigned char>(lcg(seed) >> 31);
    // References with the kernels' arithmetic (float opmath, bfloat16 rounding after each op).
    std::vector<std::uint16_t> want_gelu(n), want_copy(n);
    std::vector<float> want_sum(n), want_where(n);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<std::size_t>(r * cols + c);
        const float s = rbf(from_bf16(x[i]) + from_bf16(bias[static_cast<std::size_t>(c)]));
        want_sum[i] = s;
        want_gelu[i] = to_bf16(rbf(0.5f * s * (1.0f + erff(s * 0.70710678118654752440f))));
        want_where[i] = mask[i] ? xf[i] : -INFINITY;
      }
    // k2 reads xf as the transpose of a [cols, rows] matrix: element (r, c) at c * rows + r.
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        want_copy[static_cast<std::size_t>(r * cols + c)] = to_bf16(xf[static_cast<std::size_t>(c * rows + r)]);

    std::vector<std::vector<std::uint16_t>> got_gelu, got_copy;
    std::vector<std::vector<float>> got_sum, got_where;
    for (std::size_t shift : {0u, 1u})
      for (bool force_scalar : {false, true}) {
        CAPTURE(shift);
        CAPTURE(force_scalar);
        Buffer bx(n, 2, shift), bb(static_cast<std::size_t>(cols), 2, shift), bg(n, 2, shift), bs(n, 4, shift);
        Buffer bm(n, 1, shift), bxf(n, 4, shift), bw(n, 4, shift), bc(n, 2, shift);
        std::memcpy(bx.p, x.data(), n * 2);
        std::memcpy(bb.p, bias.data(), bias.size() * 2);
        std::memcpy(bm.p, mask.data(), n);
        std::memcpy(bxf.p, xf.data(), n * 4);
        const std::vector<std::int64_t> shape{rows, cols}, dense{cols, 1};
        const FusedParams p0 =
            params(shape, {&bx, &bb, &bg, &bs}, {b, b, b, f}, {dense, {0, 1}, dense, dense}, force_scalar);
        const FusedParams p1 = params(shape, {&bm, &bxf, &bw}, {bo, f, f}, {dense, dense, dense}, force_scalar);
        const FusedParams p2 = params(shape, {&bxf, &bc}, {f, b}, {{1, rows}, dense}, force_scalar);
        // The mask the planner's step would pass: every float tensor of the
        // aligned, multiple-of-8 layouts takes the vector path.
        if (!force_scalar && shift == 0 && cols % kFusedUnroll == 0) {
          CHECK(p0.vec == 0b1111u);
          CHECK(p1.vec == 0b110u);
          CHECK(p2.vec == 0b10u);
        } else if (shift == 1) {
          CHECK(p0.vec == 0u);
        }
        mod.launch("k0", p0);
        mod.launch("k1", p1);
        mod.launch("k2", p2);
        got_gelu.emplace_back(bg.as<std::uint16_t>(), bg.as<std::uint16_t>() + n);
        got_sum.emplace_back(bs.as<float>(), bs.as<float>() + n);
        got_where.emplace_back(bw.as<float>(), bw.as<float>() + n);
        got_copy.emplace_back(bc.as<std::uint16_t>(), bc.as<std::uint16_t>() + n);
      }
    for (std::size_t run = 0; run < got_gelu.size(); ++run) {
      CAPTURE(run);
      // Compared into bools first: doctest's --success would print megabytes.
      const bool gelu_ok = got_gelu[run] == want_gelu;
      const bool sum_ok = std::memcmp(got_sum[run].data(), want_sum.data(), n * 4) == 0;
      const bool where_ok = std::memcmp(got_where[run].data(), want_where.data(), n * 4) == 0;
      const bool copy_ok = got_copy[run] == want_copy;
      CHECK(gelu_ok);
      CHECK(sum_ok);
      CHECK(where_ok);
      CHECK(copy_ok);
    }
  }
}
