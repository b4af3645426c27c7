// The engine's fixed CUDA kernels (src/engine/kernels_device.cuh,
// attention_tc_device.cuh, pool_device.cuh) run on the
// host under the SIMT emulator (cuda_host_sim.hpp), through the same
// dispatchers kernels.cu launches them with: which kernel a shape gets, its
// grid, the barriers and warp shuffles, vector loads, masks and bounds checks.
// Every expected value is a float64 reference computed here from the same
// inputs (bfloat16 inputs are rounded first, as the kernels read them); the
// tolerances are float32 accumulation error, or one bfloat16 rounding for
// bfloat16 outputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/cuda_host_sim.hpp"
// The kernel file is CUDA C++ written for nvcc: host-compiled here, under
// this build's warnings, it trips ones that do not apply to it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wunused-function"
#include "engine/attention_tc_device.cuh"
#include "engine/attention_tf32_device.cuh"
#include "engine/kernels_device.cuh"
#include "engine/pool_device.cuh"
#pragma GCC diagnostic pop

using namespace safeckpt::engine::detail;
using cuda_host_sim::LaunchRecord;
using cuda_host_sim::SimLaunch;

namespace {

// A float32 or bfloat16 device buffer on the host, its values kept as the
// kernel reads them (`at`).
struct HostBuf {
  bool bf16 = false;
  std::vector<float> f;
  std::vector<__nv_bfloat16> h;
  HostBuf(std::size_t n, bool b) : bf16(b) {
    if (b)
      h.resize(n, __float2bfloat16_rn(0.f));
    else
      f.resize(n, 0.f);
  }
  void* ptr() { return bf16 ? static_cast<void*>(h.data()) : static_cast<void*>(f.data()); }
  double at(std::size_t i) const { return bf16 ? __bfloat162float(h[i]) : f[i]; }
  void set(std::size_t i, float v) {
    if (bf16)
      h[i] = __float2bfloat16_rn(v);
    else
      f[i] = v;
  }
  std::size_t size() const { return bf16 ? h.size() : f.size(); }
};

HostBuf random_buf(std::size_t n, bool bf16, std::mt19937& rng, float lo = -2.f, float hi = 2.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  HostBuf b(n, bf16);
  for (std::size_t i = 0; i < n; ++i) b.set(i, d(rng));
  return b;
}

// |got - want| within what a float32 computation and the output's rounding
// allow: relative `rel` (float32 accumulation) plus, for a bfloat16 output,
// one bfloat16 ulp of the value (2^-8 relative).
void check_close(const HostBuf& got, const std::vector<double>& want, double rel, double abs_floor) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double tol = abs_floor + std::abs(want[i]) * (rel + (got.bf16 ? 1.0 / 256 : 0.0));
    if (!(std::abs(got.at(i) - want[i]) <= tol) && bad++ == 0) first = i;
  }
  INFO("first mismatch at " << first << ": got " << got.at(first) << ", want " << want[first]);
  CHECK(bad == 0);
}

std::vector<double> layer_norm_ref(const HostBuf& x, const HostBuf* w, const HostBuf* b, long long rows, long long n,
                                   double eps, std::vector<double>* mean, std::vector<double>* rstd) {
  std::vector<double> y(static_cast<std::size_t>(rows * n));
  for (long long r = 0; r < rows; ++r) {
    double s = 0;
    for (long long i = 0; i < n; ++i) s += x.at(r * n + i);
    const double m = s / static_cast<double>(n);
    double q = 0;
    for (long long i = 0; i < n; ++i) q += (x.at(r * n + i) - m) * (x.at(r * n + i) - m);
    const double rs = 1.0 / std::sqrt(q / static_cast<double>(n) + eps);
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(rs);
    for (long long i = 0; i < n; ++i) {
      double v = (x.at(r * n + i) - m) * rs;
      if (w) v *= w->at(i);
      if (b) v += b->at(i);
      y[r * n + i] = v;
    }
  }
  return y;
}

}  // namespace

TEST_CASE("layer norm kernels on the host emulator: warp per row and block per row (no device)") {
  std::mt19937 rng(7);
  struct Case {
    long long rows, n;
    bool bf16, affine, stats;
    std::size_t x_offset;  // elements: a misaligned x takes the block kernel
    bool warp;             // the dispatcher's expected choice
    int chunks;            // warp kernel's chunks of 128 elements (template argument)
  };
  const Case cases[] = {{9, 768, true, true, true, 0, true, 6},    // GPT-2 / BERT width, bf16; rows not a multiple of 4
                        {6, 768, false, true, false, 0, true, 6},  // float32
                        {5, 64, false, false, true, 0, true, 1},   // one chunk, most lanes idle
                        {4, 256, true, true, false, 0, true, 2},   // two chunks
                        {3, 500, false, true, true, 0, true, 4},   // n % 128 != 0: the last chunk partly used
                        {2, 1024, true, true, true, 0, true, 8},   // the warp kernel's largest row
                        {3, 770, false, true, true, 0, false, 0},  // n % 4 != 0: block kernel
                        {2, 1040, true, true, true, 0, false, 0},  // n > 1024: block kernel, 1024 threads
                        {3, 768, false, true, true, 2, false, 0},  // x 8 bytes off a 16-byte boundary: block kernel
                        {4, 100, true, false, false, 0, true, 1}};  // no weight, no bias
  for (const Case& c : cases) {
    CAPTURE(c.rows);
    CAPTURE(c.n);
    CAPTURE(c.bf16);
    const auto total = static_cast<std::size_t>(c.rows * c.n);
    HostBuf xs = random_buf(total + c.x_offset, c.bf16, rng, -3.f, 5.f);
    HostBuf w = random_buf(static_cast<std::size_t>(c.n), c.bf16, rng, 0.5f, 1.5f);
    HostBuf b = random_buf(static_cast<std::size_t>(c.n), c.bf16, rng);
    HostBuf y(total, c.bf16);
    HostBuf mean(static_cast<std::size_t>(c.rows), c.bf16), rstd(static_cast<std::size_t>(c.rows), c.bf16);
    // x read at an element offset: the reference sees the same values.
    HostBuf x(total, c.bf16);
    for (std::size_t i = 0; i < total; ++i) x.set(i, static_cast<float>(xs.at(i + c.x_offset)));
    void* xp = c.bf16 ? static_cast<void*>(xs.h.data() + c.x_offset) : static_cast<void*>(xs.f.data() + c.x_offset);
    std::vector<LaunchRecord> log;
    const int rc = dispatch_layer_norm(SimLaunch{&log}, xp, c.affine ? w.ptr() : nullptr, c.affine ? b.ptr() : nullptr,
                                       y.ptr(), c.stats ? mean.ptr() : nullptr, c.stats ? rstd.ptr() : nullptr, c.rows,
                                       c.n, 1e-5f, c.bf16 ? 1 : 0, c.bf16 ? 1 : 0);
    REQUIRE(rc == 0);
    REQUIRE(log.size() == 1);
    if (c.warp) {
      CHECK(log[0].block.x == 32u * kLnWarpRows);
      CHECK(log[0].grid.x == static_cast<unsigned>((c.rows + kLnWarpRows - 1) / kLnWarpRows));
      // The instance of the expected chunk count (a template argument: the function returns it as is).
      CHECK(log[0].kernel == reinterpret_cast<const void*>(layer_norm_warp_kernel_for(c.bf16, c.chunks)));
    } else {
      CHECK(log[0].kernel == reinterpret_cast<const void*>(layer_norm_kernel));
      CHECK(log[0].grid.x == static_cast<unsigned>(c.rows));
    }
    std::vector<double> m_ref, r_ref;
    const std::vector<double> want =
        layer_norm_ref(x, c.affine ? &w : nullptr, c.affine ? &b : nullptr, c.rows, c.n, 1e-5, &m_ref, &r_ref);
    check_close(y, want, 1e-5, 1e-5);
    if (c.stats) {
      check_close(mean, m_ref, 1e-5, 1e-6);
      check_close(rstd, r_ref, 1e-5, 1e-6);
    }
  }
}

TEST_CASE("softmax kernel on the host emulator (no device)") {
  std::mt19937 rng(11);
  for (const long long n : {100LL, 1500LL}) {
    for (const bool bf16 : {false, true}) {
      CAPTURE(n);
      CAPTURE(bf16);
      const long long rows = 3;
      HostBuf x = random_buf(static_cast<std::size_t>(rows * n), bf16, rng, -8.f, 8.f);
      HostBuf y(x.size(), !bf16);  // the output in the other dtype: both conversions
      std::vector<LaunchRecord> log;
      REQUIRE(dispatch_softmax(SimLaunch{&log}, x.ptr(), y.ptr(), rows, n, bf16 ? 1 : 0, bf16 ? 0 : 1) == 0);
      REQUIRE(log.size() == 1);
      CHECK(log[0].block.x == (n >= 1024 ? 512u : 128u));
      std::vector<double> want(x.size());
      for (long long r = 0; r < rows; ++r) {
        double mx = -INFINITY, s = 0;
        for (long long i = 0; i < n; ++i) mx = std::max(mx, x.at(r * n + i));
        for (long long i = 0; i < n; ++i) s += std::exp(x.at(r * n + i) - mx);
        for (long long i = 0; i < n; ++i) want[r * n + i] = std::exp(x.at(r * n + i) - mx) / s;
      }
      check_close(y, want, 1e-5, 1e-7);
    }
  }
}

namespace {

// softmax(scores + mask) over keys, causal (top-left) and masks as
// AttnSoftmaxArgs / AttnArgs describe them; a row with every key masked is
// zeros. scores[bh][l][s] for bh over (b - b0) * H + h.
std::vector<double> masked_softmax_ref(const std::vector<double>& scores, long long nb, long long H, long long L,
                                       long long S, long long b0, bool causal, int mask_kind, const void* mask,
                                       const HostBuf* add_mask, const long long* m_s) {
  std::vector<double> p(scores.size(), 0.0);
  const auto* mb = static_cast<const unsigned char*>(mask);
  for (long long bh = 0; bh < nb * H; ++bh)
    for (long long l = 0; l < L; ++l) {
      const long long b = b0 + bh / H, h = bh % H;
      const std::size_t row = static_cast<std::size_t>((bh * L + l) * S);
      std::vector<double> v(static_cast<std::size_t>(S));
      double mx = -INFINITY;
      for (long long s = 0; s < S; ++s) {
        double x = scores[row + s];
        const long long mi = b * m_s[0] + h * m_s[1] + l * m_s[2] + s * m_s[3];
        if (causal && s > l) x = -INFINITY;
        if (mask_kind == 1 && !mb[mi]) x = -INFINITY;
        // finfo.min absorbs any score, as in PyTorch's float32 (the ulp of
        // a double at 3.4e38 is 2^75): every key of such a row weighs the same.
        if (mask_kind == 2) x += add_mask->at(static_cast<std::size_t>(mi));
        v[s] = x;
        mx = std::max(mx, x);
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (long long s = 0; s < S; ++s) sum += std::exp(v[s] - mx);
      for (long long s = 0; s < S; ++s) p[row + s] = std::exp(v[s] - mx) / sum;
    }
  return p;
}

}  // namespace

TEST_CASE("materialized attention softmax kernel on the host emulator: causal, masks, batch offset (no device)") {
  std::mt19937 rng(3);
  struct Case {
    long long nb, H, L, S, b0;
    bool causal;
    int mask_kind;
    bool probs_bf16;
    long long block_rows = 0;  // causal row blocks of the P V GEMMs
  };
  const Case cases[] = {{1, 2, 5, 7, 0, true, 0, false},  // L < S: keys past L never read by P V
                        {2, 2, 4, 600, 1, false, 1, true},
                        {2, 1, 6, 6, 0, true, 2, false},
                        {1, 3, 3, 2100, 0, false, 2, true},
                        {1, 1, 9, 5, 0, true, 1, false},       // L > S: causal rows past the last key keep every key
                        {1, 2, 11, 11, 0, true, 0, false, 4},  // row blocks [0,4) [4,8) [8,11), in place
                        {2, 1, 10, 7, 1, true, 1, true, 3},    // blocks past the keys, bf16 probabilities
                        // The warp-per-row kernel's float4 path (S a multiple of 4, <= 1024):
                        {2, 2, 6, 128, 0, true, 2, false, 4},    // BERT-like rows, in place, row blocks
                        {1, 2, 40, 1024, 0, true, 0, true, 16},  // GPT-2-like: causal rows past kn untouched
                        {1, 1, 5, 1000, 0, false, 1, false},     // 8 chunks, the last one partly past S
                        {1, 1, 3, 1028, 0, true, 0, false}};     // just past 1024: the block kernel
  for (const Case& c : cases) {
    CAPTURE(c.S);
    CAPTURE(c.mask_kind);
    const long long B = c.b0 + c.nb;
    std::uniform_real_distribution<float> d(-6.f, 6.f);
    std::vector<float> scores(static_cast<std::size_t>(c.nb * c.H * c.L * c.S));
    for (auto& s : scores) s = d(rng);
    const std::vector<double> sd(scores.begin(), scores.end());
    // Masks of shape [B, 1, L, S] broadcast over heads (HF's padding masks).
    const long long m_s[4] = {c.L * c.S, 0, c.S, 1};
    std::vector<unsigned char> bmask(static_cast<std::size_t>(B * c.L * c.S));
    for (std::size_t i = 0; i < bmask.size(); ++i) bmask[i] = (rng() % 4) != 0;
    // One row masked out entirely: zeros.
    for (long long s = 0; s < c.S; ++s) bmask[static_cast<std::size_t>(c.b0 * c.L * c.S + s)] = 0;
    HostBuf amask = random_buf(bmask.size(), false, rng, -3.f, 1.f);
    const void* mask =
        c.mask_kind == 1 ? static_cast<const void*>(bmask.data()) : (c.mask_kind == 2 ? amask.ptr() : nullptr);
    HostBuf probs(scores.size(), c.probs_bf16);
    for (std::size_t i = 0; i < probs.size(); ++i) probs.set(i, 7.f);  // what no write leaves
    AttnSoftmaxArgs a{};
    a.scores = scores.data();
    a.probs = c.probs_bf16 ? probs.ptr() : static_cast<void*>(scores.data());  // float32: in place
    a.probs_bf16 = c.probs_bf16 ? 1 : 0;
    a.rows = c.nb * c.H * c.L;
    a.H = c.H;
    a.L = c.L;
    a.S = c.S;
    a.b0 = c.b0;
    a.mask = mask;
    a.mask_kind = c.mask_kind;
    a.mask_bf16 = 0;
    for (int i = 0; i < 4; ++i) a.m_s[i] = m_s[i];
    a.causal = c.causal ? 1 : 0;
    a.block_rows = c.block_rows;
    std::vector<LaunchRecord> log;
    REQUIRE(dispatch_attention_softmax(SimLaunch{&log}, a) == 0);
    REQUIRE(log.size() == 1);
    {  // rows of up to 1024 keys: a warp per row, the instance with enough 128-key chunks
      const long long chunks = (c.S + 127) / 128;
      const void* want_kernel = c.S > 1024    ? reinterpret_cast<const void*>(attention_softmax_kernel)
                                : chunks <= 1 ? reinterpret_cast<const void*>(attention_softmax_warp_kernel<1>)
                                : chunks <= 2 ? reinterpret_cast<const void*>(attention_softmax_warp_kernel<2>)
                                : chunks <= 4 ? reinterpret_cast<const void*>(attention_softmax_warp_kernel<4>)
                                              : reinterpret_cast<const void*>(attention_softmax_warp_kernel<8>);
      CHECK(log[0].kernel == want_kernel);
    }
    if (!c.probs_bf16) probs.f = scores;
    std::vector<double> want =
        masked_softmax_ref(sd, c.nb, c.H, c.L, c.S, c.b0, c.causal, c.mask_kind, mask, &amask, m_s);
    // Causal rows: probabilities for the keys of the row's block only
    // (kn = min(S, L, block end)); after that, what was there (7, or in
    // place the score).
    std::size_t kept = 0;
    for (long long row = 0; row < c.nb * c.H * c.L; ++row) {
      const long long l = row % c.L, br = c.block_rows > 0 ? c.block_rows : c.L;
      const long long kn = c.causal ? std::min({c.S, c.L, (l / br + 1) * br}) : c.S;
      for (long long s = kn; s < c.S; ++s) {
        const auto i = static_cast<std::size_t>(row * c.S + s);
        want[i] = c.probs_bf16 ? 7.0 : sd[i];
        ++kept;
      }
    }
    if (c.block_rows > 0) CHECK(kept > 0);
    check_close(probs, want, 1e-5, 1e-7);
  }
}

namespace {

// q/k/v as [B, S, H, D] in memory (the layout of a projection's output
// viewed per head): AttnArgs strides for b, h, row.
struct Qkv {
  HostBuf t;
  long long s[3];
  Qkv(long long B, long long H, long long rows, long long D, bool bf16, std::mt19937& rng)
      : t(random_buf(static_cast<std::size_t>(B * rows * H * D), bf16, rng)), s{rows * H * D, D, H * D} {}
  double at(long long b, long long h, long long r, long long d) const {
    return t.at(static_cast<std::size_t>(b * s[0] + h * s[1] + r * s[2] + d));
  }
};

// One attention problem for the flash kernels: q/k/v as Qkv, a bool or
// additive mask of [B, H, L, S] (`mask_heads`) or [B, 1, L, S] with one row
// of batch element 0 masked entirely, the output [B, H, L, Dv] contiguous or
// with heads inside rows (`heads_in_rows`); `a` for the dispatchers;
// reference() in float64.
struct AttnProblem {
  long long B, H, L, S, D, Dv;
  bool causal;
  int mask_kind;
  Qkv q, k, v;
  std::vector<unsigned char> bmask;
  HostBuf amask, out;
  long long m_s[4];
  AttnArgs a{};
  AttnProblem(long long b, long long h, long long l, long long s, long long d, long long dv, bool causal_, int mask,
              bool bf16, bool mask_heads, bool heads_in_rows, std::mt19937& rng)
      : B(b),
        H(h),
        L(l),
        S(s),
        D(d),
        Dv(dv),
        causal(causal_),
        mask_kind(mask),
        q(b, h, l, d, bf16, rng),
        k(b, h, s, d, bf16, rng),
        v(b, h, s, dv, bf16, rng),
        bmask(static_cast<std::size_t>(b * (mask_heads ? h : 1) * l * s)),
        amask(random_buf(bmask.size(), bf16, rng, -2.f, 1.f)),
        out(static_cast<std::size_t>(b * h * l * dv), bf16),
        m_s{(mask_heads ? h : 1) * l * s, mask_heads ? l * s : 0, s, 1} {
    for (auto& m : bmask) m = (rng() % 3) != 0;
    const long long dead = std::min<long long>(3, l - 1);  // a row whose every key is masked: zeros
    for (long long j = 0; j < s; ++j) bmask[static_cast<std::size_t>(dead * s + j)] = 0;
    // Additive: that row -inf on every key (zeros too); the row after it
    // finfo.min on every key (HF's padding value: finite, so PyTorch gives
    // every key the same weight, the mean of V), and on every other key of
    // the row after that (those weigh nothing beside the others).
    const float lowest = bf16 ? -3.38953139e38f : -3.40282347e38f;
    for (long long j = 0; j < s; ++j) {
      const auto at = [&](long long row) { return static_cast<std::size_t>(row * s + j); };
      amask.set(at(dead), -INFINITY);
      if (dead + 1 < l) amask.set(at(dead + 1), lowest);
      if (dead + 2 < l && j % 2 == 1) amask.set(at(dead + 2), lowest);
    }
    a.q = q.t.ptr();
    a.k = k.t.ptr();
    a.v = v.t.ptr();
    a.out = out.ptr();
    a.mask_kind = mask;
    a.mask = mask == 1 ? static_cast<const void*>(bmask.data()) : (mask == 2 ? amask.ptr() : nullptr);
    a.B = b;
    a.H = h;
    a.L = l;
    a.S = s;
    a.D = d;
    a.Dv = dv;
    for (int i = 0; i < 3; ++i) {
      a.q_s[i] = q.s[i];
      a.k_s[i] = k.s[i];
      a.v_s[i] = v.s[i];
    }
    const long long o_s[3] = {h * l * dv, heads_in_rows ? dv : l * dv, heads_in_rows ? h * dv : dv};
    for (int i = 0; i < 3; ++i) a.o_s[i] = o_s[i];
    for (int i = 0; i < 4; ++i) a.m_s[i] = m_s[i];
    a.scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.causal = causal_ ? 1 : 0;
    a.bf16 = bf16 ? 1 : 0;
  }
  // softmax(scale * q k^T, masked) v, at the output's offsets.
  std::vector<double> reference() const {
    std::vector<double> scores(static_cast<std::size_t>(B * H * L * S));
    for (long long b = 0; b < B; ++b)
      for (long long h = 0; h < H; ++h)
        for (long long l = 0; l < L; ++l)
          for (long long s = 0; s < S; ++s) {
            double acc = 0;
            for (long long d = 0; d < D; ++d) acc += q.at(b, h, l, d) * k.at(b, h, s, d);
            scores[static_cast<std::size_t>(((b * H + h) * L + l) * S + s)] = acc * a.scale;
          }
    const std::vector<double> p = masked_softmax_ref(scores, B, H, L, S, 0, causal, mask_kind, a.mask, &amask, m_s);
    std::vector<double> want(out.size());
    for (long long b = 0; b < B; ++b)
      for (long long h = 0; h < H; ++h)
        for (long long l = 0; l < L; ++l)
          for (long long d = 0; d < Dv; ++d) {
            double acc = 0;
            for (long long s = 0; s < S; ++s)
              acc += p[static_cast<std::size_t>(((b * H + h) * L + l) * S + s)] * v.at(b, h, s, d);
            want[static_cast<std::size_t>(b * a.o_s[0] + h * a.o_s[1] + l * a.o_s[2] + d)] = acc;
          }
    return want;
  }
};

}  // namespace

TEST_CASE("flash attention kernel (CUDA cores) on the host emulator (no device)") {
  std::mt19937 rng(5);
  struct Case {
    long long B, H, L, S, D, Dv;
    bool causal;
    int mask_kind;
    bool bf16;
    int head_cap;
  };
  const Case cases[] = {{1, 2, 70, 90, 40, 40, false, 0, false, 64},     // two row blocks, two key tiles, partial
                        {2, 1, 65, 65, 64, 64, true, 0, true, 64},       // causal, bf16
                        {1, 2, 20, 130, 80, 100, false, 1, false, 128},  // bool mask, head cap 128, D != Dv
                        {2, 1, 33, 17, 16, 24, false, 2, true, 64},      // additive mask, bf16, L > S
                        {1, 1, 100, 40, 8, 8, true, 0, false, 64}};      // causal with L > S
  for (const Case& c : cases) {
    CAPTURE(c.L);
    CAPTURE(c.S);
    CAPTURE(c.D);
    CAPTURE(c.mask_kind);
    CAPTURE(c.bf16);
    AttnProblem pr(c.B, c.H, c.L, c.S, c.D, c.Dv, c.causal, c.mask_kind, c.bf16, true, false, rng);
    std::vector<LaunchRecord> log;
    REQUIRE(dispatch_attention(SimLaunch{&log}, pr.a) == 0);
    REQUIRE(log.size() == 1);
    CHECK(log[0].kernel == (c.head_cap == 64 ? reinterpret_cast<const void*>(attention_kernel<64>)
                                             : reinterpret_cast<const void*>(attention_kernel<128>)));
    CHECK(log[0].smem == static_cast<unsigned>(attention_smem_bytes(c.head_cap)));
    check_close(pr.out, pr.reference(), 1e-4, 1e-5);
  }
}

TEST_CASE("fixed-kernel dispatchers refuse what the device cannot launch (no device)") {
  AttnArgs a{};
  a.B = 1;
  a.H = 1;
  a.L = 4;
  a.S = 4;
  a.D = 129;  // past the kernel's head cap
  a.Dv = 64;
  std::vector<LaunchRecord> log;
  CHECK(dispatch_attention(SimLaunch{&log}, a) == kLaunchInvalidValue);
  a.D = 64;
  a.B = 65536;  // grid.y
  CHECK(dispatch_attention(SimLaunch{&log}, a) == kLaunchInvalidValue);
  AttnSoftmaxArgs s{};
  s.rows = 0x80000000LL;
  s.S = 4;
  CHECK(dispatch_attention_softmax(SimLaunch{&log}, s) == kLaunchInvalidValue);
  CHECK(dispatch_layer_norm(SimLaunch{&log}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0x80000000LL, 770,
                            1e-5f, 0, 0) == kLaunchInvalidValue);
  CHECK(log.empty());  // nothing launched
}

TEST_CASE("embedding and gather kernels on the host emulator: out-of-range indices flag an error (no device)") {
  std::mt19937 rng(9);
  const long long rows = 10, dim = 6;
  HostBuf w = random_buf(static_cast<std::size_t>(rows * dim), true, rng);
  std::vector<long long> idx = {3, 0, 9, 10, -1, 4};
  HostBuf out(idx.size() * dim, true);
  int flag = 0;
  REQUIRE(dispatch_embedding(SimLaunch{}, w.ptr(), rows, dim, dim, 1, idx.data(), static_cast<long long>(idx.size()),
                             out.ptr(), &flag) == 0);
  CHECK(flag == 1);
  for (std::size_t r = 0; r < idx.size(); ++r)
    for (long long c = 0; c < dim; ++c) {
      const bool ok = idx[r] >= 0 && idx[r] < rows;
      CHECK(out.at(r * dim + c) == (ok ? w.at(static_cast<std::size_t>(idx[r] * dim + c)) : 0.0));
    }
  // gather(x, 1, index) over x [3, 5] float32 with an int32 index [3, 2],
  // negative indices wrapping (index.Tensor's rule).
  std::vector<float> x(15);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 0.5f;
  for (const bool bad : {false, true}) {
    std::vector<int> gi = {4, 0, -1, 2, 1, 3};
    if (bad) gi[3] = 5;
    std::vector<float> y(6, -7.f);
    IndexGatherArgs g{};
    g.x = x.data();
    g.out = y.data();
    g.elem_bytes = 4;
    g.rank = 2;
    g.n = 6;
    g.shape[0] = 3;
    g.shape[1] = 2;
    g.x_strides[0] = 5;
    g.x_strides[1] = 0;  // dim 1 comes from the index
    g.n_index = 1;
    g.idx[0] = gi.data();
    g.idx_int32[0] = 1;
    g.idx_strides[0][0] = 2;
    g.idx_strides[0][1] = 1;
    g.idx_x_stride[0] = 1;
    g.idx_size[0] = 5;
    g.negative_wraps = 1;
    int gflag = 0;
    g.error_flag = &gflag;
    REQUIRE(dispatch_index_gather(SimLaunch{}, g) == 0);
    CHECK(gflag == (bad ? 1 : 0));
    for (long long r = 0; r < 3; ++r)
      for (long long c = 0; c < 2; ++c) {
        long long j = gi[static_cast<std::size_t>(r * 2 + c)];
        if (j < 0) j += 5;
        const float want = (j >= 0 && j < 5) ? x[static_cast<std::size_t>(r * 5 + j)] : 0.f;
        CHECK(y[static_cast<std::size_t>(r * 2 + c)] == want);
      }
  }
}

namespace {
// The instance of each tensor-core flash kernel a head cap and mask kind take.
const void* tc_kernel(int head_cap, int mask_kind) {
  const void* k64[3] = {reinterpret_cast<const void*>(attention_tc_kernel<64, 0>),
                        reinterpret_cast<const void*>(attention_tc_kernel<64, 1>),
                        reinterpret_cast<const void*>(attention_tc_kernel<64, 2>)};
  const void* k128[3] = {reinterpret_cast<const void*>(attention_tc_kernel<128, 0>),
                         reinterpret_cast<const void*>(attention_tc_kernel<128, 1>),
                         reinterpret_cast<const void*>(attention_tc_kernel<128, 2>)};
  return (head_cap == 64 ? k64 : k128)[mask_kind];
}
const void* tf32_kernel(int head_cap, int mask_kind) {
  using tf32x3::attention_tf32x3_kernel;
  const void* k64[3] = {reinterpret_cast<const void*>(attention_tf32x3_kernel<64, 0>),
                        reinterpret_cast<const void*>(attention_tf32x3_kernel<64, 1>),
                        reinterpret_cast<const void*>(attention_tf32x3_kernel<64, 2>)};
  const void* k128[3] = {reinterpret_cast<const void*>(attention_tf32x3_kernel<128, 0>),
                         reinterpret_cast<const void*>(attention_tf32x3_kernel<128, 1>),
                         reinterpret_cast<const void*>(attention_tf32x3_kernel<128, 2>)};
  return (head_cap == 64 ? k64 : k128)[mask_kind];
}
}  // namespace

TEST_CASE("tensor-core flash attention kernel on the host emulator: mma.sync, ldmatrix, cp.async (no device)") {
  std::mt19937 rng(13);
  struct Case {
    long long B, H, L, S, D, Dv;
    bool causal;
    int mask_kind;
    int head_cap;
    bool reverse;  // the emulator's threads take turns from the last one
  };
  const Case cases[] = {
      {1, 1, 300, 300, 64, 64, true, 0, 64, false},  // GPT-2's head; row block 4's group 0 reuses a buffer
      {1, 1, 70, 150, 40, 40, false, 1, 64, true},   // D not a multiple of 16; bool mask; threads reversed
      {2, 1, 65, 33, 80, 72, false, 2, 128, false},  // head cap 128, D != Dv, additive mask, L > S
      {1, 1, 40, 90, 20, 12, true, 0, 64, false}};   // rows not 16-byte aligned: the synchronous loads
  for (const Case& c : cases) {
    CAPTURE(c.L);
    CAPTURE(c.S);
    CAPTURE(c.D);
    CAPTURE(c.Dv);
    CAPTURE(c.mask_kind);
    // The mask broadcast over heads, the output with heads inside rows: as the engine runs it.
    AttnProblem pr(c.B, c.H, c.L, c.S, c.D, c.Dv, c.causal, c.mask_kind, true, false, true, rng);
    const std::vector<double> want = pr.reference();
    // cp.async copies landing as late, then as early as the PTX allows.
    for (const bool at_issue : {false, true}) {
      CAPTURE(at_issue);
      for (std::size_t i = 0; i < pr.out.size(); ++i) pr.out.set(i, NAN);  // every element written again
      std::vector<LaunchRecord> log;
      REQUIRE(dispatch_attention_tc(SimLaunch{&log, c.reverse, at_issue}, pr.a) == 0);
      REQUIRE(log.size() == 1);
      CHECK(log[0].kernel == tc_kernel(c.head_cap, c.mask_kind));
      // The kernel rounds the probabilities to bfloat16 before P V (as
      // PyTorch's flash kernels): up to 2^-9 of each, times |v| <= 2.
      check_close(pr.out, want, 1e-3, 8e-3);
    }
  }
}

TEST_CASE("3xTF32 flash attention kernel on the host emulator: float32 accuracy from tf32 mma.sync (no device)") {
  std::mt19937 rng(19);
  struct Case {
    long long B, H, L, S, D, Dv;
    bool causal;
    int mask_kind;
    int head_cap;
    bool reverse;
  };
  const Case cases[] = {
      {1, 1, 130, 130, 64, 64, true, 0, 64, false},  // GPT-2's head, three row blocks, partial key tile
      {1, 1, 130, 130, 64, 64, true, 0, 64, true},   // the same with the threads reversed (pipeline hazards)
      {1, 2, 70, 75, 40, 24, false, 1, 64, true},    // D, Dv not multiples of 8 past 16; bool mask; reversed
      {2, 1, 65, 33, 80, 72, false, 2, 128, false},  // head cap 128, additive mask, L > S
      {1, 1, 40, 90, 18, 10, true, 0, 64, false}};   // rows not 16-byte aligned: scalar loads
  for (const Case& c : cases) {
    CAPTURE(c.L);
    CAPTURE(c.S);
    CAPTURE(c.D);
    CAPTURE(c.Dv);
    CAPTURE(c.mask_kind);
    AttnProblem pr(c.B, c.H, c.L, c.S, c.D, c.Dv, c.causal, c.mask_kind, false, false, true, rng);
    const std::vector<double> want = pr.reference();
    // Head cap 64 with 16-byte rows: the cp.async pipeline, its copies
    // landing as late, then as early as the PTX allows.
    for (const bool at_issue : {false, true}) {
      CAPTURE(at_issue);
      for (std::size_t i = 0; i < pr.out.size(); ++i) pr.out.set(i, NAN);  // every element written
      std::vector<LaunchRecord> log;
      REQUIRE(dispatch_attention_tf32x3(SimLaunch{&log, c.reverse, at_issue}, pr.a) == 0);
      REQUIRE(log.size() == 1);
      CHECK(log[0].kernel == tf32_kernel(c.head_cap, c.mask_kind));
      // float32 accuracy (the CUDA-core kernel's bound above); one TF32
      // product alone (2^-11 relative) would miss it.
      check_close(pr.out, want, 1e-4, 1e-5);
    }
  }
  // A NaN whose bit pattern is all ones (sign set): rounding its pattern up
  // to TF32 wraps to +0, so only the split's small part still carries the
  // NaN. A query row holding it, and every row meeting a key holding it,
  // must come out NaN (as PyTorch's), never finite.
  {
    const float nan_ones = __uint_as_float(0xffffffffu);
    AttnProblem pr(1, 1, 20, 20, 64, 64, true, 0, false, false, false, rng);
    const long long qrow = 5, krow = 12;
    for (long long d = 0; d < 64; d += 9) pr.q.t.set(static_cast<std::size_t>(qrow * pr.q.s[2] + d), nan_ones);
    pr.k.t.set(static_cast<std::size_t>(krow * pr.k.s[2] + 7), nan_ones);
    REQUIRE(dispatch_attention_tf32x3(SimLaunch{}, pr.a) == 0);
    for (long long r = 0; r < 20; ++r) {
      CAPTURE(r);
      const bool poisoned = r == qrow || r >= krow;  // causal: rows from krow on see that key
      for (long long d = 0; d < 64; ++d) {
        const double o = pr.out.at(static_cast<std::size_t>(r * pr.a.o_s[2] + d));
        if (poisoned) {
          CHECK(std::isnan(o));
        } else {
          CHECK(std::isfinite(o));
        }
      }
    }
  }
  AttnArgs bf{};
  bf.bf16 = 1;
  bf.B = bf.H = bf.L = bf.S = 1;
  bf.D = bf.Dv = 64;
  CHECK(dispatch_attention_tf32x3(SimLaunch{}, bf) == kLaunchInvalidValue);  // float32 only
}

TEST_CASE("pooling kernels on the host emulator: adaptive average, max with padding and NaN (no device)") {
  std::mt19937 rng(17);
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    // adaptive_avg_pool2d, NCHW (a warp per output) and channels-last.
    for (const long long channels : {0LL, 5LL}) {
      CAPTURE(channels);
      const long long n = 2, c = 5, h = 9, w = 7, oh = 2, ow = 1, planes = n * c;  // windows of 35 > 32 lanes
      HostBuf x = random_buf(static_cast<std::size_t>(planes * h * w), bf16, rng);
      HostBuf y(static_cast<std::size_t>(planes * oh * ow), bf16);
      REQUIRE(dispatch_adaptive_avg_pool2d(SimLaunch{}, x.ptr(), y.ptr(), planes, h, w, oh, ow, bf16 ? 1 : 0,
                                           channels) == 0);
      std::vector<double> want(y.size());
      for (long long pl = 0; pl < planes; ++pl)
        for (long long oy = 0; oy < oh; ++oy)
          for (long long ox = 0; ox < ow; ++ox) {
            // aten/src/ATen/native/AdaptiveAveragePooling.cpp's windows.
            const long long h0 = oy * h / oh, h1 = ((oy + 1) * h + oh - 1) / oh;
            const long long w0 = ox * w / ow, w1 = ((ox + 1) * w + ow - 1) / ow;
            const long long b = pl / c, ch = pl % c;
            double sum = 0;
            for (long long i = h0; i < h1; ++i)
              for (long long j = w0; j < w1; ++j)
                sum += x.at(
                    static_cast<std::size_t>(channels > 0 ? ((b * h + i) * w + j) * c + ch : (pl * h + i) * w + j));
            const long long o = channels > 0 ? ((b * oh + oy) * ow + ox) * c + ch : (pl * oh + oy) * ow + ox;
            want[static_cast<std::size_t>(o)] = sum / static_cast<double>((h1 - h0) * (w1 - w0));
          }
      check_close(y, want, 1e-5, 1e-6);
    }
    // max_pool2d: ResNet's stem (3x3, stride 2, padding 1) in NCHW, and a
    // dilated 2x2 window in channels-last; a NaN in the input wins its windows.
    for (const long long channels : {0LL, 3LL}) {
      CAPTURE(channels);
      const long long n = 2, c = 3, h = 9, w = 8, planes = n * c;
      MaxPoolArgs a{};
      a.kh = channels > 0 ? 2 : 3;
      a.kw = a.kh;
      a.sh = 2;
      a.sw = 2;
      a.ph = channels > 0 ? 0 : 1;
      a.pw = a.ph;
      a.dh = channels > 0 ? 2 : 1;
      a.dw = a.dh;
      a.h = h;
      a.w = w;
      a.oh = (h + 2 * a.ph - a.dh * (a.kh - 1) - 1) / a.sh + 1;
      a.ow = (w + 2 * a.pw - a.dw * (a.kw - 1) - 1) / a.sw + 1;
      a.planes = planes;
      a.channels = channels;
      a.bf16 = bf16 ? 1 : 0;
      HostBuf x = random_buf(static_cast<std::size_t>(planes * h * w), bf16, rng);
      x.set(61, NAN);  // (2, 4) of channel 1 channels-last; (7, 5) of plane 0 in NCHW: both in windows
      HostBuf y(static_cast<std::size_t>(planes * a.oh * a.ow), bf16);
      a.x = x.ptr();
      a.y = y.ptr();
      REQUIRE(dispatch_max_pool2d(SimLaunch{}, a) == 0);
      std::size_t nan_outputs = 0, bad = 0;
      for (long long pl = 0; pl < planes; ++pl)
        for (long long oy = 0; oy < a.oh; ++oy)
          for (long long ox = 0; ox < a.ow; ++ox) {
            const long long b = pl / c, ch = pl % c;
            double m = -INFINITY;
            for (long long i = 0; i < a.kh; ++i)
              for (long long j = 0; j < a.kw; ++j) {
                const long long iy = oy * a.sh - a.ph + i * a.dh, ix = ox * a.sw - a.pw + j * a.dw;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                const double v = x.at(
                    static_cast<std::size_t>(channels > 0 ? ((b * h + iy) * w + ix) * c + ch : (pl * h + iy) * w + ix));
                if (v > m || std::isnan(v)) m = v;
              }
            const long long o = channels > 0 ? ((b * a.oh + oy) * a.ow + ox) * c + ch : (pl * a.oh + oy) * a.ow + ox;
            const double got = y.at(static_cast<std::size_t>(o));
            if (std::isnan(m)) ++nan_outputs;
            if (std::isnan(m) ? !std::isnan(got) : got != m) ++bad;
          }
      CHECK(nan_outputs > 0);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("batch norm folding and bias + add + relu kernels on the host emulator (no device)") {
  std::mt19937 rng(19);
  const long long K = 4, C = 3, R = 3, S = 2;
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> w(static_cast<std::size_t>(K * C * R * S));
  for (auto& v : w) v = d(rng);
  for (const bool bf16 : {false, true}) {
    for (const bool affine : {false, true}) {
      CAPTURE(bf16);
      CAPTURE(affine);
      HostBuf gamma = random_buf(K, bf16, rng, 0.5f, 1.5f), beta = random_buf(K, bf16, rng),
              mean = random_buf(K, bf16, rng), var = random_buf(K, bf16, rng, 0.1f, 2.f),
              cbias = random_buf(K, bf16, rng);
      std::vector<float> wf(w.size(), -1.f), bias(K, -1.f), scale(K, -1.f);
      FoldBnArgs a{};
      a.w = w.data();
      a.wf = wf.data();
      a.k = K;
      a.c = C;
      a.r = R;
      a.s = S;
      const long long ws[4] = {C * R * S, R * S, S, 1}, wfs[4] = {R * S * C, 1, S * C, C};  // into K,R,S,C
      for (int i = 0; i < 4; ++i) {
        a.ws[i] = ws[i];
        a.wfs[i] = wfs[i];
      }
      a.gamma = affine ? gamma.ptr() : nullptr;
      a.beta = affine ? beta.ptr() : nullptr;
      a.mean = mean.ptr();
      a.var = var.ptr();
      a.conv_bias = affine ? cbias.ptr() : nullptr;
      for (int i = 0; i < 5; ++i) {
        a.vs[i] = 1;
        a.vbf16[i] = bf16 ? 1 : 0;
      }
      a.eps = 1e-5f;
      a.bias = bias.data();
      a.scale = scale.data();
      REQUIRE(dispatch_fold_batch_norm(SimLaunch{}, a) == 0);
      for (long long k = 0; k < K; ++k) {
        const double sc = (affine ? gamma.at(k) : 1.0) / std::sqrt(var.at(k) + 1e-5);
        CHECK(scale[k] == doctest::Approx(sc).epsilon(1e-6));
        CHECK(bias[k] == doctest::Approx(((affine ? cbias.at(k) : 0.0) - mean.at(k)) * sc + (affine ? beta.at(k) : 0.0))
                             .epsilon(1e-5));
        for (long long c = 0; c < C; ++c)
          for (long long r = 0; r < R; ++r)
            for (long long s = 0; s < S; ++s)
              CHECK(wf[static_cast<std::size_t>(k * wfs[0] + c * wfs[1] + r * wfs[2] + s * wfs[3])] ==
                    doctest::Approx(w[static_cast<std::size_t>(k * ws[0] + c * ws[1] + r * ws[2] + s * ws[3])] * sc)
                        .epsilon(1e-6));
      }
    }
  }
  // relu(y * scale + bias + z) over NCHW [2, 3, 4, 5] (inner = 20), a NaN kept.
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    const long long count = 120, channels = 3, inner = 20;
    HostBuf y = random_buf(count, bf16, rng), z = random_buf(count, bf16, rng);
    y.set(7, NAN);
    const HostBuf y0 = y;
    std::vector<float> scale = {0.5f, 2.f, -1.f}, bias = {0.1f, -0.2f, 0.3f};
    REQUIRE(dispatch_bias_add_relu(SimLaunch{}, y.ptr(), scale.data(), bias.data(), z.ptr(), count, channels, inner,
                                   bf16 ? 1 : 0) == 0);
    std::vector<double> want(static_cast<std::size_t>(count));
    for (long long i = 0; i < count; ++i) {
      const long long ch = (i / inner) % channels;
      const double v = y0.at(i) * scale[ch] + bias[ch] + z.at(i);
      want[i] = v > 0 || std::isnan(v) ? v : 0.0;
    }
    CHECK(std::isnan(y.at(7)));
    want[7] = 0;
    y.set(7, 0.f);
    check_close(y, want, 1e-6, 1e-6);
  }
}

TEST_CASE("pointer-array kernel on the host emulator: cuBLASLt batch entries over (b, h) (no device)") {
  // Three arrays over 5 batch elements x 3 heads, as the materialized
  // attention fills them: q-like (b and h strides of a [B, L, H, D] view),
  // scores-like (contiguous [B*H, L, S]), and one with a row-block offset.
  std::vector<char> mem(1 << 20);  // every address below lies inside it
  char* a = mem.data();
  char* b = mem.data();
  char* c = mem.data();
  PtrArraysArgs args{};
  args.arrays = 3;
  args.n = 15;
  args.per_b = 3;
  args.base[0] = a;
  args.step_b[0] = 40 * 3 * 32 * 4;
  args.step_h[0] = 32 * 4;
  args.base[1] = b;
  args.step_b[1] = 3 * 40 * 56 * 4;
  args.step_h[1] = 40 * 56 * 4;
  args.base[2] = c + 256 * 56 * 4;
  args.step_b[2] = 3 * 520 * 56 * 2;
  args.step_h[2] = 520 * 56 * 2;
  args.array_stride = 16;  // arrays on 128-byte boundaries, as the plan lays them out
  std::vector<void*> out(48, nullptr);
  args.out = out.data();
  std::vector<LaunchRecord> log;
  REQUIRE(dispatch_ptr_arrays(SimLaunch{&log}, args) == 0);
  REQUIRE(log.size() == 1);
  for (int j = 0; j < 3; ++j) {
    for (long long i = 0; i < 15; ++i) {
      CAPTURE(j);
      CAPTURE(i);
      const char* want = args.base[j] + (i / 3) * args.step_b[j] + (i % 3) * args.step_h[j];
      CHECK(out[static_cast<std::size_t>(j * 16 + i)] == static_cast<const void*>(want));
    }
    CHECK(out[static_cast<std::size_t>(j * 16 + 15)] == nullptr);  // the padding stays as it was
  }
  args.arrays = kMaxPtrArrays + 1;
  CHECK(dispatch_ptr_arrays(SimLaunch{&log}, args) == kLaunchInvalidValue);
  args.arrays = 3;
  args.array_stride = 14;  // < n
  CHECK(dispatch_ptr_arrays(SimLaunch{&log}, args) == kLaunchInvalidValue);
  CHECK(log.size() == 1);
}

TEST_CASE("unpad-rows kernel on the host emulator: padded GEMM rows made dense at every alignment (no device)") {
  // The split misaligned GEMM's copy (plan_gemm.cpp): rows of ld elements (16-byte
  // aligned) into rows of n, for each destination offset within 16 bytes, so
  // that every byte shift of the 16-byte path and the element-wise head and
  // tail run. Bytes around the destination must stay as they were.
  for (const int es : {2, 4}) {
    for (const long long n : {1LL, 7LL, 8LL, 9LL, 37LL, 301LL}) {
      const long long per16 = 16 / es, ld = (n + per16 - 1) / per16 * per16 + (n % 3 == 0 ? per16 : 0), rows = 5;
      std::vector<std::uint8_t> src_mem(static_cast<std::size_t>(rows * ld * es) + 16);
      std::uint8_t* src = src_mem.data() + (16 - reinterpret_cast<std::uintptr_t>(src_mem.data()) % 16) % 16;
      for (long long i = 0; i < rows * ld * es; ++i) src[i] = static_cast<std::uint8_t>(i * 131 + i / 256 + 1);
      for (long long off = 0; off < 16; off += es) {
        CAPTURE(es);
        CAPTURE(n);
        CAPTURE(off);
        const std::size_t dst_bytes = static_cast<std::size_t>(rows * n * es);
        std::vector<std::uint8_t> dst_mem(dst_bytes + 64, 0xAB);
        std::uint8_t* base = dst_mem.data() + (16 - reinterpret_cast<std::uintptr_t>(dst_mem.data()) % 16) % 16;
        std::uint8_t* dst = base + 16 + off;
        std::vector<LaunchRecord> log;
        REQUIRE(dispatch_unpad_rows(SimLaunch{&log}, UnpadArgs{src, dst, rows, n, ld, es}) == 0);
        CHECK(log.size() == 1);
        bool same = true, guards = true;
        for (long long r = 0; r < rows; ++r)
          for (long long b = 0; b < n * es; ++b) same = same && dst[r * n * es + b] == src[r * ld * es + b];
        for (std::uint8_t* p = dst_mem.data(); p < dst; ++p) guards = guards && *p == 0xAB;
        for (std::uint8_t* p = dst + dst_bytes; p < dst_mem.data() + dst_mem.size(); ++p) guards = guards && *p == 0xAB;
        CHECK(same);
        CHECK(guards);
      }
    }
  }
  std::vector<std::uint8_t> mem(4096);
  std::uint8_t* aligned = mem.data() + (16 - reinterpret_cast<std::uintptr_t>(mem.data()) % 16) % 16;
  std::vector<LaunchRecord> log;
  CHECK(dispatch_unpad_rows(SimLaunch{&log}, UnpadArgs{aligned + 2, aligned, 2, 9, 16, 2}) == kLaunchInvalidValue);
  CHECK(dispatch_unpad_rows(SimLaunch{&log}, UnpadArgs{aligned, aligned, 2, 9, 12, 2}) == kLaunchInvalidValue);
  CHECK(dispatch_unpad_rows(SimLaunch{&log}, UnpadArgs{aligned, aligned, 2, 17, 16, 2}) == kLaunchInvalidValue);
  CHECK(dispatch_unpad_rows(SimLaunch{&log}, UnpadArgs{aligned, aligned + 1, 2, 9, 16, 2}) == kLaunchInvalidValue);
  CHECK(dispatch_unpad_rows(SimLaunch{&log}, UnpadArgs{aligned, aligned, 2, 9, 16, 3}) == kLaunchInvalidValue);
  CHECK(log.empty());
}

// cuDNN's masked attention (EngineOptions::cudnn_attention_masks): the mask
// as cuDNN's bias, rows padded to ld, plus the flags of rows that keep no
// key (internal.hpp AttnBiasArgs), then the zeros written to those rows of
// the output (AttnZeroRowsArgs). The expected bits and flags follow the
// rule stated in internal.hpp, computed here element by element.
TEST_CASE("attention bias and dead-row kernels on the host emulator: bool and additive masks, causal (no device)") {
  std::mt19937 rng(7);
  const std::uint16_t neg_inf = 0xff80;
  for (const int kind : {1, 2}) {
    for (const int causal : {0, 1}) {
      CAPTURE(kind);
      CAPTURE(causal);
      // bool: [B=2, 1, L=5, S=37] (Hb = 1); additive: [1, H=3, 1, S]
      // broadcast over L (Bb = 1), as HF's [B, 1, 1, S] padding masks are.
      const long long B = 2, H = 3, L = 5, S = 37, ld = 40;
      const long long Bb = kind == 1 ? B : 1, Hb = kind == 1 ? 1 : H;
      const long long m_s[4] = {kind == 1 ? L * S : 0, kind == 1 ? 0 : S, kind == 1 ? S : 0, 1};
      // Both masks' storage (the additive one reads its first H * S).
      const std::size_t mask_n = static_cast<std::size_t>(std::max(B * L * S, H * S));
      std::vector<std::uint8_t> bmask(mask_n);
      std::vector<std::uint16_t> amask(mask_n);
      std::bernoulli_distribution keep(0.3);
      for (std::size_t i = 0; i < mask_n; ++i) {
        bmask[i] = keep(rng) ? 1 : 0;
        const float f = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
        amask[i] = keep(rng) ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : neg_inf;
      }
      // finfo(bfloat16).min, HF's additive padding value: a key kept (a
      // finite value), written as -2^123; head 0's row entirely.
      const std::uint16_t lowest = 0xff7f, floor = 0xfd00;
      for (long long j = 0; j < S; ++j) amask[static_cast<std::size_t>(j)] = j % 5 == 4 ? neg_inf : lowest;
      // Rows that keep nothing: bool batch 1 row 2; additive head 2 (every
      // row); and, causal, a row keeping only keys after itself.
      for (long long j = 0; j < S; ++j) bmask[static_cast<std::size_t>((1 * L + 2) * S + j)] = 0;
      for (long long j = 0; j < S; ++j) amask[static_cast<std::size_t>(2 * S + j)] = neg_inf;
      for (long long j = 0; j < S; ++j) bmask[static_cast<std::size_t>((0 * L + 1) * S + j)] = j >= 3 ? 1 : 0;
      for (long long j = 0; j < S; ++j) amask[static_cast<std::size_t>(1 * S + j)] = j == 20 ? 0 : neg_inf;
      std::vector<std::uint16_t> bias(static_cast<std::size_t>(Bb * Hb * L * ld), 0x1234);
      std::vector<std::uint8_t> dead(static_cast<std::size_t>(Bb * Hb * L), 7);
      AttnBiasArgs a{};
      a.mask = kind == 1 ? static_cast<const void*>(bmask.data()) : static_cast<const void*>(amask.data());
      a.mask_kind = kind;
      a.Bb = Bb, a.Hb = Hb, a.L = L, a.S = S, a.ld = ld;
      std::copy(m_s, m_s + 4, a.m_s);
      a.causal = causal;
      a.bias = bias.data();
      a.dead = dead.data();
      std::vector<LaunchRecord> log;
      REQUIRE(dispatch_attention_bias(SimLaunch{&log}, a) == 0);
      CHECK(log.size() == 1);
      std::size_t bad_bits = 0, bad_pad = 0, bad_dead = 0, dead_rows = 0;
      for (long long b = 0; b < Bb; ++b)
        for (long long h = 0; h < Hb; ++h)
          for (long long l = 0; l < L; ++l) {
            const long long r = (b * Hb + h) * L + l;
            bool any = false;
            for (long long j = 0; j < S; ++j) {
              const auto mi = static_cast<std::size_t>(b * m_s[0] + h * m_s[1] + l * m_s[2] + j * m_s[3]);
              const bool kept = kind == 1 ? bmask[mi] != 0 : amask[mi] != neg_inf;
              const std::uint16_t want = kind == 1 ? (kept ? 0 : neg_inf) : (amask[mi] == lowest ? floor : amask[mi]);
              bad_bits += bias[static_cast<std::size_t>(r * ld + j)] != want;
              any = any || (kept && (!causal || j <= l));
            }
            for (long long j = S; j < ld; ++j) bad_pad += bias[static_cast<std::size_t>(r * ld + j)] != 0x1234;
            bad_dead += dead[static_cast<std::size_t>(r)] != (any ? 0 : 1);
            dead_rows += any ? 0 : 1;
          }
      CHECK(bad_bits == 0);
      CHECK(bad_pad == 0);
      CHECK(bad_dead == 0);
      CHECK(dead_rows >= (kind == 1 ? 1u : static_cast<std::size_t>(L)) + (causal ? 1u : 0u));
      if (kind == 2) CHECK(dead[0] == 0);  // finfo.min keeps its keys

      // The output [B, H, L, Dv] with heads inside rows (the flash layout):
      // dead rows (NaN here, as cuDNN leaves them) become zeros, the others
      // stay as they were.
      const long long Dv = 6;
      const long long o_s[3] = {L * H * Dv, Dv, H * Dv};
      std::vector<std::uint16_t> out(static_cast<std::size_t>(B * L * H * Dv));
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(i % 97) + 1.f));
      for (long long b = 0; b < B; ++b)
        for (long long h = 0; h < H; ++h)
          for (long long l = 0; l < L; ++l)
            if (dead[static_cast<std::size_t>(((kind == 1 ? b : 0) * Hb + (kind == 1 ? 0 : h)) * L + l)])
              out[static_cast<std::size_t>(b * o_s[0] + h * o_s[1] + l * o_s[2])] = 0x7fc0;  // NaN
      const std::vector<std::uint16_t> before = out;
      AttnZeroRowsArgs z{};
      z.out = out.data();
      z.B = B, z.H = H, z.L = L, z.Dv = Dv;
      std::copy(o_s, o_s + 3, z.o_s);
      z.dead = dead.data();
      z.Bb = Bb, z.Hb = Hb;
      REQUIRE(dispatch_attention_zero_rows(SimLaunch{&log}, z) == 0);
      std::size_t bad_out = 0, zeroed = 0;
      for (long long b = 0; b < B; ++b)
        for (long long h = 0; h < H; ++h)
          for (long long l = 0; l < L; ++l) {
            const bool d = dead[static_cast<std::size_t>(((kind == 1 ? b : 0) * Hb + (kind == 1 ? 0 : h)) * L + l)];
            for (long long e = 0; e < Dv; ++e) {
              const auto i = static_cast<std::size_t>(b * o_s[0] + h * o_s[1] + l * o_s[2] + e);
              bad_out += out[i] != (d ? 0 : before[i]);
            }
            zeroed += d ? 1 : 0;
          }
      CHECK(bad_out == 0);
      CHECK(zeroed > 0);
    }
  }
  AttnBiasArgs a{};
  a.mask_kind = 1, a.Bb = 1, a.Hb = 1, a.L = 2, a.S = 9, a.ld = 8;  // rows shorter than S
  std::vector<LaunchRecord> log;
  CHECK(dispatch_attention_bias(SimLaunch{&log}, a) == kLaunchInvalidValue);
  a.ld = 16, a.mask_kind = 0;  // no mask
  CHECK(dispatch_attention_bias(SimLaunch{&log}, a) == kLaunchInvalidValue);
  AttnZeroRowsArgs z{};
  z.B = 2, z.H = 3, z.L = 4, z.Dv = 8, z.Bb = 2, z.Hb = 2;  // flags neither per head nor broadcast
  CHECK(dispatch_attention_zero_rows(SimLaunch{&log}, z) == kLaunchInvalidValue);
  CHECK(log.empty());
}
