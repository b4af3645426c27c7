// DCP directories (issue 17): consolidation and GPU loading against their
// baselines, measured in the same run.
//
//   safeckpt_dcp_bench DIR [--runs R] [--out-dir D] [--device N] [--baselines "CMD"]
//   safeckpt_dcp_bench --make DIR [--gib G] [--ranks N] ...   (writes DIR first)
//
// --make generates a bf16 state_dict of G GiB (tensors [8192, 4096], 64 MiB
// each, "layers.<i>.weight") and writes it with save_dcp as N ranks would
// (every tensor Shard(0) over them). Then, median of R runs, page cache warm
// (one untimed pass first), no fsync on either side:
//  - dcp_to_safetensors(DIR, D/x.safetensors) against `cp -r DIR D/copy`
//    (the target: within 1.2x of cp);
//  - in a CUDA build: load_dcp_to_device of the whole model (world size 1
//    plan: boxes that span several chunks are assembled on the host) and of
//    every rank's own plan one after another (direct file ranges), against
//    the pinned host->device ceiling (cuda::measure_pinned_h2d; target >= 0.8x).
// --baselines "python3 bench/dcp_baselines.py DIR" adds PyTorch's rows (ROW
// lines, cli/probes.hpp) to the table. One markdown table on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "probes.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/dcp.hpp"
#if defined(SAFECKPT_HAVE_CUDA)
#include "safeckpt/device_checkpoint.hpp"
#endif

namespace fs = std::filesystem;
using namespace safeckpt;

namespace {

struct Row {
  std::string what;
  double seconds = -1, gbps = -1;
  std::string vs, target;
};

double median_seconds(int runs, const std::function<bool()>& fn, bool& ok) {
  std::vector<double> t;
  ok = true;
  for (int i = 0; i < runs && ok; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ok = fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t.empty() ? -1 : t[t.size() / 2];
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string quoted(const fs::path& p) {
  std::string s = "'";
  for (char c : p.string()) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return s + "'";
}

bool make_dir(const fs::path& dir, double gib, std::uint32_t ranks) {
  constexpr std::int64_t kRows = 8192, kCols = 4096;
  const std::uint64_t per = static_cast<std::uint64_t>(kRows * kCols) * 2;
  const auto count = static_cast<std::uint64_t>(std::max(1.0, gib * (1ull << 30) / static_cast<double>(per)));
  CheckpointBuilder b;
  std::vector<NodeId> kv;
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::vector<std::uint8_t> bytes(per);
    for (std::size_t k = 0; k + 8 <= bytes.size(); k += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const std::uint64_t v = x & 0x3F7F3F7F3F7F3F7Full;  // finite bf16 values
      std::memcpy(bytes.data() + k, &v, 8);
    }
    auto s = b.add_storage(DType::kBFloat16, std::move(bytes));
    if (!s) return false;
    auto t = b.add_tensor(DType::kBFloat16, {kRows, kCols}, *s);
    if (!t) return false;
    kv.push_back(b.str("layers." + std::to_string(i) + ".weight"));
    kv.push_back(*t);
  }
  b.set_root(b.container(Kind::kDict, std::move(kv)));
  auto ck = std::move(b).finish();
  if (!ck) return false;
  DcpWriteOptions o;
  o.fsync = false;
  o.world_size = ranks;
  const auto t0 = std::chrono::steady_clock::now();
  auto w = save_dcp(*ck, dir, o);
  if (!w) {
    std::fprintf(stderr, "save_dcp: %s\n", w.error().to_string().c_str());
    return false;
  }
  std::fprintf(stderr, "made %s: %llu tensors, %u ranks, %llu data bytes in %.2f s\n", dir.c_str(),
               static_cast<unsigned long long>(w->tensors), w->files, static_cast<unsigned long long>(w->data_bytes),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

std::uint64_t dir_bytes(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir, make, out_dir;
  double gib = 1;
  std::uint32_t ranks = 4;
  int runs = 3, device = 0;
  std::string baselines;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--make" && more)
      make = argv[++i];
    else if (a == "--gib" && more)
      gib = std::atof(argv[++i]);
    else if (a == "--ranks" && more)
      ranks = static_cast<std::uint32_t>(std::atoi(argv[++i]));
    else if (a == "--runs" && more)
      runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--out-dir" && more)
      out_dir = argv[++i];
    else if (a == "--device" && more)
      device = std::atoi(argv[++i]);
    else if (a == "--baselines" && more)
      baselines = argv[++i];
    else if (dir.empty() && a[0] != '-')
      dir = a;
    else {
      std::fprintf(stderr,
                   "usage: safeckpt_dcp_bench DIR | --make DIR [--gib G] [--ranks N]  [--runs R] [--out-dir D] "
                   "[--device N] [--baselines CMD]\n");
      return 2;
    }
  }
  if (!make.empty()) {
    if (!make_dir(make, gib, ranks)) return 1;
    dir = make;
  }
  if (dir.empty()) {
    std::fprintf(stderr, "safeckpt_dcp_bench: no DIR\n");
    return 2;
  }
  if (out_dir.empty()) out_dir = fs::absolute(dir).parent_path();
  DcpOptions dopt;
  dopt.verify_storage_crc = false;  // cp checks nothing either; the GPU engine checks direct records itself
  auto ckpt = DcpCheckpoint::open(dir, dopt);
  if (!ckpt) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(), ckpt.error().to_string().c_str());
    return 1;
  }
  const std::uint64_t bytes = dir_bytes(dir);
  std::uint64_t tensor_bytes = 0;
  for (const auto& t : ckpt->tensors()) {
    std::uint64_t n = dtype_size(t.dtype);
    for (auto s : t.shape) n *= static_cast<std::uint64_t>(s);
    tensor_bytes += n;
  }
  std::vector<Row> rows;
  const fs::path st = out_dir / "dcp_bench.safetensors", copy = out_dir / "dcp_bench.copy";
  std::error_code ec;
  fs::remove(st, ec);
  fs::remove_all(copy, ec);
  const std::string cp = "cp -r " + quoted(dir) + " " + quoted(copy);
  const auto do_cp = [&] {
    const bool ok = std::system(cp.c_str()) == 0;
    fs::remove_all(copy, ec);
    return ok;
  };
  const auto do_st = [&] {
    DcpConvertOptions co;
    co.fsync = false;
    const bool ok = dcp_to_safetensors(*ckpt, st, co).has_value();
    fs::remove(st, ec);
    return ok;
  };
  bool ok = do_cp() && do_st();  // warm the page cache, untimed
  if (!ok) {
    std::fprintf(stderr, "warm-up failed\n");
    return 1;
  }
  const double t_cp = median_seconds(runs, do_cp, ok);
  const double t_st = ok ? median_seconds(runs, do_st, ok) : -1;
  if (!ok) {
    std::fprintf(stderr, "consolidation or cp failed\n");
    return 1;
  }
  rows.push_back({"`cp -r DIR` (baseline)", t_cp, static_cast<double>(bytes) / t_cp / 1e9, "1.00x", ""});
  rows.push_back({"dcp_to_safetensors(DIR)", t_st, static_cast<double>(bytes) / t_st / 1e9,
                  fmt("%.2fx cp", t_st / t_cp), t_st <= 1.2 * t_cp ? "<= 1.2x cp: met" : "<= 1.2x cp: NOT met"});
#if defined(SAFECKPT_HAVE_CUDA)
  if (cuda::device_count() > 0) {
    auto ceiling = cuda::measure_pinned_h2d(device, std::min<std::uint64_t>(tensor_bytes, 4ull << 30));
    cuda::TransferOptions to;
    to.device = device;
    auto engine = cuda::TransferEngine::create(to);
    if (ceiling && engine) {
      rows.push_back({"pinned H2D ceiling (baseline)", -1, *ceiling, "1.00x", ""});
      cuda::DeviceLoadOptions lo;
      lo.map_location = "cuda:" + std::to_string(device);
      const DcpPlan full = DcpPlan::full(*ckpt);
      const auto do_full = [&] { return cuda::load_dcp_to_device(*ckpt, full, lo, &*engine).has_value(); };
      std::int64_t world = static_cast<std::int64_t>(ckpt->files().size());
      const auto do_ranks = [&] {
        for (std::int64_t r = 0; r < world; ++r)
          if (!cuda::load_dcp_to_device(*ckpt, DcpPlan::uniform(*ckpt, DcpPlacement{0}, r, world), lo, &*engine))
            return false;
        return true;
      };
      bool gok = do_full() && do_ranks();  // warm-up: ring pinned, pages cached
      if (gok) {
        const double t_full = median_seconds(runs, do_full, gok);
        const double g_full = static_cast<double>(tensor_bytes) / t_full / 1e9;
        rows.push_back({"load_dcp_to_device, world size 1 plan (whole model)", t_full, g_full,
                        fmt("%.2fx ceiling", g_full / *ceiling),
                        g_full >= 0.8 * *ceiling ? ">= 0.8x ceiling: met" : ">= 0.8x ceiling: NOT met"});
        cuda::LoadStats ls;
        if (cuda::load_dcp_to_device(*ckpt, full, lo, &*engine, &ls))
          std::printf(
              "whole-model load, one more call: %.4f s in the call, %llu bytes, %llu chunks, %s, %u readers, "
              "first storage after %.4f s\n",
              ls.seconds, static_cast<unsigned long long>(ls.bytes), static_cast<unsigned long long>(ls.chunks),
              std::string(cuda::io_mode_name(ls.io_mode)).c_str(), ls.reader_threads, ls.seconds_to_first_storage);
        const double t_ranks = median_seconds(runs, do_ranks, gok);
        const double g_ranks = static_cast<double>(tensor_bytes) / t_ranks / 1e9;
        rows.push_back({"load_dcp_to_device, each rank's own plan in turn (" + std::to_string(world) + " ranks)",
                        t_ranks, g_ranks, fmt("%.2fx ceiling", g_ranks / *ceiling), ""});
      }
      if (!gok) std::fprintf(stderr, "GPU load failed\n");
    } else {
      std::fprintf(stderr, "no GPU rows: %s\n",
                   !ceiling ? ceiling.error().to_string().c_str() : engine.error().to_string().c_str());
    }
  } else {
    std::fprintf(stderr, "no CUDA device: GPU rows skipped\n");
  }
#endif
  if (!baselines.empty()) {
    for (const auto& r : bench::run_baseline_command(baselines, stderr))
      rows.push_back({"PyTorch: " + r.what + " (" + r.mode + ")", r.seconds, r.gbps, "", r.note});
  }
  std::printf("DCP directory %s: %zu tensors, %zu data files, %.2f GiB on disk (%.2f GiB tensors), runs %d\n\n",
              dir.c_str(), ckpt->tensors().size(), ckpt->files().size(), static_cast<double>(bytes) / (1ull << 30),
              static_cast<double>(tensor_bytes) / (1ull << 30), runs);
  std::printf("| what | seconds | GB/s | vs baseline | target |\n|---|---:|---:|---:|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %s | %s |\n", r.what.c_str(), r.seconds < 0 ? "" : fmt("%.3f", r.seconds).c_str(),
                r.gbps < 0 ? "" : fmt("%.2f", r.gbps).c_str(), r.vs.c_str(), r.target.c_str());
  return 0;
}
