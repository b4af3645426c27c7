// The engine's persistent compile cache (safeckpt/engine.hpp, "The persistent
// compile cache"; src/engine/module_cache.hpp): the module key as a pure
// function of the generated source and the device facts, a module entry
// through CompileCache store/load, and Engine::create on a directory it
// cannot use — on the host (test names with "(no device)", ctest
// engine.host). On the GPU (ctest engine.gpu; "SKIP: no CUDA device"
// without one): two engines in sequence on one directory (the second loads
// every module, compiles nothing, gives the same bits), a tampered entry
// (warning, compiled again, rewritten, correct output) and an unusable
// default directory (no cache, a warning, the run works). Every case makes
// its own temporary cache directory; none touches ~/.cache.
#include <doctest/doctest.h>
#include <stdlib.h>  // setenv, unsetenv
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "engine/module_cache.hpp"
#include "engine/runtime.hpp"
#include "safeckpt/compile_cache.hpp"
#include "safeckpt/cuda.hpp"
#include "safeckpt/engine.hpp"
#include "safeckpt/hash.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/version.hpp"
#include "support/pt2_corpus.hpp"

using namespace safeckpt;
using safeckpt::cuda_test::ScratchDir;
namespace fs = std::filesystem;
namespace ed = safeckpt::engine::detail;

namespace {

// A small generated module: relu(x + 2 * y), float32, rank 2.
std::string small_source(double scale = 2.0) {
  ed::FusedKernel k;
  k.name = "k0";
  k.rank = 2;
  k.in_dtypes = {DType::kFloat32, DType::kFloat32};
  k.out_dtypes = {DType::kFloat32};
  ed::MicroOp a;
  a.kind = ed::MicroKind::kLoad;
  a.a = 0;
  ed::MicroOp b = a;
  b.a = 1;
  ed::MicroOp add;
  add.kind = ed::MicroKind::kAdd;
  add.a = 0;
  add.b = 1;
  add.s0 = scale;
  ed::MicroOp r;
  r.kind = ed::MicroKind::kRelu;
  r.a = 2;
  r.store = 0;
  k.ops = {a, b, add, r};
  return ed::fused_source({k});
}

ed::DeviceFacts h200() {
  ed::DeviceFacts f;
  f.name = "NVIDIA H200";
  f.sm = 90;
  f.driver_version = 13000;
  f.runtime_version = 13000;
  f.nvrtc_version = ed::nvrtc_key_version(13000);
  return f;
}

enginecache::CompileCache open_cache(const fs::path& dir) {
  enginecache::CacheOptions o;
  o.dir = dir;
  auto c = enginecache::CompileCache::open(o);
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  return std::move(c).value();
}

std::vector<fs::path> entry_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".entry") out.push_back(e.path());
  return out;
}

// Sets an environment variable for the scope (restored after).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

using Inputs = std::map<std::string, graph::HostTensor, std::less<>>;

struct Gpt2 {
  test_support::LoadedProgram l;
  Inputs inputs;
};
Gpt2 gpt2_core() {
  Gpt2 g{test_support::load_program("gpt2.core.pt2", true), {}};
  auto io = SafetensorsFile::open(test_support::test_data_dir() + "gpt2.io.safetensors");
  REQUIRE(io.has_value());
  for (const auto& gi : g.l.program.inputs)
    if (gi.kind == graph::InputKind::kUserInput) g.inputs[gi.fqn] = test_support::tensor_of(*io, "input." + gi.fqn);
  return g;
}

// GEMM autotuning off: these cases compare output bits across engines, and
// timing may pick another (equally valid) cuBLASLt algorithm in another
// engine; the heuristic's first answer is the same every time. The tuned
// choices' round trip has a case of its own below.
engine::EngineOptions cached(const fs::path& dir) {
  engine::EngineOptions o;
  o.cache = engine::CacheMode::kReadWrite;
  o.cache_dir = dir;
  o.autotune_gemm = false;
  return o;
}

struct Run {
  std::vector<graph::HostTensor> outputs;
  engine::ProgramStats program;
  engine::EngineStats engine;
};
// A new engine on `o`, gpt2.core compiled and run once (compiled stance).
Run run_once(const Gpt2& g, const engine::EngineOptions& o) {
  auto eng = engine::Engine::create(o);
  REQUIRE_MESSAGE(eng.has_value(), (eng ? "" : eng.error().to_string()));
  auto cp = eng->compile(g.l.program, g.l.weights);
  REQUIRE_MESSAGE(cp.has_value(), (cp ? "" : cp.error().to_string()));
  auto out = cp->run_host(g.inputs);
  REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.error().to_string()));
  return Run{std::move(out).value(), cp->stats(), eng->stats()};
}

void check_same_bits(const Run& a, const Run& b) {
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (std::size_t i = 0; i < a.outputs.size(); ++i) {
    CHECK(a.outputs[i].shape == b.outputs[i].shape);
    CHECK(a.outputs[i].bytes().size() == b.outputs[i].bytes().size());
    CHECK(std::equal(a.outputs[i].bytes().begin(), a.outputs[i].bytes().end(), b.outputs[i].bytes().begin(),
                     b.outputs[i].bytes().end()));
  }
}

}  // namespace

// ------------------------------------------------------------- host cases

TEST_CASE("engine cache: the module key follows the source, the device and the versions (no device)") {
  const std::string src = small_source();
  const ed::DeviceFacts f = h200();
  const enginecache::CacheKey k = ed::module_cache_key(src, f);
  CHECK(k.program_hash == sha256_hex(std::span(reinterpret_cast<const std::uint8_t*>(src.data()), src.size())));
  CHECK(k.device_name == "NVIDIA H200");
  CHECK(k.sm == 90);
  CHECK(k.nvrtc_version == 13000);
  CHECK(k.shapes.empty());  // one module serves every shape
  CHECK(k.options == "--gpu-architecture=sm_90 --std=c++17 -default-device --split-compile=0");
  CHECK(k.engine_version ==
        std::string("safeckpt ") + SAFECKPT_VERSION_STRING + " codegen " + std::to_string(ed::kCodegenRevision));
  CHECK(ed::nvrtc_key_version(13020) == 13000);  // the soname major, not the minor
  // A pure function: same inputs, same key.
  CHECK(ed::module_cache_key(src, f) == k);
  CHECK(ed::module_cache_key(small_source(), h200()).digest() == k.digest());
  // Anything else that differs gives another entry.
  std::vector<enginecache::CacheKey> others;
  others.push_back(ed::module_cache_key(small_source(3.0), f));
  others.push_back(ed::module_cache_key(src + " ", f));
  auto g = f;
  g.sm = 100;
  others.push_back(ed::module_cache_key(src, g));
  g = f;
  g.name = "NVIDIA H100 80GB HBM3";
  others.push_back(ed::module_cache_key(src, g));
  g = f;
  g.driver_version = 13010;
  others.push_back(ed::module_cache_key(src, g));
  g = f;
  g.runtime_version = 13010;
  others.push_back(ed::module_cache_key(src, g));
  g = f;
  g.nvrtc_version = 14000;
  others.push_back(ed::module_cache_key(src, g));
  for (std::size_t i = 0; i < others.size(); ++i) {
    CAPTURE(i);
    CHECK(others[i].digest() != k.digest());
    for (std::size_t j = 0; j < i; ++j) CHECK(others[i].digest() != others[j].digest());
  }
  CHECK(others[2].options.find("sm_100") != std::string::npos);
}

TEST_CASE(
    "engine cache: an algorithm choice's key follows the choice and the device, apart from modules' (no device)") {
  const ed::DeviceFacts f = h200();
  const std::string gemm = "gemm cublasLt 130100:0,68,0,0,1,2048,2304,768,768,768,1,0,0,33554432,";
  const enginecache::CacheKey k = ed::choice_cache_key(gemm, f);
  CHECK(k.options == "choice");
  CHECK(k.device_name == "NVIDIA H200");
  CHECK(k.shapes.empty());
  CHECK(ed::choice_cache_key(gemm, h200()).digest() == k.digest());
  // Not the key of a module whose source happens to be the same text.
  CHECK(ed::module_cache_key(gemm, f).digest() != k.digest());
  std::vector<enginecache::CacheKey> others;
  others.push_back(ed::choice_cache_key(gemm + "1", f));
  others.push_back(ed::choice_cache_key("gemm cublasLt 130200" + gemm.substr(19), f));  // another cuBLASLt
  auto g = f;
  g.sm = 100;
  others.push_back(ed::choice_cache_key(gemm, g));
  g = f;
  g.driver_version = 13010;
  others.push_back(ed::choice_cache_key(gemm, g));
  for (std::size_t i = 0; i < others.size(); ++i) {
    CAPTURE(i);
    CHECK(others[i].digest() != k.digest());
    for (std::size_t j = 0; j < i; ++j) CHECK(others[i].digest() != others[j].digest());
  }
}

TEST_CASE("engine cache: a module entry (a real NVRTC cubin) round-trips through CompileCache (no device)") {
  ScratchDir dir("safeckpt-engine-cache");
  const std::string src = small_source();
  auto cubin = ed::nvrtc_compile(src, 90);
  REQUIRE_MESSAGE(cubin.has_value(), (cubin ? "" : cubin.error().to_string()));
  REQUIRE(!cubin->empty());
  const auto key = ed::module_cache_key(src, h200());
  {
    auto cache = open_cache(dir.path);
    auto st = cache.store(ed::module_cache_entry(key, *cubin));
    REQUIRE_MESSAGE(st.has_value(), (st ? "" : st.error().to_string()));
    CHECK(st->path == cache.entry_path(key));
    CHECK(st->path.filename().string() == key.digest() + ".entry");
  }
  auto cache = open_cache(dir.path);  // a second process would open it so
  auto r = cache.load(key);
  REQUIRE(r.has_value());
  REQUIRE(r->status == enginecache::CacheLookup::Status::kHit);
  const auto* back = ed::module_cubin(*r->entry);
  REQUIRE(back != nullptr);
  CHECK(*back == *cubin);
  // Another device or source: a miss, not this entry.
  auto other = h200();
  other.sm = 100;
  auto miss = cache.load(ed::module_cache_key(src, other));
  REQUIRE(miss.has_value());
  CHECK(miss->status == enginecache::CacheLookup::Status::kMiss);
  miss = cache.load(ed::module_cache_key(small_source(5.0), h200()));
  REQUIRE(miss.has_value());
  CHECK(miss->status == enginecache::CacheLookup::Status::kMiss);
  // An entry without a cubin (or an empty one) gives none.
  enginecache::CacheEntry empty;
  empty.key = key;
  CHECK(ed::module_cubin(empty) == nullptr);
  CHECK(ed::module_cubin(ed::module_cache_entry(key, {})) == nullptr);
}

TEST_CASE("engine cache: Engine::create refuses an explicit cache directory it cannot use (no device)") {
  ScratchDir dir("safeckpt-engine-cache");
  const fs::path file = dir.path / "not-a-dir";
  std::ofstream(file) << "x";
  const fs::path open_dir = dir.path / "world-writable";
  fs::create_directories(open_dir);
  REQUIRE(::chmod(open_dir.c_str(), 0777) == 0);
  for (const fs::path& bad : {file, open_dir}) {
    CAPTURE(bad.string());
    auto e = engine::Engine::create(cached(bad));
    REQUIRE_FALSE(e.has_value());
    CHECK((e.error().code() == ErrorCode::kInvalidArgument || e.error().code() == ErrorCode::kIo));
    CHECK(e.error().message().find("compile cache") != std::string::npos);
    CHECK(e.error().message().find(bad.string()) != std::string::npos);
  }
  // With the cache off the directory is not looked at: without a device
  // the error is the device's, with one the engine is made.
  engine::EngineOptions off = cached(file);
  off.cache = engine::CacheMode::kOff;
  auto e = engine::Engine::create(off);
  if (cuda::device_count() == 0) {
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().code() == ErrorCode::kDevice);
  } else {
    CHECK(e.has_value());
  }
}

// ------------------------------------------------------------- GPU cases

TEST_CASE("engine cache: a second engine on the same directory loads every module, compiles nothing, same bits") {
  if (!cuda_test::have_device()) return;
  ScratchDir dir("safeckpt-engine-cache");
  Gpt2 g = gpt2_core();
  Run first = run_once(g, cached(dir.path));
  MESSAGE("first engine: " << first.program.kernels_compiled << " kernels compiled, " << first.program.cache_misses
                           << " misses, " << first.program.cache_stores << " stores");
  CHECK(first.engine.cache_dir == dir.path);
  CHECK(first.engine.warnings.empty());
  REQUIRE(first.program.kernels_compiled > 0);
  CHECK(first.program.cache_hits == 0);
  CHECK(first.program.cache_misses > 0);
  CHECK(first.program.cache_stores == first.program.cache_misses);
  CHECK(first.engine.modules_compiled == first.program.cache_stores);
  REQUIRE(first.engine.choices_stored > 0);  // gpt2.core's GEMMs (cuBLASLt algorithms)
  CHECK(first.engine.choices_from_cache == 0);
  CHECK(entry_files(dir.path).size() == first.program.cache_stores + first.engine.choices_stored);
  CHECK(fs::exists(dir.path / "hmac.key"));

  Run second = run_once(g, cached(dir.path));
  MESSAGE("second engine: " << second.program.cache_hits << " hits");
  CHECK(second.engine.warnings.empty());
  CHECK(second.program.cache_hits == first.program.cache_stores);
  CHECK(second.program.cache_misses == 0);
  CHECK(second.program.cache_stores == 0);
  CHECK(second.program.kernels_compiled == 0);
  CHECK(second.engine.modules_compiled == 0);
  // Every cuBLASLt algorithm from the cache (re-checked), none asked again.
  CHECK(second.engine.choices_from_cache == first.engine.choices_stored);
  CHECK(second.engine.choices_stored == 0);
  CHECK(second.program.gemm_heuristics == 0);
  CHECK(second.program.gemm_heuristics_reused == first.program.gemm_heuristics + first.program.gemm_heuristics_reused);
  check_same_bits(first, second);

  // And against an engine without the cache: the same bits too.
  engine::EngineOptions off;
  off.cache = engine::CacheMode::kOff;
  off.autotune_gemm = false;
  Run uncached = run_once(g, off);
  CHECK(uncached.engine.cache_dir.empty());
  CHECK(uncached.program.cache_hits + uncached.program.cache_misses + uncached.program.cache_stores == 0);
  CHECK(uncached.program.kernels_compiled == first.program.kernels_compiled);
  check_same_bits(first, uncached);
}

TEST_CASE("engine cache: GEMM autotuning times candidates once; a second engine reads the choices, same bits") {
  if (!cuda_test::have_device()) return;
  ScratchDir dir("safeckpt-engine-cache");
  Gpt2 g = gpt2_core();
  engine::EngineOptions tuned = cached(dir.path);
  tuned.autotune_gemm = true;
  Run first = run_once(g, tuned);
  MESSAGE("first engine: " << first.program.gemms_tuned << " GEMMs tuned in " << 1e3 * first.program.last_tune_seconds
                           << " ms, " << first.engine.choices_stored << " choices stored");
  REQUIRE(first.program.gemms_tuned > 0);  // cuBLASLt offers more than one algorithm for gpt2.core's GEMMs
  CHECK(first.program.last_tune_seconds > 0);
  CHECK(first.engine.choices_stored > 0);
  Run second = run_once(g, tuned);
  CHECK(second.engine.warnings.empty());
  CHECK(second.program.gemms_tuned == 0);
  CHECK(second.program.last_tune_seconds == 0);
  CHECK(second.program.gemm_heuristics == 0);
  CHECK(second.engine.choices_from_cache == first.engine.choices_stored);
  CHECK(second.engine.choices_stored == 0);
  check_same_bits(first, second);
  // The untuned choice: the same program within float32 rounding (another
  // algorithm may sum in another order).
  engine::EngineOptions off;
  off.cache = engine::CacheMode::kOff;
  off.autotune_gemm = false;
  Run untuned = run_once(g, off);
  CHECK(untuned.program.gemms_tuned == 0);
  REQUIRE(untuned.outputs.size() == first.outputs.size());
  for (std::size_t i = 0; i < first.outputs.size(); ++i) {
    REQUIRE(first.outputs[i].dtype == DType::kFloat32);
    const auto a = first.outputs[i].bytes(), b = untuned.outputs[i].bytes();
    REQUIRE(a.size() == b.size());
    double max_diff = 0, max_ref = 0;
    for (std::size_t k = 0; k + 4 <= a.size(); k += 4) {
      float x = 0, y = 0;
      std::memcpy(&x, a.data() + k, 4);
      std::memcpy(&y, b.data() + k, 4);
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(x - y)));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(y)));
    }
    MESSAGE("output " << i << ": tuned vs untuned max |diff| " << max_diff << " at max |x| " << max_ref);
    CHECK(max_diff <= 1e-5 * std::max(1.0, max_ref));
  }
}

TEST_CASE("engine cache: a tampered entry is a warning; the module is compiled again, rewritten, and correct") {
  if (!cuda_test::have_device()) return;
  ScratchDir dir("safeckpt-engine-cache");
  Gpt2 g = gpt2_core();
  Run first = run_once(g, cached(dir.path));
  auto files = entry_files(dir.path);
  REQUIRE(!files.empty());
  for (const auto& f : files) {  // flip one payload byte of every entry
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-1, std::ios::end);
    char c = 0;
    io.get(c);
    io.seekp(-1, std::ios::end);
    io.put(static_cast<char>(c ^ 0x01));
  }
  const std::size_t modules = first.program.cache_stores, choices = first.engine.choices_stored;
  REQUIRE(files.size() == modules + choices);
  Run second = run_once(g, cached(dir.path));
  REQUIRE(!second.engine.warnings.empty());
  MESSAGE("warning: " << second.engine.warnings[0]);
  CHECK(second.engine.warnings[0].find("MAC") != std::string::npos);
  CHECK(second.engine.warnings.size() == std::min(files.size(), engine::kMaxCacheWarnings));
  CHECK(second.program.cache_warnings.size() == std::min(modules, engine::kMaxCacheWarnings));
  CHECK(second.program.cache_hits == 0);
  CHECK(second.program.cache_misses == modules);
  CHECK(second.program.cache_stores == modules);
  CHECK(second.program.kernels_compiled == first.program.kernels_compiled);
  // Tampered choices are ignored: the heuristics are asked again, rewritten.
  CHECK(second.engine.choices_from_cache == 0);
  CHECK(second.engine.choices_stored == choices);
  CHECK(second.program.gemm_heuristics == first.program.gemm_heuristics);
  check_same_bits(first, second);
  // The rewritten entries serve the next engine.
  Run third = run_once(g, cached(dir.path));
  CHECK(third.engine.warnings.empty());
  CHECK(third.program.cache_hits == modules);
  CHECK(third.program.kernels_compiled == 0);
  CHECK(third.engine.choices_from_cache == choices);
  CHECK(third.program.gemm_heuristics == 0);
  check_same_bits(first, third);
}

TEST_CASE("engine cache: an unusable default directory runs without a cache and says so") {
  if (!cuda_test::have_device()) return;
  ScratchDir dir("safeckpt-engine-cache");
  const fs::path file = dir.path / "not-a-dir";
  std::ofstream(file) << "x";
  ScopedEnv env("SAFECKPT_CACHE_DIR", file.string());
  Gpt2 g = gpt2_core();
  engine::EngineOptions o;  // cache on, default directory
  Run r = run_once(g, o);
  CHECK(r.engine.cache_dir.empty());
  REQUIRE(r.engine.warnings.size() == 1);
  CHECK(r.engine.warnings[0].find("compile cache off") != std::string::npos);
  CHECK(r.program.kernels_compiled > 0);
  CHECK(r.program.cache_hits + r.program.cache_misses + r.program.cache_stores == 0);
  // The same directory named explicitly is an error of create().
  auto e = engine::Engine::create(cached(file));
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().message().find("compile cache") != std::string::npos);
}
