// The CPU reference interpreter: runs a validated Program op by op on dense
// row-major host tensors. It defines the numerics the GPU engine is compared
// with, so it follows PyTorch's formulas (aten/src/ATen/native/*):
//  - type promotion: c10 ResultTypeState (dimensioned tensors > zero-dim
//    tensors > Python scalars; a higher category — bool < integer < floating —
//    always wins; Python floats count as the default dtype float32);
//  - floating results are computed in double and rounded once to the result
//    dtype (bfloat16/float16 round-to-nearest-even), GEMMs/convolutions/
//    norms accumulate in double: within PyTorch's own float32 error; except
//    float32 linear/addmm/mm/bmm when built with OpenBLAS (SAFECKPT_BLAS):
//    cblas_sgemm, float32 accumulation like PyTorch's CPU GEMMs (the
//    convolution is a direct loop, not lowered to GEMM: unchanged);
//  - GELU exact (erf) or tanh (Activation.cpp), layer_norm with biased
//    variance and rsqrt(var + eps), eval batch_norm with running stats,
//    softmax subtracting the row max (a row of -inf gives NaN, as PyTorch),
//    scaled_dot_product_attention rows with no allowed key give 0 (the
//    2.11 decomposition's explicit fix-up, pt2-format.md §3.1);
//  - views are copies (validate() makes sure no in-place op can observe it);
//  - every index read from data (embedding) is bounds-checked.
// After each node its outputs are checked against the recorded tensor_meta.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <unordered_map>

#include "graph/internal.hpp"
#include "graph/view_strides.hpp"

#if defined(SAFECKPT_HAVE_BLAS)
#include <cblas.h>  // OpenBLAS (libopenblas-dev); SAFECKPT_BLAS in CMakeLists.txt
#endif

namespace safeckpt::graph {
namespace {

// ---------------------------------------------------------------- dtypes

bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16;
}
bool is_int(DType d) {
  return d == DType::kInt64 || d == DType::kInt32 || d == DType::kInt16 || d == DType::kInt8 || d == DType::kUInt8;
}
bool supported(DType d) {
  return is_float(d) || is_int(d) || d == DType::kBool;
}
int category(DType d) {
  return d == DType::kBool ? 0 : is_int(d) ? 1 : 2;
}

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7E00u);
  float a = std::fabs(f);
  if (a >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (a < std::ldexp(1.0f, -14)) {  // subnormal: round to multiple of 2^-24
    auto m = static_cast<std::uint32_t>(std::nearbyint(a * std::ldexp(1.0f, 24)));
    return static_cast<std::uint16_t>(sign | m);
  }
  int e;
  float m = std::frexp(a, &e);                                                // a = m * 2^e, m in [0.5, 1)
  auto mant = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(m, 11)));  // 11 bits incl. hidden
  if (mant == 2048) {
    mant = 1024;
    ++e;
  }
  std::uint32_t exp = static_cast<std::uint32_t>(e + 14);
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);
  return static_cast<std::uint16_t>(sign | (exp << 10) | (mant & 0x3FFu));
}
float bf16_to_float(std::uint16_t h) {
  std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
std::uint16_t float_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);  // round to nearest even (c10/util/BFloat16.h)
  return static_cast<std::uint16_t>(x >> 16);
}

double get_d(const HostTensor& t, std::uint64_t i) {
  const std::uint8_t* p = t.data->data();
  switch (t.dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case DType::kFloat16: {
      std::uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return half_to_float(v);
    }
    case DType::kBFloat16: {
      std::uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return bf16_to_float(v);
    }
    case DType::kInt64: {
      std::int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return static_cast<double>(v);
    }
    case DType::kInt32: {
      std::int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kInt16: {
      std::int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case DType::kInt8: return static_cast<std::int8_t>(p[i]);
    case DType::kUInt8: return p[i];
    case DType::kBool: return p[i] ? 1.0 : 0.0;
    default: return 0;
  }
}
std::int64_t get_i(const HostTensor& t, std::uint64_t i) {
  const std::uint8_t* p = t.data->data();
  switch (t.dtype) {
    case DType::kInt64: {
      std::int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case DType::kInt32: {
      std::int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kInt16: {
      std::int16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case DType::kInt8: return static_cast<std::int8_t>(p[i]);
    case DType::kUInt8: return p[i];
    case DType::kBool: return p[i] ? 1 : 0;
    default: {
      double d = get_d(t, i);
      if (!(d > -9.2e18 && d < 9.2e18)) return 0;
      return static_cast<std::int64_t>(d);
    }
  }
}
// Stores x into element i of an integer tensor (truncated as a C++ cast, as
// torch's integer conversions do); false for any other dtype. The one copy of
// the integer stores, for put_d and put_i.
bool put_int(HostTensor& t, std::uint64_t i, std::int64_t x) {
  std::uint8_t* p = t.data->data();
  switch (t.dtype) {
    case DType::kInt64: std::memcpy(p + 8 * i, &x, 8); return true;
    case DType::kInt32: {
      auto y = static_cast<std::int32_t>(x);
      std::memcpy(p + 4 * i, &y, 4);
      return true;
    }
    case DType::kInt16: {
      auto y = static_cast<std::int16_t>(x);
      std::memcpy(p + 2 * i, &y, 2);
      return true;
    }
    case DType::kInt8: p[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(x)); return true;
    case DType::kUInt8: p[i] = static_cast<std::uint8_t>(x); return true;
    default: return false;
  }
}
void put_d(HostTensor& t, std::uint64_t i, double v) {
  std::uint8_t* p = t.data->data();
  switch (t.dtype) {
    case DType::kFloat32: {
      auto f = static_cast<float>(v);
      std::memcpy(p + 4 * i, &f, 4);
      return;
    }
    case DType::kFloat64: std::memcpy(p + 8 * i, &v, 8); return;
    case DType::kFloat16: {
      auto h = float_to_half(static_cast<float>(v));
      std::memcpy(p + 2 * i, &h, 2);
      return;
    }
    case DType::kBFloat16: {
      auto h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p + 2 * i, &h, 2);
      return;
    }
    case DType::kBool: p[i] = v != 0.0; return;
    default: (void)put_int(t, i, (v > -9.2e18 && v < 9.2e18) ? static_cast<std::int64_t>(v) : 0); return;
  }
}
void put_i(HostTensor& t, std::uint64_t i, std::int64_t x) {
  if (put_int(t, i, x)) return;
  if (t.dtype == DType::kBool) {
    t.data->data()[i] = x != 0;
    return;
  }
  put_d(t, i, static_cast<double>(x));
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if (a == DType::kFloat64 || b == DType::kFloat64) return DType::kFloat64;
    return DType::kFloat32;  // f32 with f16/bf16, or f16 with bf16
  }
  auto rank = [](DType d) {
    switch (d) {
      case DType::kUInt8: return 0;
      case DType::kInt8: return 1;
      case DType::kInt16: return 2;
      case DType::kInt32: return 3;
      default: return 4;
    }
  };
  if ((a == DType::kUInt8 && b == DType::kInt8) || (a == DType::kInt8 && b == DType::kUInt8)) return DType::kInt16;
  return rank(a) > rank(b) ? a : b;
}

// c10 ResultTypeState: operands in three priority classes.
struct ResultType {
  std::optional<DType> dim, zero, wrapped;
  void tensor(const HostTensor& t) {
    auto& slot = t.shape.empty() ? zero : dim;
    slot = slot ? promote(*slot, t.dtype) : t.dtype;
  }
  void scalar(const Arg& a) {
    DType d = a.kind == Arg::Kind::kBool ? DType::kBool : a.kind == Arg::Kind::kFloat ? DType::kFloat32 : DType::kInt64;
    wrapped = wrapped ? promote(*wrapped, d) : d;
  }
  static std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
    if (higher && is_float(*higher)) return higher;
    if ((higher && *higher == DType::kBool) || (lower && is_float(*lower))) {
      if (!higher) return lower;
      if (!lower) return higher;
      return promote(*higher, *lower);
    }
    return higher ? higher : lower;
  }
  DType result() const {
    auto r = combine(dim, combine(zero, wrapped));
    return r ? *r : DType::kFloat32;
  }
};

// ---------------------------------------------------------------- context

struct Ctx {
  const Program& p;
  const GraphLimits& lim;
  std::vector<HostTensor> vals;
  std::vector<std::optional<std::int64_t>> syms;
  std::unordered_map<std::string, std::int64_t> symbols;
  std::uint64_t live = 0;
  const Node* node = nullptr;
  // Shape pass: kernels compute output dtypes and shapes (and every shape
  // check) but no values; tensors carry no bytes.
  bool meta = false;
  // PyTorch's strides of every value (elements), from the recorded
  // tensor_meta once checked (check_strides); the interpreter itself
  // computes on dense tensors.
  std::vector<std::vector<std::int64_t>> strides;
  // run_cpu: the multiply-adds (or window reads) the heavy kernels will do,
  // against GraphLimits::max_run_macs; its shape pass refuses before any
  // kernel runs. Not counted by check_shapes (validation of a program that
  // a GPU runs says nothing about CPU time).
  bool count_work = false;
  std::uint64_t work = 0;

  Unexpected fail(ErrorCode c, const std::string& what) const {
    return make_error(c, "node '" + node->name + "' (" + node->target + "): " + what);
  }
  Result<HostTensor> alloc(DType d, std::vector<std::int64_t> shape) {
    std::uint64_t n = 1;
    for (auto s : shape) {
      if (s < 0) return fail(ErrorCode::kMalformed, "negative size " + std::to_string(s));
      if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(s), &n) || n > lim.max_tensor_elements)
        return fail(ErrorCode::kLimitExceeded, "result has more elements than GraphLimits::max_tensor_elements (" +
                                                   std::to_string(lim.max_tensor_elements) + ")");
    }
    if (shape.size() > lim.max_rank) return fail(ErrorCode::kLimitExceeded, "rank above GraphLimits::max_rank");
    std::uint64_t bytes = n * dtype_size(d);
    if (bytes > lim.max_run_bytes - std::min(live, lim.max_run_bytes))
      return fail(ErrorCode::kLimitExceeded,
                  "live tensors would exceed GraphLimits::max_run_bytes (" + std::to_string(lim.max_run_bytes) + ")");
    live += bytes;
    HostTensor t;
    t.dtype = d;
    t.shape = std::move(shape);
    t.data = std::make_shared<std::vector<std::uint8_t>>(meta ? 0 : bytes);
    return t;
  }
  // Charges the product of `factors` (multiply-adds) to the run's work
  // budget; kLimitExceeded past GraphLimits::max_run_macs.
  Status charge(std::initializer_list<std::int64_t> factors, std::string_view what) {
    if (!count_work) return {};
    std::uint64_t n = 1;
    bool over = false;
    for (auto f : factors) over = over || f < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(f), &n);
    if (!over) over = __builtin_add_overflow(work, n, &n) || n > lim.max_run_macs;
    if (over)
      return fail(ErrorCode::kLimitExceeded, std::string(what) + ": the run would take more than " +
                                                 std::to_string(lim.max_run_macs) +
                                                 " multiply-adds (GraphLimits::max_run_macs)");
    work = n;
    return {};
  }
  // Double-precision scratch copies a kernel is about to make (n elements):
  // refused when they would not fit in what max_run_bytes leaves.
  Status scratch(std::uint64_t n) const {
    std::uint64_t left = lim.max_run_bytes - std::min(live, lim.max_run_bytes);
    if (n > left / sizeof(double))
      return fail(ErrorCode::kLimitExceeded,
                  "scratch space would exceed GraphLimits::max_run_bytes (" + std::to_string(lim.max_run_bytes) + ")");
    return {};
  }
  const Arg& arg(std::string_view name) const {
    const OpSchema* s = node->schema;
    for (std::size_t k = 0; k < s->args.size(); ++k)
      if (s->args[k].name == name) return node->args[k];
    static const Arg none;
    return none;
  }
  Result<const HostTensor*> tensor(std::string_view name) const {
    const Arg& a = arg(name);
    if (a.kind != Arg::Kind::kTensor)
      return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not a tensor");
    const HostTensor& t = vals[static_cast<std::size_t>(a.tensor)];
    if (!t.data) return fail(ErrorCode::kInternal, "argument '" + std::string(name) + "' has no value");
    return &t;
  }
  const HostTensor* opt_tensor(std::string_view name) const {
    const Arg& a = arg(name);
    if (a.kind != Arg::Kind::kTensor) return nullptr;
    return &vals[static_cast<std::size_t>(a.tensor)];
  }
  Result<std::int64_t> sym(const SymInt& s) const {
    if (!s.is_symbolic()) return s.value;
    const auto& v = syms[static_cast<std::size_t>(s.sym)];
    if (!v)
      return fail(ErrorCode::kMalformed,
                  "SymInt '" + p.sym_values[static_cast<std::size_t>(s.sym)].name + "' has no value yet");
    return *v;
  }
  Result<std::int64_t> integer(std::string_view name) const {
    const Arg& a = arg(name);
    if (a.ints.size() != 1) return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not an int");
    return sym(a.ints[0]);
  }
  Result<std::vector<std::int64_t>> ints(std::string_view name) const {
    const Arg& a = arg(name);
    std::vector<std::int64_t> out;
    for (const auto& s : a.ints) {
      SAFECKPT_TRY(std::int64_t v, sym(s));
      out.push_back(v);
    }
    return out;
  }
  double scalar(std::string_view name) const {
    const Arg& a = arg(name);
    if (a.kind == Arg::Kind::kFloat) return a.f;
    if (a.kind == Arg::Kind::kBool) return a.b ? 1 : 0;
    if (a.kind == Arg::Kind::kInt && !a.ints.empty() && !a.ints[0].is_symbolic())
      return static_cast<double>(a.ints[0].value);
    return 0;
  }
  Result<std::int64_t> dim(std::int64_t d, std::size_t rank) const {
    auto r = static_cast<std::int64_t>(rank == 0 ? 1 : rank);
    if (d < -r || d >= r)
      return fail(ErrorCode::kMalformed,
                  "dimension " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
    return d < 0 ? d + r : d;
  }
};

std::uint64_t numel_of(const std::vector<std::int64_t>& s) {
  std::uint64_t n = 1;
  for (auto x : s) n *= static_cast<std::uint64_t>(x);
  return n;
}
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

std::vector<double> to_double(const HostTensor& t) {
  std::uint64_t n = t.numel();
  std::vector<double> v(n);
  if (t.dtype == DType::kFloat32) {
    const auto* f = reinterpret_cast<const std::uint8_t*>(t.data->data());
    for (std::uint64_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, f + 4 * i, 4);
      v[i] = x;
    }
  } else {
    for (std::uint64_t i = 0; i < n; ++i) v[i] = get_d(t, i);
  }
  return v;
}
void from_double(HostTensor& t, const std::vector<double>& v) {
  for (std::uint64_t i = 0; i < v.size(); ++i) put_d(t, i, v[i]);
}

// Dense copy of a strided view of `src`: out[idx] = src[offset + sum idx*strides].
Result<HostTensor> gather_view(Ctx& c, const HostTensor& src, std::vector<std::int64_t> shape,
                               const std::vector<std::int64_t>& strides, std::int64_t offset) {
  SAFECKPT_TRY(HostTensor out, c.alloc(src.dtype, shape));
  if (c.meta) return out;
  std::uint64_t item = dtype_size(src.dtype), n = out.numel();
  std::vector<std::int64_t> idx(shape.size(), 0);
  std::int64_t off = offset;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::memcpy(out.data->data() + i * item, src.data->data() + static_cast<std::uint64_t>(off) * item, item);
    for (std::size_t d = idx.size(); d-- > 0;) {
      off += strides[d];
      if (++idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
  return out;
}

// Broadcast shape of several shapes (numpy rules).
Result<std::vector<std::int64_t>> broadcast_shape(Ctx& c, const std::vector<const std::vector<std::int64_t>*>& shapes) {
  std::size_t r = 0;
  for (auto* s : shapes) r = std::max(r, s->size());
  std::vector<std::int64_t> out(r, 1);
  for (auto* s : shapes) {
    for (std::size_t i = 0; i < s->size(); ++i) {
      std::size_t d = r - s->size() + i;
      std::int64_t v = (*s)[i];
      if (v == out[d] || v == 1) continue;
      if (out[d] == 1) {
        out[d] = v;
        continue;
      }
      return c.fail(ErrorCode::kMalformed, "shapes do not broadcast");
    }
  }
  return out;
}
std::vector<std::int64_t> broadcast_strides(const std::vector<std::int64_t>& in, const std::vector<std::int64_t>& out) {
  auto cs = contiguous_strides(in);
  std::vector<std::int64_t> st(out.size(), 0);
  for (std::size_t i = 0; i < in.size(); ++i) {
    std::size_t d = out.size() - in.size() + i;
    st[d] = in[i] == 1 ? 0 : cs[i];
  }
  return st;
}
// Calls fn(out_index, offsets...) over the broadcast iteration space.
template <std::size_t N, class F>
void broadcast_each(const std::vector<std::int64_t>& out, const std::array<std::vector<std::int64_t>, N>& strides,
                    F fn) {
  std::uint64_t n = numel_of(out);
  std::vector<std::int64_t> idx(out.size(), 0);
  std::array<std::int64_t, N> off{};
  for (std::uint64_t i = 0; i < n; ++i) {
    fn(i, off);
    for (std::size_t d = idx.size(); d-- > 0;) {
      for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (++idx[d] < out[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------- ops

using Outs = std::vector<HostTensor>;

Status binary(Ctx& c, Outs& outs, int op) {  // 0 add, 1 sub, 2 logical_and, 3 mul, 4 bitwise_and
  SAFECKPT_TRY(const HostTensor* a, c.tensor("self"));
  // `other` may be a Python number (validate allows it for these ops): a
  // 0-d wrapped number, promoted as PyTorch does (result_type with a scalar).
  const Arg& oa = c.arg("other");
  HostTensor wrapped;
  const bool number = oa.kind != Arg::Kind::kTensor;
  ResultType rt;
  rt.tensor(*a);
  if (number) {
    rt.scalar(oa);
    const DType wd = rt.result();
    SAFECKPT_TRY(wrapped, c.alloc(wd, {}));
    if (!c.meta) {
      if (is_float(wd)) {
        put_d(wrapped, 0, c.scalar("other"));
      } else if (oa.kind == Arg::Kind::kInt) {
        SAFECKPT_TRY(std::int64_t iv, c.integer("other"));
        put_i(wrapped, 0, iv);
      } else {
        put_i(wrapped, 0, c.scalar("other") != 0 ? 1 : 0);
      }
    }
  }
  const HostTensor* b = &wrapped;
  if (!number) {
    SAFECKPT_TRY(b, c.tensor("other"));
    rt.tensor(*b);
  }
  SAFECKPT_TRY(auto shape, broadcast_shape(c, {&a->shape, &b->shape}));
  DType d = op == 2 ? DType::kBool : rt.result();
  if (op == 1 && d == DType::kBool) return c.fail(ErrorCode::kMalformed, "subtraction of bool tensors");
  if (op == 4 && is_float(d)) return c.fail(ErrorCode::kMalformed, "bitwise_and of floating tensors");
  if (op >= 3) {
    // mul.Tensor (bool: logical and, integers wrap like PyTorch) and
    // bitwise_and.Tensor / __and__.Tensor (integers and bool).
    SAFECKPT_TRY(HostTensor out, c.alloc(d, shape));
    if (c.meta) {
      outs.push_back(std::move(out));
      return {};
    }
    std::array<std::vector<std::int64_t>, 2> st{broadcast_strides(a->shape, shape), broadcast_strides(b->shape, shape)};
    const bool fl = is_float(d);
    broadcast_each<2>(shape, st, [&](std::uint64_t i, const std::array<std::int64_t, 2>& o) {
      const auto ia = static_cast<std::uint64_t>(o[0]), ib = static_cast<std::uint64_t>(o[1]);
      if (fl) {
        put_d(out, i, get_d(*a, ia) * get_d(*b, ib));
      } else if (d == DType::kBool) {
        put_i(out, i, (get_i(*a, ia) != 0) && (get_i(*b, ib) != 0));
      } else {
        auto x = static_cast<std::uint64_t>(get_i(*a, ia)), y = static_cast<std::uint64_t>(get_i(*b, ib));
        put_i(out, i, static_cast<std::int64_t>(op == 3 ? x * y : (x & y)));
      }
    });
    outs.push_back(std::move(out));
    return {};
  }
  SAFECKPT_TRY(HostTensor out, c.alloc(d, shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  std::array<std::vector<std::int64_t>, 2> st{broadcast_strides(a->shape, shape), broadcast_strides(b->shape, shape)};
  double alpha = op == 2 ? 1 : c.scalar("alpha");
  if (op == 2) {
    broadcast_each<2>(shape, st, [&](std::uint64_t i, const std::array<std::int64_t, 2>& o) {
      put_i(out, i,
            (get_d(*a, static_cast<std::uint64_t>(o[0])) != 0) && (get_d(*b, static_cast<std::uint64_t>(o[1])) != 0));
    });
  } else if (is_float(d)) {
    broadcast_each<2>(shape, st, [&](std::uint64_t i, const std::array<std::int64_t, 2>& o) {
      double x = get_d(*a, static_cast<std::uint64_t>(o[0])), y = get_d(*b, static_cast<std::uint64_t>(o[1]));
      put_d(out, i, op == 0 ? x + alpha * y : x - alpha * y);
    });
  } else {
    if (!(alpha >= -9.2e18 && alpha <= 9.2e18)) return c.fail(ErrorCode::kMalformed, "alpha out of the int64 range");
    auto al = static_cast<std::int64_t>(alpha);
    broadcast_each<2>(shape, st, [&](std::uint64_t i, const std::array<std::int64_t, 2>& o) {
      // Two's complement wrap, as PyTorch's integer arithmetic.
      auto x = static_cast<std::uint64_t>(get_i(*a, static_cast<std::uint64_t>(o[0])));
      auto y = static_cast<std::uint64_t>(get_i(*b, static_cast<std::uint64_t>(o[1]))) * static_cast<std::uint64_t>(al);
      put_i(out, i, static_cast<std::int64_t>(op == 0 ? x + y : x - y));
    });
  }
  outs.push_back(std::move(out));
  return {};
}

Status unary(Ctx& c, Outs& outs, const std::string& op) {
  SAFECKPT_TRY(const HostTensor* a, c.tensor(c.node->schema->name == "aten::dropout" ? "input" : "self"));
  DType d = a->dtype;
  if (op == "logical_not" || op == "eq" || op == "le" || op == "ge") d = DType::kBool;
  if (op == "mul" || op == "pow") {
    ResultType rt;
    rt.tensor(*a);
    rt.scalar(c.arg(op == "pow" ? "exponent" : "other"));
    d = rt.result();
  }
  if (op == "to") {
    // _to_copy: dtype (None keeps it); device, pin_memory, non_blocking and
    // memory_format do not change values (the interpreter computes on host,
    // dense); a layout other than strided is refused.
    if (const Arg& dt = c.arg("dtype"); dt.kind == Arg::Kind::kScalarType) {
      if (!supported(dt.dtype)) return c.fail(ErrorCode::kUnsupported, "_to_copy to an unsupported dtype");
      d = dt.dtype;
    }
    if (const Arg& lay = c.arg("layout"); lay.kind == Arg::Kind::kLayout && lay.code != 7)
      return c.fail(ErrorCode::kUnsupported, "_to_copy to a layout other than strided");
  }
  const bool float_only =
      op == "gelu" || op == "rsqrt" || op == "silu" || op == "sigmoid" || op == "tanh" || (op == "pow" && !is_float(d));
  if (float_only && !is_float(d)) return c.fail(ErrorCode::kUnsupported, op + " of a non-floating tensor");
  SAFECKPT_TRY(HostTensor out, c.alloc(d, a->shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  std::uint64_t n = a->numel();
  std::string approx = op == "gelu" ? c.arg("approximate").s : "";
  const Arg& other = c.arg("other");
  double s = c.scalar("other");
  bool int_compare = !is_float(a->dtype) && other.kind != Arg::Kind::kFloat;
  // The integer scalar itself (a double round trip of INT64_MAX would not fit back).
  std::int64_t s_int = other.kind == Arg::Kind::kBool ? (other.b ? 1 : 0) : 0;
  if (other.kind == Arg::Kind::kInt && !other.ints.empty()) {
    SAFECKPT_TRY(s_int, c.sym(other.ints[0]));
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    if (op == "clone") {
      put_d(out, i, 0);  // replaced by memcpy below
      continue;
    }
    double x = get_d(*a, i);
    if (op == "relu") {
      if (is_float(d))
        put_d(out, i, x > 0 ? x : (std::isnan(x) ? x : 0.0));
      else
        put_i(out, i, std::max<std::int64_t>(get_i(*a, i), 0));
    } else if (op == "gelu") {
      constexpr double kSqrt2 = 1.4142135623730951, kBeta = 0.7978845608028654;  // sqrt(2), sqrt(2/pi)
      if (approx == "tanh")
        put_d(out, i, 0.5 * x * (1 + std::tanh(kBeta * (x + 0.044715 * x * x * x))));
      else
        put_d(out, i, 0.5 * x * (1 + std::erf(x / kSqrt2)));
    } else if (op == "logical_not") {
      put_i(out, i, x == 0);
    } else if (op == "neg") {
      if (is_float(d))
        put_d(out, i, -x);
      else
        put_i(out, i, static_cast<std::int64_t>(0 - static_cast<std::uint64_t>(get_i(*a, i))));
    } else if (op == "rsqrt") {
      put_d(out, i, 1.0 / std::sqrt(x));
    } else if (op == "silu") {
      put_d(out, i, x / (1.0 + std::exp(-x)));
    } else if (op == "sigmoid") {
      put_d(out, i, 1.0 / (1.0 + std::exp(-x)));
    } else if (op == "tanh") {
      put_d(out, i, std::tanh(x));
    } else if (op == "pow") {
      const double e = c.scalar("exponent");
      put_d(out, i, e == 2.0 ? x * x : std::pow(x, e));
    } else if (op == "to") {
      if (is_float(d))
        put_d(out, i, x);
      else if (d == DType::kBool)
        put_i(out, i, x != 0);
      else if (is_float(a->dtype))
        put_i(out, i, std::isfinite(x) && std::fabs(x) < 9.2e18 ? static_cast<std::int64_t>(x) : 0);
      else
        put_i(out, i, get_i(*a, i));
    } else if (op == "ge") {
      bool r = int_compare ? get_i(*a, i) >= s_int : x >= s;
      put_i(out, i, r);
    } else if (op == "eq" || op == "le") {
      bool r;
      if (int_compare) {
        std::int64_t xi = get_i(*a, i), si = s_int;
        r = op == "eq" ? xi == si : xi <= si;
      } else {
        r = op == "eq" ? x == s : x <= s;
      }
      put_i(out, i, r);
    } else if (op == "mul") {
      if (is_float(d))
        put_d(out, i, x * s);
      else
        put_i(out, i,
              static_cast<std::int64_t>(static_cast<std::uint64_t>(get_i(*a, i)) * static_cast<std::uint64_t>(s_int)));
    }
  }
  if (op == "clone" && !a->data->empty()) std::memcpy(out.data->data(), a->data->data(), a->data->size());
  outs.push_back(std::move(out));
  return {};
}

Status where(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* cond, c.tensor("condition"));
  SAFECKPT_TRY(const HostTensor* a, c.tensor("self"));
  SAFECKPT_TRY(const HostTensor* b, c.tensor("other"));
  SAFECKPT_TRY(auto shape, broadcast_shape(c, {&cond->shape, &a->shape, &b->shape}));
  ResultType rt;
  rt.tensor(*a);
  rt.tensor(*b);
  SAFECKPT_TRY(HostTensor out, c.alloc(rt.result(), shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  std::array<std::vector<std::int64_t>, 3> st{broadcast_strides(cond->shape, shape), broadcast_strides(a->shape, shape),
                                              broadcast_strides(b->shape, shape)};
  bool fl = is_float(out.dtype);
  broadcast_each<3>(shape, st, [&](std::uint64_t i, const std::array<std::int64_t, 3>& o) {
    bool pick = get_d(*cond, static_cast<std::uint64_t>(o[0])) != 0;
    const HostTensor& src = pick ? *a : *b;
    auto so = static_cast<std::uint64_t>(pick ? o[1] : o[2]);
    if (fl)
      put_d(out, i, get_d(src, so));
    else
      put_i(out, i, get_i(src, so));
  });
  outs.push_back(std::move(out));
  return {};
}

// C[M,N] = A[M,K] @ B[K,N] with strides (elements) for A and B; double accumulation.
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, std::int64_t a_rs, std::int64_t a_cs,
          const double* B, std::int64_t b_rs, std::int64_t b_cs, double* C) {
  for (std::int64_t i = 0; i < M; ++i) {
    double* crow = C + i * N;
    std::fill(crow, crow + N, 0.0);
    for (std::int64_t k = 0; k < K; ++k) {
      double av = A[i * a_rs + k * a_cs];
      const double* brow = B + k * b_rs;
      if (b_cs == 1) {
        for (std::int64_t j = 0; j < N; ++j) crow[j] += av * brow[j];
      } else {
        for (std::int64_t j = 0; j < N; ++j) crow[j] += av * brow[j * b_cs];
      }
    }
  }
}

Status matmul_ops(Ctx& c, Outs& outs, const std::string& op) {
  // linear(input[...,K], weight[N,K], bias[N]?); addmm(self, mat1[M,K], mat2[K,N]); mm; bmm.
  const HostTensor *x, *w;
  if (op == "linear") {
    SAFECKPT_TRY(x, c.tensor("input"));
    SAFECKPT_TRY(w, c.tensor("weight"));
  } else if (op == "addmm") {
    SAFECKPT_TRY(x, c.tensor("mat1"));
    SAFECKPT_TRY(w, c.tensor("mat2"));
  } else {
    SAFECKPT_TRY(x, c.tensor("self"));
    SAFECKPT_TRY(w, c.tensor("mat2"));
  }
  if (!is_float(x->dtype) || x->dtype != w->dtype)
    return c.fail(ErrorCode::kUnsupported, "matrix product needs two floating tensors of one dtype");
  std::vector<std::int64_t> shape;
  std::int64_t batch = 1, M, K, N;
  if (op == "linear") {
    if (x->shape.empty() || w->shape.size() != 2 || x->shape.back() != w->shape[1])
      return c.fail(ErrorCode::kMalformed, "linear: input and weight shapes do not match");
    K = w->shape[1];
    N = w->shape[0];
    M = static_cast<std::int64_t>(x->numel() / static_cast<std::uint64_t>(std::max<std::int64_t>(K, 1)));
    if (K == 0)
      M = static_cast<std::int64_t>(numel_of(std::vector<std::int64_t>(x->shape.begin(), x->shape.end() - 1)));
    shape.assign(x->shape.begin(), x->shape.end() - 1);
    shape.push_back(N);
  } else if (op == "bmm") {
    if (x->shape.size() != 3 || w->shape.size() != 3 || x->shape[0] != w->shape[0] || x->shape[2] != w->shape[1])
      return c.fail(ErrorCode::kMalformed, "bmm: shapes do not match");
    batch = x->shape[0];
    M = x->shape[1];
    K = x->shape[2];
    N = w->shape[2];
    shape = {batch, M, N};
  } else {
    if (x->shape.size() != 2 || w->shape.size() != 2 || x->shape[1] != w->shape[0])
      return c.fail(ErrorCode::kMalformed, op + ": shapes do not match");
    M = x->shape[0];
    K = x->shape[1];
    N = w->shape[1];
    shape = {M, N};
  }
  SAFECKPT_CHECK(c.charge({batch, M, N, K}, op));
  SAFECKPT_TRY(HostTensor out, c.alloc(x->dtype, shape));
  const HostTensor* bias = op == "linear" ? c.opt_tensor("bias") : op == "addmm" ? c.opt_tensor("self") : nullptr;
  double beta = op == "addmm" ? c.scalar("beta") : 1, alpha = op == "addmm" ? c.scalar("alpha") : 1;
  std::vector<std::int64_t> mn = {M, N};
  if (bias != nullptr) {
    SAFECKPT_TRY(auto bs, broadcast_shape(c, {&bias->shape, &mn}));
    if (bs != mn) return c.fail(ErrorCode::kMalformed, "bias does not broadcast to the product");
  }
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
#if defined(SAFECKPT_HAVE_BLAS)
  // float32 through cblas_sgemm: float32 accumulation, which is what
  // PyTorch's CPU GEMMs do (at::native::cpublas::gemm -> sgemm). The bias is
  // written into C first and sgemm computes alpha*A@B + beta*C, as
  // addmm_out_cpu does (linear with a bias is addmm with beta = alpha = 1);
  // beta = 0 ignores it. Sizes outside [1, INT_MAX] take the loop below.
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  if (x->dtype == DType::kFloat32 && M >= 1 && N >= 1 && K >= 1 && M <= kIntMax && N <= kIntMax && K <= kIntMax) {
    const auto* xf = reinterpret_cast<const float*>(x->data->data());
    const auto* wf = reinterpret_cast<const float*>(w->data->data());
    auto* cf = reinterpret_cast<float*>(out.data->data());
    float fbeta = 0;
    if (bias != nullptr) {
      auto st = broadcast_strides(bias->shape, mn);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j)
          cf[i * N + j] = static_cast<float>(get_d(*bias, static_cast<std::uint64_t>(i * st[0] + j * st[1])));
      for (std::int64_t b = 1; b < batch; ++b) std::memcpy(cf + b * M * N, cf, static_cast<std::size_t>(M * N) * 4);
      fbeta = static_cast<float>(beta);
    }
    const bool linear = op == "linear";
    const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
    for (std::int64_t b = 0; b < batch; ++b)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, linear ? CblasTrans : CblasNoTrans, m, n, k, static_cast<float>(alpha),
                  xf + b * M * K, k, linear ? wf : wf + b * K * N, linear ? k : n, fbeta, cf + b * M * N, n);
    outs.push_back(std::move(out));
    return {};
  }
#endif
  SAFECKPT_CHECK(c.scratch(x->numel() + w->numel() + static_cast<std::uint64_t>(batch * M * N)));
  auto xd = to_double(*x), wd = to_double(*w);
  std::vector<double> cd(static_cast<std::size_t>(batch * M * N));
  for (std::int64_t b = 0; b < batch; ++b) {
    if (op == "linear")
      gemm(M, N, K, xd.data(), K, 1, wd.data(), 1, K, cd.data());
    else
      gemm(M, N, K, xd.data() + b * M * K, K, 1, wd.data() + b * K * N, N, 1, cd.data() + b * M * N);
  }
  if (bias != nullptr) {
    auto st = broadcast_strides(bias->shape, mn);
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double bv = get_d(*bias, static_cast<std::uint64_t>(i * st[0] + j * st[1]));
        double& r = cd[static_cast<std::size_t>(i * N + j)];
        r = alpha * r + beta * bv;
      }
  } else if (alpha != 1) {
    for (auto& r : cd) r *= alpha;
  }
  from_double(out, cd);
  outs.push_back(std::move(out));
  return {};
}

Status conv2d(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("input"));
  SAFECKPT_TRY(const HostTensor* w, c.tensor("weight"));
  const HostTensor* bias = c.opt_tensor("bias");
  SAFECKPT_TRY(auto stride, c.ints("stride"));
  SAFECKPT_TRY(auto pad, c.ints("padding"));
  SAFECKPT_TRY(auto dil, c.ints("dilation"));
  SAFECKPT_TRY(std::int64_t groups, c.integer("groups"));
  auto two = [](std::vector<std::int64_t>& v) {
    if (v.size() == 1) v.push_back(v[0]);
  };
  two(stride);
  two(pad);
  two(dil);
  constexpr std::int64_t kBig = std::int64_t{1} << 31;  // keeps (H + 2*pad - dil*(K-1)) far from overflow
  for (const auto* v : {&stride, &pad, &dil})
    for (auto x0 : *v)
      if (x0 >= kBig || x0 <= -kBig)
        return c.fail(ErrorCode::kUnsupported, "convolution: stride/padding/dilation above 2^31");
  if (x->shape.size() != 4 || w->shape.size() != 4 || stride.size() != 2 || pad.size() != 2 || dil.size() != 2 ||
      groups < 1 || stride[0] < 1 || stride[1] < 1 || dil[0] < 1 || dil[1] < 1 || pad[0] < 0 || pad[1] < 0)
    return c.fail(ErrorCode::kUnsupported, "convolution: only 4-D input/weight with positive stride/dilation run");
  std::int64_t Nb = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  std::int64_t O = w->shape[0], Cg = w->shape[1], KH = w->shape[2], KW = w->shape[3];
  if (C % groups != 0 || O % groups != 0 || Cg != C / groups)
    return c.fail(ErrorCode::kMalformed, "convolution: channels do not match weight and groups");
  if (bias != nullptr && (bias->shape.size() != 1 || bias->shape[0] != O))
    return c.fail(ErrorCode::kMalformed, "convolution: bias shape");
  std::int64_t OH = (H + 2 * pad[0] - dil[0] * (KH - 1) - 1) / stride[0] + 1;
  std::int64_t OW = (W + 2 * pad[1] - dil[1] * (KW - 1) - 1) / stride[1] + 1;
  if (OH < 0 || OW < 0) return c.fail(ErrorCode::kMalformed, "convolution: kernel larger than the padded input");
  SAFECKPT_CHECK(c.charge({Nb, O, OH, OW, Cg, KH, KW}, "convolution"));
  SAFECKPT_TRY(HostTensor out, c.alloc(x->dtype, {Nb, O, OH, OW}));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  SAFECKPT_CHECK(c.scratch(x->numel() + w->numel() + out.numel()));
  auto xd = to_double(*x), wd = to_double(*w);
  std::vector<double> od(out.numel());
  std::int64_t Og = O / groups;
  for (std::int64_t n = 0; n < Nb; ++n)
    for (std::int64_t o = 0; o < O; ++o) {
      std::int64_t g = o / Og;
      double b0 = bias ? get_d(*bias, static_cast<std::uint64_t>(o)) : 0.0;
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0;
          for (std::int64_t ci = 0; ci < Cg; ++ci) {
            std::int64_t cin = g * Cg + ci;
            for (std::int64_t kh = 0; kh < KH; ++kh) {
              std::int64_t ih = oh * stride[0] - pad[0] + kh * dil[0];
              if (ih < 0 || ih >= H) continue;
              for (std::int64_t kw = 0; kw < KW; ++kw) {
                std::int64_t iw = ow * stride[1] - pad[1] + kw * dil[1];
                if (iw < 0 || iw >= W) continue;
                acc += xd[static_cast<std::size_t>(((n * C + cin) * H + ih) * W + iw)] *
                       wd[static_cast<std::size_t>(((o * Cg + ci) * KH + kh) * KW + kw)];
              }
            }
          }
          od[static_cast<std::size_t>(((n * O + o) * OH + oh) * OW + ow)] = acc + b0;
        }
    }
  from_double(out, od);
  outs.push_back(std::move(out));
  return {};
}

Status layer_norm(Ctx& c, Outs& outs, bool native) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("input"));
  SAFECKPT_TRY(auto ns, c.ints("normalized_shape"));
  const HostTensor* w = c.opt_tensor("weight");
  const HostTensor* b = c.opt_tensor("bias");
  double eps = c.arg("eps").f;
  if (!is_float(x->dtype) || ns.size() > x->shape.size() || ns.empty())
    return c.fail(ErrorCode::kMalformed, "layer_norm: normalized_shape does not fit the input");
  std::size_t axis = x->shape.size() - ns.size();
  for (std::size_t i = 0; i < ns.size(); ++i)
    if (x->shape[axis + i] != ns[i])
      return c.fail(ErrorCode::kMalformed, "layer_norm: normalized_shape does not match the input");
  std::uint64_t inner = numel_of(ns), outer = inner ? x->numel() / inner : 0;
  if ((w && w->numel() != inner) || (b && b->numel() != inner))
    return c.fail(ErrorCode::kMalformed, "layer_norm: weight/bias size");
  SAFECKPT_TRY(HostTensor y, c.alloc(x->dtype, x->shape));
  std::vector<std::int64_t> stat_shape(x->shape.begin(), x->shape.begin() + static_cast<std::ptrdiff_t>(axis));
  stat_shape.resize(x->shape.size(), 1);
  // native_layer_norm's mean/rstd are float32 for bf16/f16 inputs (acc type).
  DType sd = x->dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  HostTensor mean_t, rstd_t;
  if (native) {
    SAFECKPT_TRY(mean_t, c.alloc(sd, stat_shape));
    SAFECKPT_TRY(rstd_t, c.alloc(sd, stat_shape));
  }
  if (c.meta) {
    outs.push_back(std::move(y));
    if (native) {
      outs.push_back(std::move(mean_t));
      outs.push_back(std::move(rstd_t));
    }
    return {};
  }
  SAFECKPT_CHECK(c.scratch(2 * x->numel() + 2 * inner));
  auto xd = to_double(*x);
  std::vector<double> wd = w ? to_double(*w) : std::vector<double>(), bd = b ? to_double(*b) : std::vector<double>();
  std::vector<double> yd(xd.size());
  for (std::uint64_t r = 0; r < outer; ++r) {
    const double* row = xd.data() + r * inner;
    double mean = 0, var = 0;
    for (std::uint64_t i = 0; i < inner; ++i) mean += row[i];
    mean /= static_cast<double>(inner);
    for (std::uint64_t i = 0; i < inner; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= static_cast<double>(inner);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (std::uint64_t i = 0; i < inner; ++i) {
      double v = (row[i] - mean) * rstd;
      if (w) v *= wd[i];
      if (b) v += bd[i];
      yd[r * inner + i] = v;
    }
    if (native) {
      put_d(mean_t, r, mean);
      put_d(rstd_t, r, rstd);
    }
  }
  from_double(y, yd);
  outs.push_back(std::move(y));
  if (native) {
    outs.push_back(std::move(mean_t));
    outs.push_back(std::move(rstd_t));
  }
  return {};
}

Status batch_norm(Ctx& c, Outs& outs, bool native) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("input"));
  const HostTensor* w = c.opt_tensor("weight");
  const HostTensor* b = c.opt_tensor("bias");
  const HostTensor* rm = c.opt_tensor("running_mean");
  const HostTensor* rv = c.opt_tensor("running_var");
  double eps = c.arg("eps").f;
  if (!rm || !rv || x->shape.size() < 2 || !is_float(x->dtype))
    return c.fail(ErrorCode::kUnsupported, "batch_norm needs running statistics and an N,C,... floating input");
  std::int64_t C = x->shape[1];
  auto chk = [&](const HostTensor* t) { return !t || (t->shape.size() == 1 && t->shape[0] == C); };
  if (!chk(w) || !chk(b) || !chk(rm) || !chk(rv))
    return c.fail(ErrorCode::kMalformed, "batch_norm: per-channel tensors must have C elements");
  SAFECKPT_TRY(HostTensor y, c.alloc(x->dtype, x->shape));
  std::uint64_t inner = 1;
  for (std::size_t d = 2; d < x->shape.size(); ++d) inner *= static_cast<std::uint64_t>(x->shape[d]);
  std::uint64_t n = c.meta ? 0 : x->numel();  // the shape pass computes no values
  for (std::uint64_t i = 0; i < n; ++i) {
    auto ch = static_cast<std::uint64_t>((i / inner) % static_cast<std::uint64_t>(C));
    double v = (get_d(*x, i) - get_d(*rm, ch)) / std::sqrt(get_d(*rv, ch) + eps);
    if (w) v *= get_d(*w, ch);
    if (b) v += get_d(*b, ch);
    put_d(y, i, v);
  }
  outs.push_back(std::move(y));
  if (native) {  // save_mean / save_invstd are empty in inference (aten batch_norm_cpu)
    // Their dtype is the parameters' (aten/src/ATen/native/Normalization.cpp
    // batch_norm_cpu: `param_scalar_type`, the running stats' type): float32
    // for a float32 model or bf16 input with float32 statistics (mixed type),
    // bfloat16 for an all-bfloat16 one, as torch.export records them
    // (ResNet-50 exported in bfloat16; before, float32 was assumed and the
    // program was refused).
    DType sd = is_float(rm->dtype) ? rm->dtype : DType::kFloat32;
    SAFECKPT_TRY(HostTensor m, c.alloc(sd, {0}));
    SAFECKPT_TRY(HostTensor s, c.alloc(sd, {0}));
    outs.push_back(std::move(m));
    outs.push_back(std::move(s));
  }
  return {};
}

Status softmax(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
  SAFECKPT_TRY(std::int64_t d, c.dim(d0, x->shape.size()));
  if (!is_float(x->dtype)) return c.fail(ErrorCode::kUnsupported, "softmax of a non-floating tensor");
  DType od = c.arg("half_to_float").b ? DType::kFloat32 : x->dtype;
  SAFECKPT_TRY(HostTensor y, c.alloc(od, x->shape));
  if (c.meta) {
    outs.push_back(std::move(y));
    return {};
  }
  if (x->shape.empty()) {
    put_d(y, 0, 1.0);
    outs.push_back(std::move(y));
    return {};
  }
  auto du = static_cast<std::size_t>(d);
  std::uint64_t len = static_cast<std::uint64_t>(x->shape[du]), inner = 1;
  for (std::size_t k = du + 1; k < x->shape.size(); ++k) inner *= static_cast<std::uint64_t>(x->shape[k]);
  std::uint64_t outer = (len != 0 && inner != 0) ? x->numel() / (len * inner) : 0;
  SAFECKPT_CHECK(c.scratch(2 * x->numel()));
  auto xd = to_double(*x);
  std::vector<double> yd(xd.size());
  for (std::uint64_t o = 0; o < outer; ++o)
    for (std::uint64_t in = 0; in < inner; ++in) {
      std::uint64_t base = o * len * inner + in;
      double mx = -std::numeric_limits<double>::infinity();
      for (std::uint64_t k = 0; k < len; ++k) mx = std::max(mx, xd[base + k * inner]);
      double sum = 0;
      for (std::uint64_t k = 0; k < len; ++k) sum += (yd[base + k * inner] = std::exp(xd[base + k * inner] - mx));
      for (std::uint64_t k = 0; k < len; ++k) yd[base + k * inner] /= sum;
    }
  from_double(y, yd);
  outs.push_back(std::move(y));
  return {};
}

Status reduce(Ctx& c, Outs& outs, bool any) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  std::vector<std::int64_t> dims;
  if (any) {
    SAFECKPT_TRY(std::int64_t d, c.integer("dim"));
    dims.push_back(d);
  } else {
    if (c.arg("dim").kind != Arg::Kind::kNone) {
      SAFECKPT_TRY(dims, c.ints("dim"));
    }
    if (dims.empty())
      for (std::size_t k = 0; k < x->shape.size(); ++k) dims.push_back(static_cast<std::int64_t>(k));
    if (c.arg("dtype").kind != Arg::Kind::kNone) return c.fail(ErrorCode::kUnsupported, "mean with dtype=");
    if (!is_float(x->dtype)) return c.fail(ErrorCode::kUnsupported, "mean of a non-floating tensor");
  }
  bool keep = c.arg("keepdim").b;
  std::vector<char> red(x->shape.size(), 0);
  for (auto d0 : dims) {
    SAFECKPT_TRY(std::int64_t d, c.dim(d0, x->shape.size()));
    if (!x->shape.empty()) red[static_cast<std::size_t>(d)] = 1;
  }
  std::vector<std::int64_t> kshape, oshape;
  for (std::size_t k = 0; k < x->shape.size(); ++k) {
    kshape.push_back(red[k] ? 1 : x->shape[k]);
    if (!red[k] || keep) oshape.push_back(red[k] ? 1 : x->shape[k]);
  }
  SAFECKPT_TRY(HostTensor y,
               c.alloc(any ? (x->dtype == DType::kUInt8 ? DType::kUInt8 : DType::kBool) : x->dtype, oshape));
  if (c.meta) {
    outs.push_back(std::move(y));
    return {};
  }
  std::uint64_t on = numel_of(kshape);
  SAFECKPT_CHECK(c.scratch(2 * on));
  std::vector<double> acc(on, 0.0);
  std::vector<std::uint64_t> cnt(on, 0);
  auto ks = contiguous_strides(kshape);
  std::vector<std::int64_t> idx(x->shape.size(), 0);
  std::uint64_t n = x->numel();
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t o = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) o += static_cast<std::uint64_t>((red[k] ? 0 : idx[k]) * ks[k]);
    double v = get_d(*x, i);
    if (any)
      acc[o] = (acc[o] != 0 || v != 0) ? 1 : 0;
    else
      acc[o] += v;
    ++cnt[o];
    for (std::size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < x->shape[k]) break;
      idx[k] = 0;
    }
  }
  for (std::uint64_t o = 0; o < on; ++o) {
    if (any)
      put_i(y, o, acc[o] != 0);
    else
      put_d(y, o, cnt[o] ? acc[o] / static_cast<double>(cnt[o]) : std::numeric_limits<double>::quiet_NaN());
  }
  outs.push_back(std::move(y));
  return {};
}

Status adaptive_avg_pool2d(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  SAFECKPT_TRY(auto os, c.ints("output_size"));
  if (os.size() == 1) os.push_back(os[0]);
  if (x->shape.size() < 3 || x->shape.size() > 4 || os.size() != 2 || os[0] < 1 || os[1] < 1 || !is_float(x->dtype))
    return c.fail(ErrorCode::kUnsupported, "adaptive_avg_pool2d: 3-D/4-D floating input, output size >= 1");
  std::size_t r = x->shape.size();
  std::int64_t H = x->shape[r - 2], W = x->shape[r - 1];
  constexpr std::int64_t kBig = std::int64_t{1} << 31;  // (o + 1) * H stays below 2^62
  if (H >= kBig || W >= kBig || os[0] >= kBig || os[1] >= kBig)
    return c.fail(ErrorCode::kUnsupported, "adaptive_avg_pool2d: sizes above 2^31");
  std::vector<std::int64_t> shape(x->shape.begin(), x->shape.end() - 2);
  std::uint64_t planes = numel_of(shape);
  shape.push_back(os[0]);
  shape.push_back(os[1]);
  // Each output reads a window of at most ceil(H / OH) + 1 rows by
  // ceil(W / OW) + 1 columns.
  SAFECKPT_CHECK(c.charge(
      {static_cast<std::int64_t>(planes), os[0], os[1], (H + os[0] - 1) / os[0] + 1, (W + os[1] - 1) / os[1] + 1},
      "adaptive_avg_pool2d"));
  SAFECKPT_TRY(HostTensor y, c.alloc(x->dtype, shape));
  if (c.meta) {
    outs.push_back(std::move(y));
    return {};
  }
  // aten/src/ATen/native/AdaptiveAveragePooling.cpp start_index/end_index.
  for (std::uint64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t oh = 0; oh < os[0]; ++oh)
      for (std::int64_t ow = 0; ow < os[1]; ++ow) {
        std::int64_t h0 = oh * H / os[0], h1 = ((oh + 1) * H + os[0] - 1) / os[0];
        std::int64_t w0 = ow * W / os[1], w1 = ((ow + 1) * W + os[1] - 1) / os[1];
        double s = 0;
        for (std::int64_t h = h0; h < h1; ++h)
          for (std::int64_t w = w0; w < w1; ++w)
            s += get_d(*x, pl * static_cast<std::uint64_t>(H * W) + static_cast<std::uint64_t>(h * W + w));
        auto cntv = static_cast<double>((h1 - h0) * (w1 - w0));
        put_d(y,
              (pl * static_cast<std::uint64_t>(os[0]) + static_cast<std::uint64_t>(oh)) *
                      static_cast<std::uint64_t>(os[1]) +
                  static_cast<std::uint64_t>(ow),
              cntv > 0 ? s / cntv : std::numeric_limits<double>::quiet_NaN());
      }
  outs.push_back(std::move(y));
  return {};
}

Result<std::vector<std::int64_t>> eval_ints(const Ctx& c, const std::vector<SymInt>& v);

// scaled_dot_product_attention and its fused spellings in CUDA exports
// (_efficient_attention, _cudnn_attention, _flash_attention): one math
// (softmax(q k^T * scale + mask) v in double), output 0.
Status sdpa(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* q, c.tensor("query"));
  SAFECKPT_TRY(const HostTensor* k, c.tensor("key"));
  SAFECKPT_TRY(const HostTensor* v, c.tensor("value"));
  const std::string& op = c.node->schema->name;
  const bool efficient = op == "aten::_scaled_dot_product_efficient_attention";
  const bool cudnn = op == "aten::_scaled_dot_product_cudnn_attention";
  const bool flash = op == "aten::_scaled_dot_product_flash_attention";
  const HostTensor* mask = flash ? nullptr : c.opt_tensor(efficient || cudnn ? "attn_bias" : "attn_mask");
  bool causal = c.arg("is_causal").b;
  if ((efficient || cudnn || flash) && c.arg("dropout_p").f != 0.0)
    return c.fail(ErrorCode::kUnsupported, "attention dropout");
  if (c.arg("enable_gqa").b) return c.fail(ErrorCode::kUnsupported, "enable_gqa=True");
  std::size_t r = q->shape.size();
  if (r < 2 || k->shape.size() != r || v->shape.size() != r || !is_float(q->dtype) || k->dtype != q->dtype ||
      v->dtype != q->dtype)
    return c.fail(ErrorCode::kMalformed, "attention: query/key/value must have one rank and floating dtype");
  for (std::size_t d = 0; d + 2 < r; ++d)
    if (q->shape[d] != k->shape[d] || q->shape[d] != v->shape[d])
      return c.fail(ErrorCode::kUnsupported, "attention: batch dims differ");
  std::int64_t L = q->shape[r - 2], E = q->shape[r - 1], S = k->shape[r - 2], Ev = v->shape[r - 1];
  if (k->shape[r - 1] != E || v->shape[r - 2] != S) return c.fail(ErrorCode::kMalformed, "attention: key/value shapes");
  double scale = c.arg("scale").kind == Arg::Kind::kFloat ? c.arg("scale").f : 1.0 / std::sqrt(static_cast<double>(E));
  std::vector<std::int64_t> oshape(q->shape.begin(), q->shape.end() - 1);
  oshape.push_back(Ev);
  std::uint64_t B = numel_of(std::vector<std::int64_t>(q->shape.begin(), q->shape.end() - 2));
  SAFECKPT_CHECK(c.charge({static_cast<std::int64_t>(std::min<std::uint64_t>(B, std::uint64_t{1} << 62)), L, S, E + Ev},
                          "attention"));
  SAFECKPT_TRY(HostTensor out, c.alloc(q->dtype, oshape));
  std::vector<std::int64_t> ls(q->shape.begin(), q->shape.end() - 2);
  ls.push_back(L);
  ls.push_back(S);
  std::vector<std::int64_t> mst;
  if (mask != nullptr) {
    SAFECKPT_TRY(auto bs, broadcast_shape(c, {&mask->shape, &ls}));
    if (bs != ls) return c.fail(ErrorCode::kMalformed, "attention: attn_mask does not broadcast to [..., L, S]");
    mst = broadcast_strides(mask->shape, ls);
  }
  // _scaled_dot_product_efficient_attention also returns log_sumexp
  // ([..., H, 0] float32 unless compute_log_sumexp) and the philox seed and
  // offset (0-d int64; no dropout here): produced as zeros, never read.
  auto efficient_extras = [&]() -> Status {
    if (!efficient) return {};
    if (c.arg("compute_log_sumexp").b) return c.fail(ErrorCode::kUnsupported, "compute_log_sumexp=True");
    std::vector<std::int64_t> lse(q->shape.begin(), q->shape.end() - 2);
    lse.push_back(0);
    SAFECKPT_TRY(HostTensor l, c.alloc(DType::kFloat32, lse));
    SAFECKPT_TRY(HostTensor seed, c.alloc(DType::kInt64, {}));
    SAFECKPT_TRY(HostTensor off, c.alloc(DType::kInt64, {}));
    if (!c.meta) {
      put_i(seed, 0, 0);
      put_i(off, 0, 0);
    }
    outs.push_back(std::move(l));
    outs.push_back(std::move(seed));
    outs.push_back(std::move(off));
    return {};
  };
  // _cudnn_attention / _flash_attention: 9 outputs. max_q and max_k (the
  // SymInt positions, 4 and 5) are the query and key sequence lengths (what
  // PyTorch's meta kernels return), checked against the recorded value. The
  // tensor positions after 0 (logsumexp, cum_seq_q/k, philox or rng state,
  // debug mask; as_none where PyTorch returned an undefined tensor) are
  // zeros of their recorded tensor_meta: validate() refuses a program that
  // reads one, so they only satisfy the per-output meta and stride checks.
  auto fused_extras = [&]() -> Status {
    if (efficient) return efficient_extras();
    if (!cudnn && !flash) return {};
    const Node& n = *c.node;
    const std::int64_t seq[2] = {L, S};
    std::size_t si = 0;
    for (std::size_t pos = 1; pos < n.outputs.size(); ++pos) {
      const std::int32_t so = pos < n.output_syms.size() ? n.output_syms[pos] : -1;
      if (so >= 0) {
        if (si >= 2) return c.fail(ErrorCode::kInternal, "attention: more than two SymInt outputs");
        const std::int64_t val = seq[si++];
        const SymValue& sv = c.p.sym_values[static_cast<std::size_t>(so)];
        SAFECKPT_TRY(std::int64_t want, detail::eval_srepr(sv.expr, c.symbols, c.lim));
        if (want != val)
          return c.fail(ErrorCode::kMalformed, "SymInt output '" + sv.name + "' is " + std::to_string(val) +
                                                   " but its recorded value is " + std::to_string(want));
        c.syms[static_cast<std::size_t>(so)] = val;
        outs.emplace_back();
        continue;
      }
      const std::int32_t id = n.outputs[pos];
      if (id < 0) {
        outs.emplace_back();
        continue;
      }
      const TensorMeta& m = c.p.values[static_cast<std::size_t>(id)];
      SAFECKPT_TRY(std::vector<std::int64_t> sizes, eval_ints(c, m.sizes));
      SAFECKPT_TRY(HostTensor t, c.alloc(m.dtype, std::move(sizes)));
      outs.push_back(std::move(t));
    }
    return {};
  };
  if (c.meta) {
    outs.push_back(std::move(out));
    return fused_extras();
  }
  SAFECKPT_CHECK(c.scratch(q->numel() + k->numel() + v->numel() + out.numel() + static_cast<std::uint64_t>(S)));
  auto qd = to_double(*q), kd = to_double(*k), vd = to_double(*v);
  std::vector<double> od(out.numel()), sc(static_cast<std::size_t>(S));
  std::vector<std::int64_t> bidx(r - 2, 0);
  for (std::uint64_t b = 0; b < B; ++b) {
    std::int64_t moff_b = 0;
    for (std::size_t d = 0; d < bidx.size() && mask; ++d) moff_b += bidx[d] * mst[d];
    for (std::int64_t l = 0; l < L; ++l) {
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t s = 0; s < S; ++s) {
        double dot = 0;
        for (std::int64_t e = 0; e < E; ++e)
          dot += qd[static_cast<std::size_t>((static_cast<std::int64_t>(b) * L + l) * E + e)] *
                 kd[static_cast<std::size_t>((static_cast<std::int64_t>(b) * S + s) * E + e)];
        double val = dot * scale;
        if (causal && s > l) val = -std::numeric_limits<double>::infinity();
        if (mask) {
          double m = get_d(*mask, static_cast<std::uint64_t>(moff_b + l * mst[r - 2] + s * mst[r - 1]));
          if (mask->dtype == DType::kBool)
            val = m != 0 ? val : -std::numeric_limits<double>::infinity();
          else
            val += m;
        }
        sc[static_cast<std::size_t>(s)] = val;
        mx = std::max(mx, val);
      }
      double* orow = od.data() + (b * static_cast<std::uint64_t>(L) + static_cast<std::uint64_t>(l)) *
                                     static_cast<std::uint64_t>(Ev);
      if (mx == -std::numeric_limits<double>::infinity()) continue;  // no allowed key: row of zeros
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (std::int64_t s = 0; s < S; ++s) {
        double p = sc[static_cast<std::size_t>(s)] / sum;
        const double* vrow = vd.data() + (b * static_cast<std::uint64_t>(S) + static_cast<std::uint64_t>(s)) *
                                             static_cast<std::uint64_t>(Ev);
        for (std::int64_t e = 0; e < Ev; ++e) orow[e] += p * vrow[e];
      }
    }
    for (std::size_t d = bidx.size(); d-- > 0;) {
      if (++bidx[d] < q->shape[d]) break;
      bidx[d] = 0;
    }
  }
  from_double(out, od);
  outs.push_back(std::move(out));
  return fused_extras();
}

// cat(tensors, dim): one dtype (PyTorch would promote; refused here), one
// rank, equal sizes off `dim`. Legacy rule kept by PyTorch: 1-D empty
// tensors are skipped.
Status cat(Ctx& c, Outs& outs) {
  const Arg& list = c.arg("tensors");
  std::vector<const HostTensor*> ts;
  for (auto id : list.tensors) {
    if (id < 0) return c.fail(ErrorCode::kMalformed, "cat: a None in the tensor list");
    const HostTensor& t = c.vals[static_cast<std::size_t>(id)];
    if (!t.data) return c.fail(ErrorCode::kInternal, "cat: an input has no value");
    if (t.shape.size() == 1 && t.shape[0] == 0) continue;
    ts.push_back(&t);
  }
  if (ts.empty()) return c.fail(ErrorCode::kUnsupported, "cat of no non-empty tensors");
  const std::size_t r = ts[0]->shape.size();
  if (r == 0) return c.fail(ErrorCode::kMalformed, "cat: zero-dimensional tensor");
  SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
  SAFECKPT_TRY(std::int64_t dd, c.dim(d0, r));
  const auto dim = static_cast<std::size_t>(dd);
  std::vector<std::int64_t> shape = ts[0]->shape;
  shape[dim] = 0;
  for (const HostTensor* t : ts) {
    if (t->dtype != ts[0]->dtype) return c.fail(ErrorCode::kUnsupported, "cat of tensors of different dtypes");
    if (t->shape.size() != r) return c.fail(ErrorCode::kMalformed, "cat: tensors of different ranks");
    for (std::size_t d = 0; d < r; ++d)
      if (d != dim && t->shape[d] != ts[0]->shape[d])
        return c.fail(ErrorCode::kMalformed, "cat: sizes differ off the concatenated dim");
    if (__builtin_add_overflow(shape[dim], t->shape[dim], &shape[dim]))
      return c.fail(ErrorCode::kLimitExceeded, "cat: size overflows");
  }
  SAFECKPT_TRY(HostTensor out, c.alloc(ts[0]->dtype, shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  const std::uint64_t item = dtype_size(out.dtype);
  std::uint64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < dim; ++d) outer *= static_cast<std::uint64_t>(shape[d]);
  for (std::size_t d = dim + 1; d < r; ++d) inner *= static_cast<std::uint64_t>(shape[d]);
  std::uint64_t at = 0;
  const std::uint64_t out_row = static_cast<std::uint64_t>(shape[dim]) * inner * item;
  for (const HostTensor* t : ts) {
    const std::uint64_t row = static_cast<std::uint64_t>(t->shape[dim]) * inner * item;
    for (std::uint64_t o = 0; o < outer; ++o)
      std::memcpy(out.data->data() + o * out_row + at, t->data->data() + o * row, row);
    at += row;
  }
  outs.push_back(std::move(out));
  return {};
}

// slice.Tensor(self, dim, start?, end?, step): PyTorch's clamping
// (aten/src/ATen/native/TensorShape.cpp slice): negative start/end count
// from the end, both clamp to [0, size], end below start gives size 0;
// step must be positive.
Status slice(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  const std::size_t r = x->shape.size();
  if (r == 0) return c.fail(ErrorCode::kMalformed, "slice of a 0-d tensor");
  SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
  SAFECKPT_TRY(std::int64_t dd, c.dim(d0, r));
  const auto dim = static_cast<std::size_t>(dd);
  const std::int64_t size = x->shape[dim];
  std::int64_t start = 0, end = size;
  if (c.arg("start").kind == Arg::Kind::kInt) {
    SAFECKPT_TRY(start, c.integer("start"));
  }
  if (c.arg("end").kind == Arg::Kind::kInt) {
    SAFECKPT_TRY(end, c.integer("end"));
  }
  SAFECKPT_TRY(std::int64_t step, c.integer("step"));
  if (step <= 0) return c.fail(ErrorCode::kMalformed, "slice step must be positive");
  if (start < 0) start = start < -size ? 0 : start + size;
  if (end < 0) end = end < -size ? 0 : end + size;
  start = std::min(start, size);
  end = std::min(end, size);
  if (end < start) end = start;
  std::vector<std::int64_t> shape = x->shape;
  shape[dim] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for any step > 0
  auto st = contiguous_strides(x->shape);
  const std::int64_t offset = start * st[dim];
  st[dim] *= step;
  SAFECKPT_TRY(HostTensor out, gather_view(c, *x, shape, st, offset));
  outs.push_back(std::move(out));
  return {};
}

// gather(self, dim, index): out[i] = self[i with i[dim] = index[i]];
// index.size(d) <= self.size(d) off `dim`; every index in [0, size) (as
// PyTorch's gather checks), else kMalformed naming it.
Status gather(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  SAFECKPT_TRY(const HostTensor* idx, c.tensor("index"));
  const std::size_t r = x->shape.size();
  if (idx->shape.size() != r || r == 0)
    return c.fail(ErrorCode::kMalformed, "gather: index must have the rank of self (>= 1)");
  if (idx->dtype != DType::kInt64) return c.fail(ErrorCode::kMalformed, "gather: index must be int64");
  SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
  SAFECKPT_TRY(std::int64_t dd, c.dim(d0, r));
  const auto dim = static_cast<std::size_t>(dd);
  for (std::size_t d = 0; d < r; ++d)
    if (d != dim && idx->shape[d] > x->shape[d])
      return c.fail(ErrorCode::kMalformed, "gather: index is larger than self off dim");
  SAFECKPT_TRY(HostTensor out, c.alloc(x->dtype, idx->shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  const auto xs = contiguous_strides(x->shape);
  const std::uint64_t item = dtype_size(x->dtype), n = idx->numel();
  std::vector<std::int64_t> pos(r, 0);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::int64_t k = get_i(*idx, i);
    if (k < 0 || k >= x->shape[dim])
      return c.fail(ErrorCode::kMalformed, "gather: index " + std::to_string(k) + " at position " + std::to_string(i) +
                                               " is out of range for size " + std::to_string(x->shape[dim]));
    std::int64_t off = 0;
    for (std::size_t d = 0; d < r; ++d) off += (d == dim ? k : pos[d]) * xs[d];
    std::memcpy(out.data->data() + i * item, x->data->data() + static_cast<std::uint64_t>(off) * item, item);
    for (std::size_t d = r; d-- > 0;) {
      if (++pos[d] < idx->shape[d]) break;
      pos[d] = 0;
    }
  }
  outs.push_back(std::move(out));
  return {};
}

// index.Tensor(self, indices): advanced indexing with integer index tensors
// on the leading dims (no None, no bool masks: kUnsupported), broadcast
// together (PyTorch's rule); result = broadcast shape + self's remaining
// dims. Negative indices count from the end; anything outside [-size, size)
// is kMalformed naming it.
Status index_tensor(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  const Arg& list = c.arg("indices");
  std::vector<const HostTensor*> ix;
  for (auto id : list.tensors) {
    if (id < 0) return c.fail(ErrorCode::kUnsupported, "index.Tensor with None indices");
    const HostTensor& t = c.vals[static_cast<std::size_t>(id)];
    if (!t.data) return c.fail(ErrorCode::kInternal, "index.Tensor: an index has no value");
    if (t.dtype != DType::kInt64 && t.dtype != DType::kInt32)
      return c.fail(ErrorCode::kUnsupported, "index.Tensor with a non-integer (mask) index");
    ix.push_back(&t);
  }
  if (ix.empty() || ix.size() > x->shape.size())
    return c.fail(ErrorCode::kMalformed, "index.Tensor: too many or no indices");
  std::vector<const std::vector<std::int64_t>*> shapes;
  shapes.reserve(ix.size());
  for (const HostTensor* t : ix) shapes.push_back(&t->shape);
  SAFECKPT_TRY(std::vector<std::int64_t> bshape, broadcast_shape(c, shapes));
  std::vector<std::int64_t> shape = bshape;
  std::uint64_t block = 1;
  for (std::size_t d = ix.size(); d < x->shape.size(); ++d) {
    shape.push_back(x->shape[d]);
    block *= static_cast<std::uint64_t>(x->shape[d]);
  }
  SAFECKPT_TRY(HostTensor out, c.alloc(x->dtype, shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  const auto xs = contiguous_strides(x->shape);
  std::vector<std::vector<std::int64_t>> st;
  st.reserve(ix.size());
  for (const HostTensor* t : ix) st.push_back(broadcast_strides(t->shape, bshape));
  const std::uint64_t item = dtype_size(x->dtype), n = numel_of(bshape), bytes = block * item;
  std::vector<std::int64_t> pos(bshape.size(), 0);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (std::size_t k = 0; k < ix.size(); ++k) {
      std::int64_t at = 0;
      for (std::size_t d = 0; d < pos.size(); ++d) at += pos[d] * st[k][d];
      std::int64_t v = get_i(*ix[k], static_cast<std::uint64_t>(at));
      const std::int64_t size = x->shape[k];
      if (v < -size || v >= size)
        return c.fail(ErrorCode::kMalformed, "index.Tensor: index " + std::to_string(v) + " is out of range for dim " +
                                                 std::to_string(k) + " of size " + std::to_string(size));
      if (v < 0) v += size;
      off += v * xs[k];
    }
    std::memcpy(out.data->data() + i * bytes, x->data->data() + static_cast<std::uint64_t>(off) * item, bytes);
    for (std::size_t d = pos.size(); d-- > 0;) {
      if (++pos[d] < bshape[d]) break;
      pos[d] = 0;
    }
  }
  outs.push_back(std::move(out));
  return {};
}

// select.int(self, dim, index): index in [-size, size), else kMalformed.
Status select(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  const std::size_t r = x->shape.size();
  if (r == 0) return c.fail(ErrorCode::kMalformed, "select of a 0-d tensor");
  SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
  SAFECKPT_TRY(std::int64_t dd, c.dim(d0, r));
  const auto dim = static_cast<std::size_t>(dd);
  SAFECKPT_TRY(std::int64_t k, c.integer("index"));
  const std::int64_t size = x->shape[dim];
  if (k < -size || k >= size)
    return c.fail(ErrorCode::kMalformed,
                  "select: index " + std::to_string(k) + " is out of range for size " + std::to_string(size));
  if (k < 0) k += size;
  std::vector<std::int64_t> shape = x->shape, st = contiguous_strides(x->shape);
  const std::int64_t offset = k * st[dim];
  shape.erase(shape.begin() + dd);
  st.erase(st.begin() + dd);
  SAFECKPT_TRY(HostTensor out, gather_view(c, *x, shape, st, offset));
  outs.push_back(std::move(out));
  return {};
}

// _assert_tensor_metadata(a, size?, stride?, dtype?, device?, layout?): the
// assertion PyTorch runs, on what the interpreter knows (dtype, sizes,
// layout; strides are the recorded ones; device not modelled). No output.
Status assert_metadata(Ctx& c, Outs& outs) {
  (void)outs;
  SAFECKPT_TRY(const HostTensor* a, c.tensor("a"));
  if (const Arg& d = c.arg("dtype"); d.kind == Arg::Kind::kScalarType && d.dtype != a->dtype)
    return c.fail(ErrorCode::kMalformed, "_assert_tensor_metadata: tensor is " + std::string(dtype_name(a->dtype)) +
                                             ", expected " + std::string(dtype_name(d.dtype)));
  if (c.arg("size").kind != Arg::Kind::kNone) {
    SAFECKPT_TRY(auto sz, c.ints("size"));
    if (sz != a->shape) return c.fail(ErrorCode::kMalformed, "_assert_tensor_metadata: sizes differ");
  }
  if (const Arg& l = c.arg("layout"); l.kind == Arg::Kind::kLayout && l.code != 7)
    return c.fail(ErrorCode::kMalformed, "_assert_tensor_metadata: layout is strided");
  return {};
}

// new_ones(self, size, dtype?): ones of `size`, self's dtype by default.
Status new_ones(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  SAFECKPT_TRY(auto size, c.ints("size"));
  const Arg& dt = c.arg("dtype");
  const DType d = dt.kind == Arg::Kind::kScalarType ? dt.dtype : x->dtype;
  if (!supported(d)) return c.fail(ErrorCode::kUnsupported, "new_ones of an unsupported dtype");
  if (const Arg& l = c.arg("layout"); l.kind == Arg::Kind::kLayout && l.code != 7)
    return c.fail(ErrorCode::kUnsupported, "layout other than strided");
  SAFECKPT_TRY(HostTensor out, c.alloc(d, size));
  if (!c.meta)
    for (std::uint64_t i = 0; i < out.numel(); ++i) {
      if (is_float(d))
        put_d(out, i, 1.0);
      else
        put_i(out, i, 1);
    }
  outs.push_back(std::move(out));
  return {};
}

Status view_ops(Ctx& c, Outs& outs, const std::string& op) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  std::size_t r = x->shape.size();
  auto cs = contiguous_strides(x->shape);
  if (op == "view" || op == "flatten" || op == "reshape") {
    std::vector<std::int64_t> shape;
    if (op == "view" || op == "reshape") {
      SAFECKPT_TRY(shape, c.ints(op == "view" ? "size" : "shape"));
      std::int64_t infer = -1;
      std::uint64_t known = 1;
      for (std::size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
          if (infer >= 0) return c.fail(ErrorCode::kMalformed, "view: two -1 sizes");
          infer = static_cast<std::int64_t>(i);
        } else if (shape[i] < 0 || __builtin_mul_overflow(known, static_cast<std::uint64_t>(shape[i]), &known)) {
          return c.fail(ErrorCode::kMalformed, "view: bad size");
        }
      }
      if (infer >= 0) {
        if (known == 0) return c.fail(ErrorCode::kMalformed, "view: cannot infer -1 with a 0 size");
        shape[static_cast<std::size_t>(infer)] = static_cast<std::int64_t>(x->numel() / known);
      }
    } else {
      SAFECKPT_TRY(std::int64_t s0, c.integer("start_dim"));
      SAFECKPT_TRY(std::int64_t e0, c.integer("end_dim"));
      SAFECKPT_TRY(std::int64_t s, c.dim(s0, r));
      SAFECKPT_TRY(std::int64_t e, c.dim(e0, r));
      if (r == 0) {
        shape = {1};
      } else {
        if (s > e) return c.fail(ErrorCode::kMalformed, "flatten: start_dim after end_dim");
        for (std::int64_t i = 0; i < s; ++i) shape.push_back(x->shape[static_cast<std::size_t>(i)]);
        std::int64_t m = 1;
        for (std::int64_t i = s; i <= e; ++i) m *= x->shape[static_cast<std::size_t>(i)];
        shape.push_back(m);
        for (std::size_t i = static_cast<std::size_t>(e) + 1; i < r; ++i) shape.push_back(x->shape[i]);
      }
    }
    std::uint64_t n = 1;
    for (auto s : shape)
      if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(s), &n))
        return c.fail(ErrorCode::kMalformed, "view: size overflows");
    if (n != x->numel())
      return c.fail(ErrorCode::kMalformed,
                    "view: " + std::to_string(n) + " elements, input has " + std::to_string(x->numel()));
    SAFECKPT_TRY(HostTensor out, c.alloc(x->dtype, shape));
    if (!c.meta && !x->data->empty()) std::memcpy(out.data->data(), x->data->data(), x->data->size());
    outs.push_back(std::move(out));
    return {};
  }
  if (op == "permute" || op == "transpose") {
    std::vector<std::int64_t> perm;
    if (op == "permute") {
      SAFECKPT_TRY(perm, c.ints("dims"));
      if (perm.size() != r) return c.fail(ErrorCode::kMalformed, "permute: dims do not match the rank");
    } else {
      for (std::size_t i = 0; i < r; ++i) perm.push_back(static_cast<std::int64_t>(i));
      SAFECKPT_TRY(std::int64_t a0, c.integer("dim0"));
      SAFECKPT_TRY(std::int64_t b0, c.integer("dim1"));
      SAFECKPT_TRY(std::int64_t a, c.dim(a0, r));
      SAFECKPT_TRY(std::int64_t b, c.dim(b0, r));
      if (r > 0) std::swap(perm[static_cast<std::size_t>(a)], perm[static_cast<std::size_t>(b)]);
    }
    std::vector<char> seen(r, 0);
    std::vector<std::int64_t> shape, st;
    for (auto p0 : perm) {
      SAFECKPT_TRY(std::int64_t p, c.dim(p0, r));
      if (r == 0) break;
      if (seen[static_cast<std::size_t>(p)]++) return c.fail(ErrorCode::kMalformed, "permute: repeated dim");
      shape.push_back(x->shape[static_cast<std::size_t>(p)]);
      st.push_back(cs[static_cast<std::size_t>(p)]);
    }
    SAFECKPT_TRY(HostTensor out, gather_view(c, *x, shape, st, 0));
    outs.push_back(std::move(out));
    return {};
  }
  if (op == "unsqueeze") {
    SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
    SAFECKPT_TRY(std::int64_t d, c.dim(d0, r + 1));
    std::vector<std::int64_t> shape = x->shape;
    shape.insert(shape.begin() + d, 1);
    SAFECKPT_TRY(HostTensor out, c.alloc(x->dtype, shape));
    if (!c.meta && !x->data->empty()) std::memcpy(out.data->data(), x->data->data(), x->data->size());
    outs.push_back(std::move(out));
    return {};
  }
  if (op == "expand") {
    SAFECKPT_TRY(auto size, c.ints("size"));
    if (size.size() < r) return c.fail(ErrorCode::kMalformed, "expand: fewer sizes than dims");
    std::vector<std::int64_t> shape(size.size()), st(size.size(), 0);
    std::size_t lead = size.size() - r;
    for (std::size_t i = 0; i < size.size(); ++i) {
      if (i < lead) {
        if (size[i] < 0) return c.fail(ErrorCode::kMalformed, "expand: -1 in a new leading dim");
        shape[i] = size[i];
        continue;
      }
      std::int64_t in = x->shape[i - lead];
      std::int64_t want = size[i] == -1 ? in : size[i];
      if (want != in && in != 1)
        return c.fail(ErrorCode::kMalformed,
                      "expand: size " + std::to_string(want) + " for a dim of " + std::to_string(in));
      shape[i] = want;
      st[i] = in == 1 ? 0 : cs[i - lead];
    }
    SAFECKPT_TRY(HostTensor out, gather_view(c, *x, shape, st, 0));
    outs.push_back(std::move(out));
    return {};
  }
  // split / split_with_sizes
  SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
  SAFECKPT_TRY(std::int64_t d, c.dim(d0, r));
  if (r == 0) return c.fail(ErrorCode::kMalformed, "split of a 0-d tensor");
  auto du = static_cast<std::size_t>(d);
  std::int64_t len = x->shape[du];
  std::vector<std::int64_t> sizes;
  if (op == "split") {
    SAFECKPT_TRY(std::int64_t ss, c.integer("split_size"));
    if (ss < 0 || (ss == 0 && len != 0)) return c.fail(ErrorCode::kMalformed, "split: bad split_size");
    for (std::int64_t at = 0; at < len || sizes.empty(); at += std::max<std::int64_t>(ss, 1)) {
      sizes.push_back(std::min(ss, len - at));
      if (static_cast<std::uint64_t>(sizes.size()) > c.lim.max_list_items)
        return c.fail(ErrorCode::kLimitExceeded, "split: too many pieces");
      if (ss == 0) break;
    }
  } else {
    SAFECKPT_TRY(sizes, c.ints("split_sizes"));
    std::int64_t sum = 0;
    for (auto s : sizes) {
      if (s < 0 || __builtin_add_overflow(sum, s, &sum))
        return c.fail(ErrorCode::kMalformed, "split_with_sizes: bad size");
    }
    if (sum != len) return c.fail(ErrorCode::kMalformed, "split_with_sizes: sizes do not add up to the dim");
  }
  std::int64_t at = 0;
  for (auto s : sizes) {
    std::vector<std::int64_t> shape = x->shape;
    shape[du] = s;
    SAFECKPT_TRY(HostTensor out, gather_view(c, *x, shape, cs, at * cs[du]));
    outs.push_back(std::move(out));
    at += s;
  }
  return {};
}

Status creation(Ctx& c, Outs& outs, const std::string& op) {
  const Arg& dt = c.arg("dtype");
  auto kind_dtype = [](const Arg& a) {
    return a.kind == Arg::Kind::kBool ? DType::kBool : a.kind == Arg::Kind::kFloat ? DType::kFloat32 : DType::kInt64;
  };
  for (const char* name : {"layout"}) {
    const Arg& l = c.arg(name);
    if (l.kind == Arg::Kind::kLayout && l.code != 7)
      return c.fail(ErrorCode::kUnsupported, "layout other than strided");
  }
  if (op == "arange") {
    const Arg& s = c.arg("start");
    const Arg& e = c.arg("end");
    const Arg& st = c.arg("step");
    bool fl = s.kind == Arg::Kind::kFloat || e.kind == Arg::Kind::kFloat || st.kind == Arg::Kind::kFloat;
    DType d = dt.kind == Arg::Kind::kScalarType ? dt.dtype : fl ? DType::kFloat32 : DType::kInt64;
    double start = c.scalar("start"), end = c.scalar("end"), step = st.kind == Arg::Kind::kNone ? 1 : c.scalar("step");
    std::int64_t is = 0, ie = 0, ist = 1;
    if (!fl) {
      if (s.kind != Arg::Kind::kNone) {  // aten::arange(end) has no start
        SAFECKPT_TRY(is, c.integer("start"));
      }
      SAFECKPT_TRY(ie, c.integer("end"));
      if (st.kind != Arg::Kind::kNone) {
        SAFECKPT_TRY(ist, c.integer("step"));
      }
      start = static_cast<double>(is);
      end = static_cast<double>(ie);
      step = static_cast<double>(ist);
    }
    if (step == 0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step) || (end - start) / step < 0)
      return c.fail(ErrorCode::kMalformed, "arange: bad start/end/step");
    double nd = std::ceil((end - start) / step);
    if (nd > static_cast<double>(c.lim.max_tensor_elements))
      return c.fail(ErrorCode::kLimitExceeded, "arange: more elements than GraphLimits::max_tensor_elements");
    auto n = static_cast<std::int64_t>(nd);
    SAFECKPT_TRY(HostTensor out, c.alloc(d, {n}));
    if (c.meta) {
      outs.push_back(std::move(out));
      return {};
    }
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t v = 0;
      if (!fl && (__builtin_mul_overflow(i, ist, &v) || __builtin_add_overflow(is, v, &v)))
        return c.fail(ErrorCode::kMalformed, "arange: value overflows int64");
      if (!fl)
        put_i(out, static_cast<std::uint64_t>(i), v);
      else
        put_d(out, static_cast<std::uint64_t>(i), start + static_cast<double>(i) * step);
    }
    outs.push_back(std::move(out));
    return {};
  }
  std::vector<std::int64_t> shape;
  const Arg* fill = nullptr;
  DType d = DType::kFloat32;
  if (op == "full") {
    SAFECKPT_TRY(shape, c.ints("size"));
    fill = &c.arg("fill_value");
    d = dt.kind == Arg::Kind::kScalarType ? dt.dtype : kind_dtype(*fill);
  } else if (op == "full_like") {
    SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
    shape = x->shape;
    fill = &c.arg("fill_value");
    d = dt.kind == Arg::Kind::kScalarType ? dt.dtype : x->dtype;
  } else {  // scalar_tensor
    fill = &c.arg("s");
    d = dt.kind == Arg::Kind::kScalarType ? dt.dtype : DType::kFloat32;
  }
  if (!supported(d)) return c.fail(ErrorCode::kUnsupported, "dtype " + std::string(dtype_name(d)));
  SAFECKPT_TRY(HostTensor out, c.alloc(d, shape));
  std::uint64_t n = c.meta ? 0 : out.numel();
  for (std::uint64_t i = 0; i < n; ++i) {
    if (fill->kind == Arg::Kind::kInt && !is_float(d)) {
      SAFECKPT_TRY(std::int64_t v, c.sym(fill->ints[0]));
      put_i(out, i, v);
    } else {
      std::int64_t iv = 0;
      if (fill->kind == Arg::Kind::kInt && !fill->ints.empty()) {
        SAFECKPT_TRY(iv, c.sym(fill->ints[0]));
      }
      put_d(out, i,
            fill->kind == Arg::Kind::kFloat  ? fill->f
            : fill->kind == Arg::Kind::kBool ? (fill->b ? 1 : 0)
                                             : static_cast<double>(iv));
    }
  }
  outs.push_back(std::move(out));
  return {};
}

Status embedding(Ctx& c, Outs& outs) {
  SAFECKPT_TRY(const HostTensor* w, c.tensor("weight"));
  SAFECKPT_TRY(const HostTensor* idx, c.tensor("indices"));
  if (w->shape.size() != 2) return c.fail(ErrorCode::kMalformed, "embedding: weight must be 2-D");
  if (idx->dtype != DType::kInt64 && idx->dtype != DType::kInt32)
    return c.fail(ErrorCode::kMalformed, "embedding: indices must be int64 or int32");
  std::int64_t V = w->shape[0], D = w->shape[1];
  std::vector<std::int64_t> shape = idx->shape;
  shape.push_back(D);
  SAFECKPT_TRY(HostTensor out, c.alloc(w->dtype, shape));
  if (c.meta) {
    outs.push_back(std::move(out));
    return {};
  }
  std::uint64_t n = idx->numel(), row = static_cast<std::uint64_t>(D) * dtype_size(w->dtype);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::int64_t k = get_i(*idx, i);
    if (k < 0 || k >= V)
      return c.fail(ErrorCode::kMalformed, "embedding: index " + std::to_string(k) + " at position " +
                                               std::to_string(i) + " is out of range for a table of " +
                                               std::to_string(V) + " rows");
    std::memcpy(out.data->data() + i * row, w->data->data() + static_cast<std::uint64_t>(k) * row, row);
  }
  outs.push_back(std::move(out));
  return {};
}

// max_pool2d / max_pool2d_with_indices (aten/src/ATen/native/Pool.h
// pooling_output_shape and pool2d_shape_check; cpu/MaxPoolKernel.cpp
// cpu_max_pool): the maximum starts at -inf and `val > max || isnan(val)`
// replaces it (the first maximum wins ties, a NaN wins); padded taps are
// skipped; the index is h * W + w in the input plane, the first tap inside
// the input when nothing replaced the start.
Status max_pool2d(Ctx& c, Outs& outs, bool with_indices) {
  SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
  SAFECKPT_TRY(auto ks, c.ints("kernel_size"));
  SAFECKPT_TRY(auto st, c.ints("stride"));
  SAFECKPT_TRY(auto pd, c.ints("padding"));
  SAFECKPT_TRY(auto dl, c.ints("dilation"));
  const bool ceil_mode = c.arg("ceil_mode").b;
  if (st.empty()) st = ks;
  for (auto* v : {&ks, &st, &pd, &dl})
    if (v->size() == 1) v->push_back((*v)[0]);
  constexpr std::int64_t kBig = std::int64_t{1} << 31;  // keeps the size formula far from overflow
  bool ok = (x->shape.size() == 3 || x->shape.size() == 4) && is_float(x->dtype) && ks.size() == 2 && st.size() == 2 &&
            pd.size() == 2 && dl.size() == 2;
  for (const auto* v : {&ks, &st, &dl})
    for (auto d : *v) ok = ok && d >= 1 && d < kBig;
  for (std::size_t i = 0; ok && i < 2; ++i) ok = pd[i] >= 0 && pd[i] <= ks[i] / 2;
  if (!ok)
    return c.fail(ErrorCode::kUnsupported,
                  "max_pool2d: 3-D/4-D floating input, positive kernel/stride/dilation, padding at most half the "
                  "kernel");
  const std::size_t r = x->shape.size();
  const std::int64_t H = x->shape[r - 2], W = x->shape[r - 1];
  if (H >= kBig || W >= kBig) return c.fail(ErrorCode::kUnsupported, "max_pool2d: sizes above 2^31");
  auto out_size = [&](std::int64_t in, std::size_t i) {
    std::int64_t num = in + 2 * pd[i] - dl[i] * (ks[i] - 1) - 1 + (ceil_mode ? st[i] - 1 : 0);
    std::int64_t o = (num >= 0 ? num / st[i] : -((-num + st[i] - 1) / st[i])) + 1;  // div_rtn
    if (ceil_mode && (o - 1) * st[i] >= in + pd[i]) --o;
    return o;
  };
  const std::int64_t OH = out_size(H, 0), OW = out_size(W, 1);
  if (OH < 1 || OW < 1) return c.fail(ErrorCode::kMalformed, "max_pool2d: output size is too small");
  std::vector<std::int64_t> shape(x->shape.begin(), x->shape.end() - 2);
  const std::uint64_t planes = numel_of(shape);
  shape.push_back(OH);
  shape.push_back(OW);
  SAFECKPT_CHECK(c.charge({static_cast<std::int64_t>(planes), OH, OW, ks[0], ks[1]}, "max_pool2d"));
  SAFECKPT_TRY(HostTensor y, c.alloc(x->dtype, shape));
  HostTensor idx;
  if (with_indices) {
    SAFECKPT_TRY(idx, c.alloc(DType::kInt64, shape));
  }
  if (!c.meta) {
    std::uint64_t o = 0;
    for (std::uint64_t pl = 0; pl < planes; ++pl)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow, ++o) {
          std::int64_t h0 = oh * st[0] - pd[0], w0 = ow * st[1] - pd[1];
          std::int64_t h1 = std::min(h0 + (ks[0] - 1) * dl[0] + 1, H), w1 = std::min(w0 + (ks[1] - 1) * dl[1] + 1, W);
          while (h0 < 0) h0 += dl[0];
          while (w0 < 0) w0 += dl[1];
          std::int64_t best = h0 * W + w0;
          double m = -std::numeric_limits<double>::infinity();
          for (std::int64_t h = h0; h < h1; h += dl[0])
            for (std::int64_t w = w0; w < w1; w += dl[1]) {
              double v = get_d(*x, pl * static_cast<std::uint64_t>(H * W) + static_cast<std::uint64_t>(h * W + w));
              if (v > m || std::isnan(v)) {
                m = v;
                best = h * W + w;
              }
            }
          put_d(y, o, m);
          if (with_indices) put_i(idx, o, best);
        }
  }
  outs.push_back(std::move(y));
  if (with_indices) outs.push_back(std::move(idx));
  return {};
}

Status run_node(Ctx& c, Outs& outs) {
  const std::string& op = c.node->schema->name;
  if (op == "aten::linear") return matmul_ops(c, outs, "linear");
  if (op == "aten::addmm") return matmul_ops(c, outs, "addmm");
  if (op == "aten::mm") return matmul_ops(c, outs, "mm");
  if (op == "aten::bmm") return matmul_ops(c, outs, "bmm");
  if (op == "aten::conv2d" || op == "aten::convolution") return conv2d(c, outs);
  if (op == "aten::layer_norm") return layer_norm(c, outs, false);
  if (op == "aten::native_layer_norm") return layer_norm(c, outs, true);
  if (op == "aten::batch_norm") return batch_norm(c, outs, false);
  if (op == "aten::_native_batch_norm_legit_no_training") return batch_norm(c, outs, true);
  if (op == "aten::scaled_dot_product_attention") return sdpa(c, outs);
  if (op == "aten::add.Tensor" || op == "aten::add_.Tensor") return binary(c, outs, 0);
  if (op == "aten::sub.Tensor") return binary(c, outs, 1);
  if (op == "aten::logical_and") return binary(c, outs, 2);
  if (op == "aten::mul.Scalar") return unary(c, outs, "mul");
  if (op == "aten::relu" || op == "aten::relu_") return unary(c, outs, "relu");
  if (op == "aten::gelu") return unary(c, outs, "gelu");
  if (op == "aten::mul.Tensor") return binary(c, outs, 3);
  if (op == "aten::bitwise_and.Tensor" || op == "aten::__and__.Tensor") return binary(c, outs, 4);
  if (op == "aten::neg") return unary(c, outs, "neg");
  if (op == "aten::rsqrt") return unary(c, outs, "rsqrt");
  if (op == "aten::silu") return unary(c, outs, "silu");
  if (op == "aten::sigmoid") return unary(c, outs, "sigmoid");
  if (op == "aten::tanh") return unary(c, outs, "tanh");
  if (op == "aten::pow.Tensor_Scalar") return unary(c, outs, "pow");
  if (op == "aten::ge.Scalar") return unary(c, outs, "ge");
  if (op == "aten::_to_copy") return unary(c, outs, "to");
  if (op == "aten::cat") return cat(c, outs);
  if (op == "aten::gather") return gather(c, outs);
  if (op == "aten::index.Tensor") return index_tensor(c, outs);
  if (op == "aten::select.int") return select(c, outs);
  if (op == "aten::_assert_tensor_metadata") return assert_metadata(c, outs);
  if (op == "aten::new_ones") return new_ones(c, outs);
  if (op == "aten::arange") return creation(c, outs, "arange");
  if (op == "aten::dropout") return unary(c, outs, "clone");  // train=False (validate): identity
  if (op == "aten::to.device" || op == "aten::to.dtype_layout") return unary(c, outs, "to");
  if (op == "aten::slice.Tensor") return slice(c, outs);
  if (op == "aten::reshape") return view_ops(c, outs, "reshape");
  if (op == "aten::_scaled_dot_product_efficient_attention" || op == "aten::_scaled_dot_product_cudnn_attention" ||
      op == "aten::_scaled_dot_product_flash_attention")
    return sdpa(c, outs);
  if (op == "aten::eq.Scalar") return unary(c, outs, "eq");
  if (op == "aten::le.Scalar") return unary(c, outs, "le");
  if (op == "aten::logical_not") return unary(c, outs, "logical_not");
  if (op == "aten::clone") return unary(c, outs, "clone");
  if (op == "aten::where.self") return where(c, outs);
  if (op == "aten::_softmax") return softmax(c, outs);
  if (op == "aten::any.dim") return reduce(c, outs, true);
  if (op == "aten::mean.dim") return reduce(c, outs, false);
  if (op == "aten::adaptive_avg_pool2d") return adaptive_avg_pool2d(c, outs);
  if (op == "aten::max_pool2d") return max_pool2d(c, outs, false);
  if (op == "aten::max_pool2d_with_indices") return max_pool2d(c, outs, true);
  if (op == "aten::view") return view_ops(c, outs, "view");
  if (op == "aten::flatten.using_ints") return view_ops(c, outs, "flatten");
  if (op == "aten::permute") return view_ops(c, outs, "permute");
  if (op == "aten::transpose.int") return view_ops(c, outs, "transpose");
  if (op == "aten::unsqueeze") return view_ops(c, outs, "unsqueeze");
  if (op == "aten::expand") return view_ops(c, outs, "expand");
  if (op == "aten::split.Tensor") return view_ops(c, outs, "split");
  if (op == "aten::split_with_sizes") return view_ops(c, outs, "split_with_sizes");
  if (op == "aten::arange.start" || op == "aten::arange.start_step") return creation(c, outs, "arange");
  if (op == "aten::full") return creation(c, outs, "full");
  if (op == "aten::full_like") return creation(c, outs, "full_like");
  if (op == "aten::scalar_tensor") return creation(c, outs, "scalar_tensor");
  if (op == "aten::embedding") return embedding(c, outs);
  return c.fail(ErrorCode::kUnsupported, "op '" + op + "' is allowlisted but the CPU interpreter has no kernel for it");
}

Status run_sym(Ctx& c) {
  const std::string& op = c.node->schema->name;
  std::int64_t v = 0;
  if (op == "aten::sym_size.int") {
    SAFECKPT_TRY(const HostTensor* x, c.tensor("self"));
    SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
    if (x->shape.empty()) return c.fail(ErrorCode::kMalformed, "sym_size of a 0-d tensor");
    SAFECKPT_TRY(std::int64_t d, c.dim(d0, x->shape.size()));
    v = x->shape[static_cast<std::size_t>(d)];
  } else if (op == "_operator.mul") {
    SAFECKPT_TRY(std::int64_t a, c.integer("a"));
    SAFECKPT_TRY(std::int64_t b, c.integer("b"));
    if (__builtin_mul_overflow(a, b, &v)) return c.fail(ErrorCode::kLimitExceeded, "SymInt product overflows");
  } else {
    return c.fail(ErrorCode::kUnsupported, "symbolic op '" + op + "' has no kernel");
  }
  auto& sv = c.p.sym_values[static_cast<std::size_t>(c.node->sym_output)];
  if (!sv.expr.empty()) {
    SAFECKPT_TRY(std::int64_t want, detail::eval_srepr(sv.expr, c.symbols, c.lim));
    if (want != v)
      return c.fail(ErrorCode::kMalformed, "SymInt '" + sv.name + "' is " + std::to_string(v) +
                                               " but its recorded expression gives " + std::to_string(want));
  }
  c.syms[static_cast<std::size_t>(c.node->sym_output)] = v;
  return {};
}

// Compares a produced tensor with its recorded tensor_meta (dtype, sizes).
Status check_meta(Ctx& c, std::int32_t id, const HostTensor& t) {
  const TensorMeta& m = c.p.values[static_cast<std::size_t>(id)];
  const std::string& name = c.p.value_names[static_cast<std::size_t>(id)];
  if (m.dtype != t.dtype)
    return c.fail(ErrorCode::kMalformed, "output '" + name + "' is " + std::string(dtype_name(t.dtype)) +
                                             " but its tensor_meta says " + std::string(dtype_name(m.dtype)));
  bool ok = m.sizes.size() == t.shape.size();
  std::string want = "[";
  for (std::size_t d = 0; d < m.sizes.size(); ++d) {
    std::int64_t v = m.sizes[d].value;
    if (m.sizes[d].is_symbolic()) {
      SAFECKPT_TRY(v,
                   detail::eval_srepr(c.p.sym_values[static_cast<std::size_t>(m.sizes[d].sym)].expr, c.symbols, c.lim));
    }
    want += (d ? "," : "") + std::to_string(v);
    if (ok && v != t.shape[d]) ok = false;
  }
  if (!ok) {
    std::string got = "[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) got += (d ? "," : "") + std::to_string(t.shape[d]);
    return c.fail(ErrorCode::kMalformed,
                  "output '" + name + "' has shape " + got + "] but its tensor_meta says " + want + "]");
  }
  return {};
}

// Strides (tensor_meta) checks. The interpreter computes on dense row-major
// tensors, but a program's recorded strides must be the ones PyTorch gives:
//  - view ops (ATen's formulas: permute/transpose swap strides, unsqueeze
//    inserts size*stride of the next dim (1 at the end), expand puts 0 on new
//    and broadcast dims, split/slice keep the input's strides (slice: times
//    step), select drops the dim, view/flatten/reshape/_unsafe_view restride
//    like ATen's computeStride — reshape falls back to a contiguous copy when
//    no view exists, view refuses) give exact strides from the input's;
//  - every other op returns a fresh tensor, which PyTorch allocates
//    non-overlapping and dense (contiguous or a permutation of it, e.g.
//    preserve_format following its input).
// Only dims of size > 1 are compared (a stride of a size-1 dim never
// addresses memory); tensors with no elements are not checked.
std::vector<std::int64_t> contiguous_of(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) st[d - 1] = st[d] * std::max<std::int64_t>(shape[d], 1);
  return st;
}

std::string ints_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

Result<std::vector<std::int64_t>> eval_ints(const Ctx& c, const std::vector<SymInt>& v) {
  std::vector<std::int64_t> out;
  for (const auto& s : v) {
    if (!s.is_symbolic()) {
      out.push_back(s.value);
      continue;
    }
    SAFECKPT_TRY(std::int64_t x,
                 detail::eval_srepr(c.p.sym_values[static_cast<std::size_t>(s.sym)].expr, c.symbols, c.lim));
    out.push_back(x);
  }
  return out;
}

bool dense_permutation(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& st) {
  std::vector<std::size_t> dims;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return true;
    if (shape[d] > 1) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(), [&](std::size_t a, std::size_t b) { return st[a] < st[b]; });
  std::int64_t want = 1;
  for (std::size_t d : dims) {
    if (st[d] != want) return false;
    want *= shape[d];
  }
  return true;
}

// Records the strides of a graph input (weights, user inputs) from its meta.
Status input_strides(Ctx& c, std::int32_t id) {
  SAFECKPT_TRY(c.strides[static_cast<std::size_t>(id)], eval_ints(c, c.p.values[static_cast<std::size_t>(id)].strides));
  return {};
}

// Output `k` (value `id`, dense result `out`) of the current node.
Status check_strides(Ctx& c, std::size_t k, std::int32_t id, const HostTensor& out) {
  const TensorMeta& m = c.p.values[static_cast<std::size_t>(id)];
  const std::string& name = c.p.value_names[static_cast<std::size_t>(id)];
  SAFECKPT_TRY(std::vector<std::int64_t> rec, eval_ints(c, m.strides));
  if (rec.size() != out.shape.size())
    return c.fail(ErrorCode::kMalformed, "output '" + name + "': tensor_meta has " + std::to_string(rec.size()) +
                                             " strides for rank " + std::to_string(out.shape.size()));
  for (auto v : rec)
    if (v < 0) return c.fail(ErrorCode::kMalformed, "output '" + name + "': negative stride in tensor_meta");
  c.strides[static_cast<std::size_t>(id)] = rec;
  if (out.numel() == 0) return {};
  const std::string& op = c.node->schema->name;
  std::optional<std::vector<std::int64_t>> want;
  const Arg& self = c.arg("self");
  const bool has_self = self.kind == Arg::Kind::kTensor && self.tensor >= 0;
  const std::vector<std::int64_t>* in_st = has_self ? &c.strides[static_cast<std::size_t>(self.tensor)] : nullptr;
  const HostTensor* in = has_self ? &c.vals[static_cast<std::size_t>(self.tensor)] : nullptr;
  if (in != nullptr && in_st->size() != in->shape.size()) in = nullptr;  // no strides known for the input
  const std::size_t r = in != nullptr ? in->shape.size() : 0;
  if (in != nullptr) {
    if (op == "aten::permute") {
      SAFECKPT_TRY(auto dims, c.ints("dims"));
      if (dims.size() != r) return c.fail(ErrorCode::kMalformed, "permute: dims do not match the rank");
      want.emplace();
      for (auto d0 : dims) {
        SAFECKPT_TRY(std::int64_t d, c.dim(d0, r));
        want->push_back((*in_st)[static_cast<std::size_t>(d)]);
      }
    } else if (op == "aten::transpose.int") {
      SAFECKPT_TRY(std::int64_t a0, c.integer("dim0"));
      SAFECKPT_TRY(std::int64_t b0, c.integer("dim1"));
      SAFECKPT_TRY(std::int64_t a, c.dim(a0, r));
      SAFECKPT_TRY(std::int64_t b, c.dim(b0, r));
      want = *in_st;
      // A 0-d tensor takes dims 0 / -1 and comes back as it is (PyTorch).
      if (r > 0) std::swap((*want)[static_cast<std::size_t>(a)], (*want)[static_cast<std::size_t>(b)]);
    } else if (op == "aten::unsqueeze") {
      SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
      SAFECKPT_TRY(std::int64_t d, c.dim(d0, r + 1));
      auto ud = static_cast<std::size_t>(d);
      want = *in_st;
      std::int64_t s = 1;
      if (ud < r && __builtin_mul_overflow(in->shape[ud], (*in_st)[ud], &s))
        return c.fail(ErrorCode::kMalformed, "unsqueeze: stride overflows int64");
      want->insert(want->begin() + static_cast<std::ptrdiff_t>(ud), s);
    } else if (op == "aten::expand") {
      want.emplace(out.shape.size(), 0);
      const std::size_t lead = out.shape.size() - std::min(out.shape.size(), r);
      for (std::size_t d = 0; d < r && lead + d < out.shape.size(); ++d)
        (*want)[lead + d] = in->shape[d] == out.shape[lead + d] ? (*in_st)[d] : 0;
    } else if (op == "aten::split.Tensor" || op == "aten::split_with_sizes" || op == "aten::slice.Tensor") {
      if (r == 0) return c.fail(ErrorCode::kMalformed, op + " of a 0-d tensor");
      want = *in_st;
      if (op == "aten::slice.Tensor") {
        SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
        SAFECKPT_TRY(std::int64_t d, c.dim(d0, r));
        SAFECKPT_TRY(std::int64_t step, c.integer("step"));
        auto& st = (*want)[static_cast<std::size_t>(d)];
        if (__builtin_mul_overflow(st, step, &st))
          return c.fail(ErrorCode::kMalformed, "slice: stride overflows int64");
      }
    } else if (op == "aten::select.int") {
      if (r == 0) return c.fail(ErrorCode::kMalformed, "select of a 0-d tensor");
      SAFECKPT_TRY(std::int64_t d0, c.integer("dim"));
      SAFECKPT_TRY(std::int64_t d, c.dim(d0, r));
      want = *in_st;
      want->erase(want->begin() + d);
    } else if (op == "aten::view" || op == "aten::flatten.using_ints" || op == "aten::reshape" ||
               op == "aten::_unsafe_view") {
      want = detail::view_strides(in->shape, *in_st, out.shape);
      if (!want && op == "aten::view")
        return c.fail(ErrorCode::kMalformed, "view of '" + c.p.value_names[static_cast<std::size_t>(self.tensor)] +
                                                 "' with strides " + ints_text(*in_st) + " as shape " +
                                                 ints_text(out.shape) +
                                                 ": PyTorch cannot view these strides (use reshape)");
      if (!want) want = contiguous_of(out.shape);
    }
  }
  (void)k;
  if (want) {
    bool ok = want->size() == rec.size();
    for (std::size_t d = 0; ok && d < rec.size(); ++d) ok = out.shape[d] <= 1 || rec[d] == (*want)[d];
    if (!ok)
      return c.fail(ErrorCode::kMalformed, "output '" + name + "' has strides " + ints_text(rec) +
                                               " in its tensor_meta but " + op + " gives " + ints_text(*want));
    return {};
  }
  if (!dense_permutation(out.shape, rec))
    return c.fail(ErrorCode::kMalformed, "output '" + name + "' has strides " + ints_text(rec) + " for shape " +
                                             ints_text(out.shape) + " in its tensor_meta, but " + op +
                                             " returns a new dense tensor");
  return {};
}

// Binds an input tensor against its recorded meta: dtype, rank, static dims;
// symbolic dims `Symbol('s')` bind s (range-checked, one value per symbol).
Status bind_input(Ctx& c, const GraphInput& in, const HostTensor& t,
                  std::vector<std::pair<std::size_t, std::size_t>>& deferred) {
  const TensorMeta& m = c.p.values[static_cast<std::size_t>(in.value)];
  std::string w = (in.kind == InputKind::kUserInput ? "input '" : "weight '") + in.fqn + "'";
  if (!t.data || (!c.meta && t.data->size() != t.numel() * dtype_size(t.dtype)))
    return make_error(ErrorCode::kInvalidArgument, w + ": tensor bytes do not match its shape");
  if (t.dtype != m.dtype)
    return make_error(ErrorCode::kInvalidArgument, w + " is " + std::string(dtype_name(t.dtype)) +
                                                       "; the program takes " + std::string(dtype_name(m.dtype)));
  if (t.shape.size() != m.sizes.size())
    return make_error(ErrorCode::kInvalidArgument, w + " has rank " + std::to_string(t.shape.size()) +
                                                       "; the program takes rank " + std::to_string(m.sizes.size()));
  for (std::size_t d = 0; d < m.sizes.size(); ++d) {
    if (!m.sizes[d].is_symbolic()) {
      if (m.sizes[d].value != t.shape[d])
        return make_error(ErrorCode::kInvalidArgument, w + " dim " + std::to_string(d) + " is " +
                                                           std::to_string(t.shape[d]) + "; the program takes " +
                                                           std::to_string(m.sizes[d].value));
      continue;
    }
    const std::string& expr = c.p.sym_values[static_cast<std::size_t>(m.sizes[d].sym)].expr;
    std::string sym = detail::single_symbol(expr);
    if (sym.empty()) {
      deferred.emplace_back(static_cast<std::size_t>(in.value), d);
      continue;
    }
    if (in.kind != InputKind::kUserInput)
      return make_error(ErrorCode::kInvalidArgument, w + ": weights with dynamic sizes are not supported");
    auto [it, fresh] = c.symbols.try_emplace(sym, t.shape[d]);
    if (!fresh && it->second != t.shape[d])
      return make_error(ErrorCode::kInvalidArgument, w + " dim " + std::to_string(d) + " is " +
                                                         std::to_string(t.shape[d]) + " but symbol " + sym +
                                                         " is already " + std::to_string(it->second));
    auto rc = c.p.range_constraints.find(sym);
    if (rc != c.p.range_constraints.end()) {
      auto [lo, hi] = rc->second;
      if ((lo && t.shape[d] < *lo) || (hi && t.shape[d] > *hi))
        return make_error(ErrorCode::kInvalidArgument, w + " dim " + std::to_string(d) + " is " +
                                                           std::to_string(t.shape[d]) + ", outside the range of " +
                                                           sym + " [" + (lo ? std::to_string(*lo) : "-inf") + ", " +
                                                           (hi ? std::to_string(*hi) : "inf") + "]");
    }
  }
  return {};
}

// Binds the user inputs (and, unless `user_only`, the weights) into `c`:
// the checks of bind_input for each, then every missing and unknown name,
// then the dims that are expressions of symbols.
Status bind_all(Ctx& c, const WeightMap& weights, const std::map<std::string, HostTensor, std::less<>>& inputs,
                bool user_only) {
  const Program& program = c.p;
  std::vector<std::pair<std::size_t, std::size_t>> deferred;
  std::vector<std::string> missing;
  for (const auto& in : program.inputs) {
    if (user_only && in.kind != InputKind::kUserInput) continue;
    const HostTensor* t = nullptr;
    if (in.kind == InputKind::kUserInput) {
      auto it = inputs.find(in.fqn);
      if (it != inputs.end()) t = &it->second;
    } else {
      auto it = weights.find(in.fqn);
      if (it != weights.end()) t = &it->second;
    }
    if (t == nullptr) {
      missing.push_back((in.kind == InputKind::kUserInput ? "input '" : "weight '") + in.fqn + "'");
      continue;
    }
    SAFECKPT_CHECK(bind_input(c, in, *t, deferred));
    c.vals[static_cast<std::size_t>(in.value)] = *t;
  }
  if (!missing.empty()) {
    std::string msg = "missing:";
    for (std::size_t i = 0; i < missing.size(); ++i) msg += (i ? ", " : " ") + missing[i];
    return make_error(ErrorCode::kInvalidArgument, msg);
  }
  for (const auto& name_t : inputs) {
    bool known = false;
    for (const auto& in : program.inputs) known = known || (in.kind == InputKind::kUserInput && in.fqn == name_t.first);
    if (!known)
      return make_error(ErrorCode::kInvalidArgument, "input '" + name_t.first + "' is not an input of the program");
  }
  for (auto [v, d] : deferred) {
    const TensorMeta& m = program.values[v];
    SAFECKPT_TRY(
        std::int64_t want,
        detail::eval_srepr(program.sym_values[static_cast<std::size_t>(m.sizes[d].sym)].expr, c.symbols, c.lim));
    if (want != c.vals[v].shape[d])
      return make_error(ErrorCode::kInvalidArgument, "input '" + program.value_names[v] + "' dim " + std::to_string(d) +
                                                         " must be " + std::to_string(want));
  }
  return {};
}

Status require_validated(const Program& program) {
  for (const auto& n : program.nodes)
    if (n.schema == nullptr)
      return make_error(ErrorCode::kInvalidArgument,
                        "program not validated (node '" + n.name + "'): call validate() first");
  return {};
}

// Runs the program (meta: the shape pass only). `record`, when given, gets
// the dtype and shape of every tensor value as it is bound or produced.
Result<std::vector<HostTensor>> run_impl(const Program& program, const WeightMap& weights,
                                         const std::map<std::string, HostTensor, std::less<>>& inputs,
                                         const GraphLimits& limits, bool meta,
                                         std::vector<detail::ValueShape>* record = nullptr, bool count_work = false) {
  try {
    SAFECKPT_CHECK(require_validated(program));
    Ctx c{program, limits, {}, {}, {}, 0, nullptr, meta, {}};
    c.count_work = count_work;
    c.strides.resize(program.values.size());
    c.vals.resize(program.values.size());
    c.syms.resize(program.sym_values.size());
    SAFECKPT_CHECK(bind_all(c, weights, inputs, false));
    if (record != nullptr) {
      record->assign(program.values.size(), detail::ValueShape{});
      for (const auto& in : program.inputs) {
        const HostTensor& t = c.vals[static_cast<std::size_t>(in.value)];
        (*record)[static_cast<std::size_t>(in.value)] = detail::ValueShape{true, t.dtype, t.shape};
      }
    }
    for (const auto& in : program.inputs) SAFECKPT_CHECK(input_strides(c, in.value));
    // Last use of every value, so intermediates are released early.
    std::vector<std::int64_t> last(program.values.size(), -1);
    for (std::size_t i = 0; i < program.nodes.size(); ++i)
      for (const auto& a : program.nodes[i].args) {
        if (a.kind == Arg::Kind::kTensor) last[static_cast<std::size_t>(a.tensor)] = static_cast<std::int64_t>(i);
        for (auto t : a.tensors)
          if (t >= 0) last[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(i);
      }
    for (auto o : program.outputs) last[static_cast<std::size_t>(o)] = std::numeric_limits<std::int64_t>::max();
    std::vector<std::vector<std::size_t>> release(program.nodes.size());
    std::vector<char> is_input(program.values.size(), 0);
    for (const auto& in : program.inputs) is_input[static_cast<std::size_t>(in.value)] = 1;
    for (std::size_t v = 0; v < last.size(); ++v)
      if (last[v] >= 0 && last[v] < static_cast<std::int64_t>(program.nodes.size()))
        release[static_cast<std::size_t>(last[v])].push_back(v);
    for (std::size_t i = 0; i < program.nodes.size(); ++i) {
      const Node& n = program.nodes[i];
      c.node = &n;
      if (n.sym_output >= 0) {
        SAFECKPT_CHECK(run_sym(c));
      } else {
        Outs outs;
        SAFECKPT_CHECK(run_node(c, outs));
        if (!n.schema->returns_list && outs.size() != n.outputs.size())
          return c.fail(ErrorCode::kInternal, "kernel produced " + std::to_string(outs.size()) + " outputs");
        if (n.schema->returns_list && outs.size() != n.outputs.size())
          return c.fail(ErrorCode::kMalformed, "produces " + std::to_string(outs.size()) +
                                                   " tensors but the graph names " + std::to_string(n.outputs.size()));
        for (std::size_t k = 0; k < outs.size(); ++k) {
          std::int32_t id = n.outputs[k];
          if (id < 0) continue;
          SAFECKPT_CHECK(check_meta(c, id, outs[k]));
          SAFECKPT_CHECK(check_strides(c, k, id, outs[k]));
          if (record != nullptr)
            (*record)[static_cast<std::size_t>(id)] = detail::ValueShape{true, outs[k].dtype, outs[k].shape};
          c.vals[static_cast<std::size_t>(id)] = std::move(outs[k]);
        }
      }
      for (std::size_t v : release[i]) {
        if (!c.vals[v].data) continue;
        if (!is_input[v]) c.live -= std::min<std::uint64_t>(c.live, c.vals[v].data->size());
        c.vals[v] = HostTensor{};
      }
    }
    std::vector<HostTensor> out;
    for (auto o : program.outputs) out.push_back(c.vals[static_cast<std::size_t>(o)]);
    return out;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory while running the program");
  }
}

}  // namespace

Result<std::vector<HostTensor>> run_cpu(const Program& program, const WeightMap& weights,
                                        const std::map<std::string, HostTensor, std::less<>>& inputs,
                                        const GraphLimits& limits) {
  // Shapes first (no values): a program whose recorded tensor_meta disagrees
  // with the propagated shapes, or that would not fit the memory or work
  // budget, is refused before any kernel runs.
  SAFECKPT_TRY(auto shapes, run_impl(program, weights, inputs, limits, true, nullptr, true));
  (void)shapes;
  return run_impl(program, weights, inputs, limits, false, nullptr, true);
}

Status check_weights(const Program& program, const WeightMap& weights, const GraphLimits& limits) {
  SAFECKPT_CHECK(require_validated(program));
  // Not meta: bind_input also checks each weight's bytes against its shape.
  Ctx c{program, limits, {}, {}, {}, 0, nullptr, false, {}};
  c.vals.resize(program.values.size());
  c.syms.resize(program.sym_values.size());
  std::vector<std::pair<std::size_t, std::size_t>> deferred;
  std::string missing;
  for (const auto& in : program.inputs) {
    if (in.kind == InputKind::kUserInput) continue;
    auto it = weights.find(in.fqn);
    if (it == weights.end()) {
      missing += (missing.empty() ? " weight '" : ", weight '") + in.fqn + "'";
      continue;
    }
    SAFECKPT_CHECK(bind_input(c, in, it->second, deferred));
  }
  if (!missing.empty()) return make_error(ErrorCode::kInvalidArgument, "missing:" + missing);
  return {};
}

Status check_shapes(const Program& program, const GraphLimits& limits) {
  WeightMap weights;
  std::map<std::string, HostTensor, std::less<>> inputs;
  for (const auto& in : program.inputs) {
    const TensorMeta& m = program.values[static_cast<std::size_t>(in.value)];
    HostTensor t;
    t.dtype = m.dtype;
    t.data = std::make_shared<std::vector<std::uint8_t>>();
    for (const auto& s : m.sizes) {
      if (!s.is_symbolic()) {
        t.shape.push_back(s.value);
        continue;
      }
      const SymValue& sv = program.sym_values[static_cast<std::size_t>(s.sym)];
      if (!sv.hint)
        return make_error(ErrorCode::kMalformed, "input '" + in.fqn + "': symbolic size '" + sv.expr +
                                                     "' has no example value (hint) to check shapes with");
      t.shape.push_back(*sv.hint);
    }
    if (in.kind == InputKind::kUserInput)
      inputs[in.fqn] = std::move(t);
    else
      weights[in.fqn] = std::move(t);
  }
  auto r = run_impl(program, weights, inputs, limits, true);
  if (!r) {
    Error e = std::move(r).error();
    // Inputs made from the program's own metadata that do not bind: the
    // program contradicts itself.
    if (e.code() == ErrorCode::kInvalidArgument)
      e = Error(ErrorCode::kMalformed, "program inconsistent: " + e.message());
    return unexpected(std::move(e));
  }
  return {};
}

namespace detail {

Result<std::unordered_map<std::string, std::int64_t>> bind_user_shapes(
    const Program& program, const std::map<std::string, std::vector<std::int64_t>>& shapes, const GraphLimits& limits) {
  SAFECKPT_CHECK(require_validated(program));
  std::map<std::string, HostTensor, std::less<>> inputs;
  for (const auto& [name, sizes] : shapes) {
    HostTensor t;  // the dtype the program takes: only shapes are checked here
    for (const auto& in : program.inputs)
      if (in.kind == InputKind::kUserInput && in.fqn == name)
        t.dtype = program.values[static_cast<std::size_t>(in.value)].dtype;
    t.shape = sizes;
    t.data = std::make_shared<std::vector<std::uint8_t>>();
    inputs.emplace(name, std::move(t));
  }
  Ctx c{program, limits, {}, {}, {}, 0, nullptr, true, {}};
  c.strides.resize(program.values.size());
  c.vals.resize(program.values.size());
  c.syms.resize(program.sym_values.size());
  SAFECKPT_CHECK(bind_all(c, {}, inputs, true));
  return c.symbols;
}

Result<std::vector<ValueShape>> shape_pass(const Program& program,
                                           const std::unordered_map<std::string, std::int64_t>& symbols,
                                           const GraphLimits& limits) {
  SAFECKPT_CHECK(require_validated(program));
  WeightMap weights;
  std::map<std::string, HostTensor, std::less<>> inputs;
  for (const auto& in : program.inputs) {
    const TensorMeta& m = program.values[static_cast<std::size_t>(in.value)];
    HostTensor t;
    t.dtype = m.dtype;
    t.data = std::make_shared<std::vector<std::uint8_t>>();
    for (const auto& s : m.sizes) {
      if (!s.is_symbolic()) {
        t.shape.push_back(s.value);
        continue;
      }
      auto v = eval_srepr(program.sym_values[static_cast<std::size_t>(s.sym)].expr, symbols, limits);
      if (!v)
        return make_error(ErrorCode::kInvalidArgument,
                          "input '" + in.fqn + "': its size " +
                              program.sym_values[static_cast<std::size_t>(s.sym)].expr +
                              " cannot be evaluated with the given symbols: " + v.error().message());
      t.shape.push_back(*v);
    }
    if (in.kind == InputKind::kUserInput)
      inputs[in.fqn] = std::move(t);
    else
      weights[in.fqn] = std::move(t);
  }
  std::vector<ValueShape> out;
  SAFECKPT_TRY(auto unused, run_impl(program, weights, inputs, limits, true, &out));
  (void)unused;
  return out;
}

}  // namespace detail

}  // namespace safeckpt::graph
