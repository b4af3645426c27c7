// `safeckpt bench [FILE...] --device cuda:N`: how fast a checkpoint reaches
// GPU memory through safeckpt::cuda::load_to_device, against the ceilings and
// baselines measured in the same run, printed as one table (issue 5).
//
// Rows, per file (a torch.save / legacy checkpoint and/or a .safetensors file
// of the same tensors; with no FILE a multi-GB bf16 model of both kinds is
// generated in --dir):
//   pinned H2D ceiling         measure_pinned_h2d (cudaMemcpyAsync from one pinned buffer,
//                              over max(tensor bytes, 1 GiB); measured after the rows below)
//   safeckpt warm, new engine  engine created inside the timed region (pins its ring); for the
//                              first file the first engine of the process, after the CUDA context
//   safeckpt warm              engine reused (the intended use: one engine per process)
//   plain O_DIRECT read        the file read with O_DIRECT by as many threads as our readers (disk ceiling)
//   safeckpt cold              page cache dropped (/proc/sys/vm/drop_caches, else posix_fadvise)
//                              right before the timed load, else read with O_DIRECT (io mode
//                              forced); reused engine
//   baselines                  "ROW\t..." lines of --baselines CMD FILE... (bench/torch_baselines.py files)
// Every timed load starts --settle-ms (default 300) after the previous load's
// arena was freed: right after a 6 GiB cudaFree, the next load's copies ran at
// ~25 GB/s with 3-5 ms latency for their first ~20 ms (work the driver does
// after the free), which a process loading its checkpoint once never sees
// (bench/RESULTS.md: 43.9-44.6 GB/s with no pause, 45.6-46.4 with 300 ms).
// Columns: seconds (median of --runs), GB/s of tensor bytes (1e9), time to
// first tensor (call until the first storage is complete on the device, after
// the CUDA context exists; includes host parse and, for a new engine, its
// creation), peak host RSS growth (VmHWM after minus VmRSS before, peak reset
// through /proc/self/clear_refs), device overhead (drop of cudaMemGetInfo
// while the checkpoint is alive, minus tensor bytes). Generated files are
// removed at the end unless --keep.
// Exit codes: 0 measured, 1 a load failed, 2 usage / no CUDA device / no CUDA build.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "probes.hpp"
#include "safeckpt/error.hpp"

#ifdef SAFECKPT_HAVE_CUDA
#include "safeckpt/builder.hpp"
#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"
#endif

namespace safeckpt::cli {
namespace {

struct BenchArgs {
  std::vector<std::string> files;
  std::string device = "cuda:0";
  std::string dir;
  std::string baselines;
  double gen_gib = 6.0;
  int runs = 5;
  int settle_ms = 300;
  bool no_cold = false;
  bool keep = false;
  unsigned threads = 0;
  std::uint64_t ring_mib = 0;
  std::uint64_t chunk_kib = 0;
  unsigned streams = 0;
  bool pageable = false;
};

// "cuda", "cuda:N" or "N" -> N.
Result<int> parse_device(const std::string& s) {
  std::string t = s;
  if (t == "cuda") return 0;
  if (t.rfind("cuda:", 0) == 0) t = t.substr(5);
  if (t.empty() || t.size() > 3 || t.find_first_not_of("0123456789") != std::string::npos)
    return make_error(ErrorCode::kInvalidArgument, "--device must be cuda, cuda:N or N, got '" + s + "'");
  return std::stoi(t);
}

#ifdef SAFECKPT_HAVE_CUDA

// 'text' for /bin/sh, with embedded single quotes as '\''.
std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

using Clock = std::chrono::steady_clock;
using bench::drop_page_cache;
using bench::odirect_read_gbps;
using bench::RssProbe;
using bench::warm_page_cache;
constexpr double kMiB = 1024.0 * 1024.0;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- generated input --------------------------------------------------------

// A Llama-style bf16 state_dict of about `gib` GiB (hidden 4096, MLP 11008,
// vocab 32000; layers scaled to the size), random values of moderate
// magnitude. Written as DIR/safeckpt-bench-bf16.pt (torch.save zip through
// safeckpt::save) and .safetensors (the same tensors).
Status generate(const std::filesystem::path& pt, const std::filesystem::path& st, double gib, std::string* note) {
  struct Spec {
    std::string name;
    std::vector<std::int64_t> shape;
  };
  constexpr std::int64_t kHidden = 4096, kMlp = 11008, kVocab = 32000;
  const double per_layer = (4.0 * kHidden * kHidden + 3.0 * kHidden * kMlp + 2.0 * kHidden) * 2;
  const double fixed = (2.0 * kVocab * kHidden + kHidden) * 2;
  const auto layers = static_cast<int>(std::max(1.0, (gib * 1024 * kMiB - fixed) / per_layer + 0.5));
  std::vector<Spec> specs = {{"model.embed_tokens.weight", {kVocab, kHidden}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* w : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"})
      specs.push_back({p + w + ".weight", {kHidden, kHidden}});
    specs.push_back({p + "mlp.gate_proj.weight", {kMlp, kHidden}});
    specs.push_back({p + "mlp.up_proj.weight", {kMlp, kHidden}});
    specs.push_back({p + "mlp.down_proj.weight", {kHidden, kMlp}});
    specs.push_back({p + "input_layernorm.weight", {kHidden}});
    specs.push_back({p + "post_attention_layernorm.weight", {kHidden}});
  }
  specs.push_back({"model.norm.weight", {kHidden}});
  specs.push_back({"lm_head.weight", {kVocab, kHidden}});

  const auto t0 = Clock::now();
  std::vector<std::vector<std::uint8_t>> data(specs.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> ts;
  const unsigned nt = std::max(2u, std::min(16u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < nt; ++t)
    ts.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < specs.size();) {
        std::uint64_t numel = 1;
        for (auto d : specs[i].shape) numel *= static_cast<std::uint64_t>(d);
        data[i].resize(numel * 2);
        std::uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
        for (std::uint64_t k = 0; k < numel; k += 4) {  // splitmix64, 4 bf16 per draw
          x += 0x9E3779B97F4A7C15ull;
          std::uint64_t z = x;
          z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
          z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
          z ^= z >> 31;
          for (std::uint64_t j = 0; j < 4 && k + j < numel; ++j) {
            const auto r = static_cast<std::uint16_t>(z >> (16 * j));
            // sign, exponent 119..126 (|v| in [2^-8, 1)), 7 mantissa bits
            const auto v = static_cast<std::uint16_t>((r & 0x8000) | ((119 + ((r >> 7) & 7)) << 7) | (r & 0x7F));
            data[i][2 * (k + j)] = static_cast<std::uint8_t>(v);
            data[i][2 * (k + j) + 1] = static_cast<std::uint8_t>(v >> 8);
          }
        }
      }
    });
  for (auto& t : ts) t.join();
  CheckpointBuilder b;
  for (std::size_t i = 0; i < specs.size(); ++i)
    SAFECKPT_CHECK(b.add_state_dict_tensor(specs[i].name, DType::kBFloat16, specs[i].shape, std::move(data[i])));
  SAFECKPT_TRY(Checkpoint ckpt, std::move(b).finish());
  const double gen_s = since(t0);
  SaveOptions so;
  so.overwrite = true;
  const auto t1 = Clock::now();
  SAFECKPT_CHECK(save(pt, ckpt, so));
  SAFECKPT_CHECK(save_checkpoint_as_safetensors(st, ckpt, {}, so));
  char buf[200];
  std::snprintf(buf, sizeof buf, "generated: %zu bf16 tensors (%d layers), %.1f s to fill, %.1f s to save both",
                specs.size(), layers, gen_s, since(t1));
  *note = buf;
  return {};
}

// ---- measurements -----------------------------------------------------------

struct Row {
  std::string what, file, mode;
  std::uint64_t bytes = 0;  // tensor bytes loaded (our rows)
  double seconds = -1, gbps = -1, first_ms = -1, rss_mib = -1, dev_mib = -1;
  std::string note;
};

std::uint64_t free_device(int dev) {
  auto m = cuda::device_memory(dev);
  return m ? m->free_bytes : 0;
}

struct OneLoad {
  double seconds = 0, first = 0, rss = 0, dev = 0, parse = 0, create = 0;
  cuda::LoadStats stats;
};

// One load_to_device; `engine` null = create one inside the timed region.
Result<OneLoad> one_load(const std::string& path, const cuda::DeviceLoadOptions& o, cuda::TransferEngine* engine) {
  OneLoad r;
  RssProbe rss;
  rss.start();
  const int dev = o.transfer.device;
  const std::uint64_t free0 = free_device(dev);
  const auto t0 = Clock::now();
  std::optional<cuda::TransferEngine> fresh;
  if (!engine) {
    auto e = cuda::TransferEngine::create(o.transfer);
    if (!e) return unexpected(std::move(e).error());
    fresh.emplace(std::move(*e));
    engine = &*fresh;
  }
  r.create = since(t0);
  auto d = cuda::load_to_device(path, o, engine, &r.stats);
  r.seconds = since(t0);
  if (!d) return unexpected(std::move(d).error());
  // Before the engine's transfer started: engine creation + host parse.
  r.parse = r.seconds - r.create - r.stats.seconds;
  r.first = r.seconds - r.stats.seconds + r.stats.seconds_to_first_storage;
  r.dev =
      (static_cast<double>(free0) - static_cast<double>(free_device(dev)) - static_cast<double>(r.stats.bytes)) / kMiB;
  r.rss = rss.growth_mib();
  return r;
}

std::string fmt_ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", s * 1e3);
  return b;
}

// Median of `runs` loads (engine reused when `reuse`), as a row.
// `before_each` runs before every timed load (after the reused engine's
// warm-up load), e.g. to drop the page cache for a cold row.
Result<Row> measure(const std::string& what, const std::string& path, const cuda::DeviceLoadOptions& o, bool reuse,
                    int runs, const std::function<void()>& before_each = {}) {
  std::optional<cuda::TransferEngine> eng;
  if (reuse) {
    auto e = cuda::TransferEngine::create(o.transfer);
    if (!e) return unexpected(std::move(e).error());
    eng.emplace(std::move(*e));
    auto warmup = one_load(path, o, &*eng);  // grows the ring, loads the kernel
    if (!warmup) return unexpected(std::move(warmup).error());
  }
  std::vector<OneLoad> all;
  for (int i = 0; i < runs; ++i) {
    if (before_each) before_each();
    auto r = one_load(path, o, eng ? &*eng : nullptr);
    if (!r) return unexpected(std::move(r).error());
    all.push_back(*r);
  }
  std::sort(all.begin(), all.end(), [](const OneLoad& a, const OneLoad& b) { return a.seconds < b.seconds; });
  const OneLoad& m = all[all.size() / 2];
  Row row;
  row.what = what;
  row.file = std::filesystem::path(path).filename().string();
  row.mode = std::string(cuda::io_mode_name(m.stats.io_mode)) + " r" + std::to_string(m.stats.reader_threads) + " s" +
             std::to_string(m.stats.streams) + " c" +
             (o.transfer.chunk_bytes % (1u << 20) == 0 ? std::to_string(o.transfer.chunk_bytes >> 20) + "M"
                                                       : std::to_string(o.transfer.chunk_bytes >> 10) + "K");
  row.bytes = m.stats.bytes;
  row.seconds = m.seconds;
  row.gbps = static_cast<double>(m.stats.bytes) / m.seconds / 1e9;
  row.first_ms = m.first * 1e3;
  for (const auto& r : all) {
    row.rss_mib = std::max(row.rss_mib, r.rss);
    row.dev_mib = std::max(row.dev_mib, r.dev);
  }
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "n=%d; before transfer %s ms (engine %s, parse+verify %s), arena cudaMalloc %s ms, first copy issued "
                "at %s ms, ",
                runs, fmt_ms(m.seconds - m.stats.seconds).c_str(), fmt_ms(m.create).c_str(), fmt_ms(m.parse).c_str(),
                fmt_ms(m.stats.seconds_device_alloc).c_str(),
                fmt_ms(m.seconds - m.stats.seconds + m.stats.seconds_to_first_copy).c_str());
  row.note = buf;
  std::snprintf(buf, sizeof buf,
                "pinned %zu slots in %s ms (ring pinned %s ms after engine creation), %llu of %llu chunks staged "
                "pageable, ring peak %.0f MiB",
                m.stats.slots_pinned, fmt_ms(m.stats.seconds_pinning).c_str(),
                m.stats.seconds_ring_ready > 0 ? fmt_ms(m.stats.seconds_ring_ready).c_str() : "—",
                static_cast<unsigned long long>(m.stats.pageable_chunks),
                static_cast<unsigned long long>(m.stats.chunks), static_cast<double>(m.stats.peak_ring_bytes) / kMiB);
  row.note += buf;
  return row;
}

void print_table(const std::vector<Row>& rows) {
  std::printf(
      "| what | file | mode | s | GB/s | first tensor ms | peak RSS growth MiB | device overhead MiB | notes |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  auto num = [](double v, const char* f) {
    if (v < 0) return std::string("—");
    char b[32];
    std::snprintf(b, sizeof b, f, v);
    return std::string(b);
  };
  for (const auto& r : rows)
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(), r.file.c_str(), r.mode.c_str(),
                num(r.seconds, "%.3f").c_str(), num(r.gbps, "%.1f").c_str(), num(r.first_ms, "%.1f").c_str(),
                num(r.rss_mib, "%.0f").c_str(), num(r.dev_mib, "%.0f").c_str(), r.note.c_str());
}

// "ROW\twhat\tmode\ts\tGB/s\tfirst_ms\trss\tdev\tnote" lines of the companion script.
void run_baselines(const std::string& cmd, std::vector<Row>& rows) {
  std::fprintf(stderr, "bench: running baselines: %s\n", cmd.c_str());
  std::fflush(stderr);
  for (auto& b : bench::run_baseline_command(cmd, stderr)) {
    Row r;
    r.what = b.what;
    r.mode = b.mode;
    r.seconds = b.seconds;
    r.gbps = b.gbps;
    r.first_ms = b.first_ms;
    r.rss_mib = b.rss_mib;
    r.dev_mib = b.dev_mib;
    // The script's notes start with the file name: "model.pt; ...".
    const auto semi = b.note.find("; ");
    r.file = semi == std::string::npos ? "" : b.note.substr(0, semi);
    r.note = semi == std::string::npos ? b.note : b.note.substr(semi + 2);
    rows.push_back(std::move(r));
  }
}

int run_bench(const BenchArgs& a, int device) {
  if (cuda::device_count() <= device) {
    std::fprintf(stderr, "safeckpt bench: no CUDA device %d visible (%d device(s)); the benchmark needs a GPU\n",
                 device, cuda::device_count());
    return 2;
  }
  const auto tc = Clock::now();
  if (auto m = cuda::device_memory(device); !m) {  // creates the CUDA context, outside every row
    std::fprintf(stderr, "safeckpt bench: %s\n", m.error().to_string().c_str());
    return 2;
  }
  const double context_ms = since(tc) * 1e3;
  auto desc = cuda::device_description(device);

  std::vector<std::string> files = a.files;
  std::vector<std::string> generated;  // removed at the end unless --keep
  std::error_code ec_ignored;
  std::string input_note;
  if (files.empty()) {
    const std::filesystem::path dir =
        a.dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(a.dir);
    const auto pt = dir / "safeckpt-bench-bf16.pt", st = dir / "safeckpt-bench-bf16.safetensors";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::fprintf(stderr, "bench: generating a %.1f GiB bf16 checkpoint in %s ...\n", a.gen_gib, dir.c_str());
    if (auto g = generate(pt, st, a.gen_gib, &input_note); !g) {
      std::fprintf(stderr, "safeckpt bench: cannot generate the checkpoint: %s\n", g.error().to_string().c_str());
      std::filesystem::remove(pt, ec);  // the first file may have been written
      return 2;
    }
    files = {pt.string(), st.string()};
    generated = files;
  }

  cuda::DeviceLoadOptions o;
  o.map_location = "cuda:" + std::to_string(device);
  o.transfer.device = device;
  if (a.threads) o.transfer.reader_threads = a.threads;
  if (a.ring_mib) o.transfer.ring_bytes = a.ring_mib << 20;
  if (a.chunk_kib) o.transfer.chunk_bytes = a.chunk_kib << 10;
  if (a.streams) o.transfer.streams = a.streams;
  o.transfer.pageable_staging = a.pageable;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned readers = o.transfer.reader_threads ? o.transfer.reader_threads : std::min(16u, hw);

  std::vector<Row> rows;
  struct Summary {
    std::string file;
    double warm = -1, cold = -1, odirect = -1, first_new = -1, rss = -1, dev = -1;
  };
  std::vector<Summary> sums;
  int rc = 0;
  auto add = [&](Result<Row> r, const std::string& file) -> const Row* {
    if (!r) {
      std::fprintf(stderr, "safeckpt bench: %s: %s\n", file.c_str(), r.error().to_string().c_str());
      rc = 1;
      return nullptr;
    }
    rows.push_back(std::move(*r));
    std::fprintf(stderr, "bench: %s %s: %.1f GB/s, first tensor %.1f ms\n", rows.back().what.c_str(),
                 rows.back().file.c_str(), rows.back().gbps, rows.back().first_ms);
    return &rows.back();
  };
  std::uint64_t bytes = 0;  // tensor bytes of the first file
  for (const auto& f : files) {
    Summary s;
    s.file = std::filesystem::path(f).filename().string();
    // Warm rows first: the first file's "new engine" row is then the first
    // engine of this process (only the CUDA context exists before it).
    warm_page_cache(f);
    auto settle = [&] { std::this_thread::sleep_for(std::chrono::milliseconds(a.settle_ms)); };
    if (const Row* r = add(measure("safeckpt warm, new engine", f, o, false, a.runs, settle), f)) {
      s.first_new = r->first_ms;
      s.rss = r->rss_mib;
      s.dev = r->dev_mib;
      if (bytes == 0) bytes = r->bytes;
    }
    if (const Row* r = add(measure("safeckpt warm", f, o, true, a.runs, settle), f)) s.warm = r->gbps;
    if (!a.no_cold) {
      std::string how = drop_page_cache({f});
      Row od;
      od.what = "plain O_DIRECT read (disk ceiling)";
      od.file = s.file;
      od.mode = "odirect r" + std::to_string(readers) + " c4M";
      RssProbe rss;
      rss.start();
      double secs = 0;
      od.gbps = odirect_read_gbps(f, readers, 4ull << 20, &secs);
      od.seconds = od.gbps > 0 ? secs : -1;
      od.rss_mib = rss.growth_mib();
      od.note = od.gbps > 0 ? "whole file, no GPU" : "O_DIRECT refused by the file system";
      s.odirect = od.gbps;
      rows.push_back(od);
      auto oc = o;
      if (how.empty()) oc.transfer.io_mode = cuda::IoMode::kODirect;  // cannot drop the cache: bypass it
      // The engine's warm-up load reads the file too: drop the cache again
      // right before the timed load.
      if (const Row* r = add(measure("safeckpt cold", f, oc, true, 1,
                                     [&] {
                                       settle();
                                       how = drop_page_cache({f});
                                     }),
                             f)) {
        rows.back().note =
            (how.empty() ? "page cache not droppable, O_DIRECT forced; " : "cache dropped via " + how + "; ") + r->note;
        s.cold = r->gbps;
      }
    }
    sums.push_back(s);
  }
  // The pinned ceiling, after our rows (it pins 256 MiB of its own), over
  // at least 1 GiB so small files still get a meaningful figure.
  double ceiling = -1;
  if (auto c = cuda::measure_pinned_h2d(device, std::max<std::uint64_t>(bytes, 1ull << 30)); c) {
    ceiling = *c;
    Row r;
    r.what = "pinned H2D ceiling";
    r.mode = "cudaMemcpyAsync 16M x 4 streams";
    r.gbps = ceiling;
    r.seconds = static_cast<double>(bytes) / ceiling / 1e9;
    r.note = "time for the same bytes; copies from one pinned buffer, median of 3 over max(bytes, 1 GiB)";
    rows.insert(rows.begin(), r);
  } else {
    std::fprintf(stderr, "safeckpt bench: pinned ceiling: %s\n", c.error().to_string().c_str());
  }
  if (!a.baselines.empty()) {
    std::string cmd = a.baselines;
    for (const auto& f : files) cmd += " " + shell_quote(f);
    if (a.no_cold) cmd += " --no-cold";
    run_baselines(cmd, rows);
  }

  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::gmtime(&now));
  std::printf("\n### safeckpt bench — %s\n\n", date);
  std::printf(
      "device: %s; %u CPU threads; CUDA context creation %.0f ms (before every row); each timed load %d ms after "
      "the previous one's device memory was freed\n",
      desc ? desc->c_str() : "?", hw, context_ms, a.settle_ms);
  std::printf("input: %.2f GiB of tensors", static_cast<double>(bytes) / (1ull << 30));
  for (const auto& f : files) std::printf(" %s", f.c_str());
  std::printf("%s%s\n\n", input_note.empty() ? "" : "; ", input_note.c_str());
  print_table(rows);
  // Baselines by kind, for the ratio targets.
  double torch_load = -1, st_load = -1;
  for (const auto& r : rows) {
    if (r.mode != "warm") continue;
    if (r.what == "torch.load(map_location=cuda)") torch_load = std::max(torch_load, r.gbps);
    if (r.what == "safetensors load_file(cuda)") st_load = std::max(st_load, r.gbps);
  }
  std::printf("\ntargets (issue 5):\n");
  for (const auto& s : sums) {
    if (s.warm > 0) {
      std::printf("- %s warm: %.1f GB/s", s.file.c_str(), s.warm);
      if (ceiling > 0) std::printf(" = %.0f%% of the pinned ceiling", 100.0 * s.warm / ceiling);
      std::printf(" (target >= 45 GB/s and >= 80%%)");
      if (st_load > 0) std::printf("; %.1fx safetensors (>= 8x)", s.warm / st_load);
      if (torch_load > 0) std::printf("; %.1fx torch.load (>= 40x)", s.warm / torch_load);
      std::printf("\n");
    }
    if (s.cold > 0 && s.odirect > 0)
      std::printf("- %s cold: %.2f GB/s = %.0f%% of plain O_DIRECT read (target >= 90%%)\n", s.file.c_str(), s.cold,
                  100.0 * s.cold / s.odirect);
    if (s.first_new >= 0)
      std::printf(
          "- %s new engine: first tensor %.1f ms (target <= 20), peak RSS growth %s MiB (<= 1024), device "
          "overhead %.0f MiB (<= 256)\n",
          s.file.c_str(), s.first_new, s.rss >= 0 ? std::to_string(std::lround(s.rss)).c_str() : "?", s.dev);
  }
  if (!generated.empty() && !a.keep) {
    for (const auto& g : generated) std::filesystem::remove(g, ec_ignored);
    std::fprintf(stderr, "bench: removed the generated files (--keep keeps them)\n");
  }
  return rc;
}

#endif  // SAFECKPT_HAVE_CUDA

}  // namespace

void register_bench(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure checkpoint -> GPU loading against the pinned-copy and O_DIRECT ceilings (and PyTorch / "
      "safetensors with --baselines), one table.\n"
      "Exit codes: 0 measured, 1 a load failed, 2 usage error, no CUDA device or a build without CUDA.");
  cmd->add_option(
      "FILE", args->files,
      "checkpoint(s) to load: a PyTorch file and/or a .safetensors file of the same tensors; none = generate "
      "a bf16 model of --gen-gib GiB in --dir");
  cmd->add_option("--device", args->device, "CUDA device: cuda, cuda:N or N")->capture_default_str();
  cmd->add_option("--settle-ms", args->settle_ms,
                  "idle time before each timed load, after the previous load's device memory was freed")
      ->capture_default_str()
      ->check(CLI::Range(0, 60000));
  cmd->add_option("--runs", args->runs, "loads per warm row (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--dir", args->dir, "where to generate the checkpoint (default: the temp directory)");
  cmd->add_option("--gen-gib", args->gen_gib,
                  "tensor bytes of the generated model (written twice: as a torch.save zip and as safetensors)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 1024.0));
  cmd->add_option("--baselines", args->baselines,
                  "command printing ROW lines for the same files, which are appended to it, e.g. "
                  "\"python3 bench/torch_baselines.py files\"");
  cmd->add_flag("--no-cold", args->no_cold, "skip the rows that drop the page cache");
  cmd->add_flag("--keep", args->keep, "keep the generated checkpoint files (removed by default)");
  cmd->add_option("--threads", args->threads, "reader threads (default min(16, hardware threads))")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--ring-mib", args->ring_mib, "pinned staging ring in MiB, >= one chunk (default 128)")
      ->check(CLI::Range(1, 16 << 10));
  cmd->add_option("--chunk-kib", args->chunk_kib, "bytes per read and per copy, in KiB, a multiple of 4 (default 4096)")
      ->check(CLI::Range(64, 1 << 20));
  cmd->add_option("--streams", args->streams, "CUDA streams (default 4)")->check(CLI::Range(1, 64));
  cmd->add_flag("--pageable-staging", args->pageable,
                "stage chunks in pageable memory instead of the pinned ring (TransferOptions::pageable_staging)");
  cmd->callback([args, &exit_code] {
    auto dev = parse_device(args->device);
    if (!dev) {
      std::fprintf(stderr, "safeckpt bench: %s\n", dev.error().message().c_str());
      exit_code = 2;
      return;
    }
#ifdef SAFECKPT_HAVE_CUDA
    exit_code = run_bench(*args, *dev);
#else
    std::fprintf(stderr, "safeckpt bench: this safeckpt was built without CUDA (configure with -DSAFECKPT_CUDA=ON)\n");
    exit_code = 2;
#endif
  });
}

}  // namespace safeckpt::cli
