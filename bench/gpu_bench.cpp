// bench/gpu_bench.cpp — how fast storages reach GPU memory, against the
// ceilings and baselines measured in the same run (issue 5).
//
// Input: a file plus its storage ranges. Until the checkpoint loader is wired
// in, ranges come from --ranges (lines "offset nbytes [crc32-hex]", as written
// by bench/torch_baselines.py for a torch.save file, so every loader reads
// the same bytes), or the whole --file is cut into 64 MiB storages, or, with
// no --file, a file of 96 random 64 MiB storages (6 GiB, a bf16 model's
// worth) is generated in --dir.
//
// Rows (one table, printed last):
//   pinned H2D ceiling      cudaMemcpyAsync from one pinned buffer, 16 MiB chunks, 4 streams
//   O_DIRECT read           plain O_DIRECT preads of the file, same threads and chunk size as ours, no GPU
//   ours cold (auto/pread)  after dropping the page cache (/proc/sys/vm/drop_caches, else posix_fadvise)
//   ours warm ...           file in the page cache; fresh engine (pins its ring) and reused engine;
//                           mmap+cudaHostRegister; CRC on; 2-byte swap kernel on
//   torch / safetensors     rows printed by --baselines "python3 bench/torch_baselines.py run DIR"
// Columns: seconds (median of --repeat runs for warm rows), GB/s of storage
// bytes (1e9), time to first tensor (engine creation + until the first
// storage is complete on the device; the CUDA context is created before and
// timed separately), peak host RSS growth (VmHWM after the row minus VmRSS
// before it, peak reset through /proc/self/clear_refs), device memory
// overhead (cudaMemGetInfo drop while the arena lives, minus storage bytes).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "probes.hpp"
#include "safeckpt/cuda.hpp"

namespace sc = safeckpt::cuda;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "gpu_bench: %s\n", m.c_str());
  std::exit(2);
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

using safeckpt::bench::odirect_read_gbps;
using safeckpt::bench::RssProbe;
using safeckpt::bench::warm_page_cache;

std::string drop_page_cache(const std::string& path) {
  const std::string how = safeckpt::bench::drop_page_cache({path});
  return how.empty() ? "none" : how;
}

// ---- input --------------------------------------------------------------

std::vector<sc::StorageSource> read_ranges(const std::string& path) {
  std::ifstream f(path);
  if (!f) die("cannot open ranges file " + path);
  std::vector<sc::StorageSource> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    sc::StorageSource s;
    std::string crc;
    if (!(is >> s.file_offset >> s.nbytes)) die("bad line in " + path + ": " + line);
    if (is >> crc) s.expected_crc32 = static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16));
    out.push_back(s);
  }
  return out;
}

std::uint64_t file_size(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) die("stat " + path);
  return static_cast<std::uint64_t>(sb.st_size);
}

// 96 x 64 MiB of random bytes (with CRCs), written with several threads.
std::vector<sc::StorageSource> generate(const std::string& path, unsigned count, std::uint64_t each) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("create " + path);
  std::vector<sc::StorageSource> out(count);
  std::atomic<unsigned> next{0};
  const unsigned nt = std::max(2u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < nt; ++t)
    ts.emplace_back([&] {
      std::vector<std::uint64_t> buf(each / 8);
      for (;;) {
        const unsigned i = next.fetch_add(1);
        if (i >= count) break;
        std::uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
        for (auto& w : buf) {  // splitmix64
          x += 0x9E3779B97F4A7C15ull;
          std::uint64_t z = x;
          z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
          z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
          w = z ^ (z >> 31);
        }
        const auto* bytes = reinterpret_cast<const std::uint8_t*>(buf.data());
        out[i] = sc::StorageSource{i * each, each, 1, sc::crc32_update(0, bytes, each), nullptr};
        if (::pwrite(fd, bytes, each, static_cast<off_t>(i * each)) != static_cast<ssize_t>(each)) die("write");
      }
    });
  for (auto& t : ts) t.join();
  ::fsync(fd);
  ::close(fd);
  return out;
}

// ---- measurements -------------------------------------------------------

struct Row {
  std::string what, mode;
  double seconds = -1, gbps = -1, first_ms = -1, rss_mib = -1, dev_mib = -1;
  std::string note;
};

std::uint64_t free_device(int dev) {
  auto m = sc::device_memory(dev);
  return m ? m->free_bytes : 0;
}

struct LoadRun {
  double seconds = 0, first = 0, rss = 0, dev = 0;
  sc::LoadStats stats;
};

// One load; fresh: create the engine inside the timed region.
LoadRun one_load(const std::string& path, const std::vector<sc::StorageSource>& src, const sc::TransferOptions& opt,
                 sc::TransferEngine* reused, int dev) {
  LoadRun r;
  RssProbe rss;
  rss.start();
  const std::uint64_t free0 = free_device(dev);
  std::uint64_t bytes = 0;
  for (const auto& s : src) bytes += s.nbytes;
  const auto t0 = Clock::now();
  std::optional<sc::TransferEngine> fresh;
  sc::TransferEngine* eng = reused;
  if (!eng) {
    auto e = sc::TransferEngine::create(opt);
    if (!e) die(e.error().to_string());
    fresh.emplace(std::move(*e));
    eng = &*fresh;
  }
  const double create_s = since(t0);
  auto arena = eng->load(path, src, &r.stats);
  r.seconds = since(t0);
  if (!arena) die("load failed: " + arena.error().to_string());
  r.first = create_s + r.stats.seconds_to_first_storage;
  const std::uint64_t free1 = free_device(dev);
  r.dev = (static_cast<double>(free0) - static_cast<double>(free1) - static_cast<double>(bytes)) / kMiB;
  r.rss = rss.growth_mib();
  return r;
}

Row measure(const std::string& what, const std::string& path, const std::vector<sc::StorageSource>& src,
            const sc::TransferOptions& opt, bool reuse_engine, int repeat, int dev, const std::string& note = {}) {
  std::optional<sc::TransferEngine> eng;
  if (reuse_engine) {
    auto e = sc::TransferEngine::create(opt);
    if (!e) die(e.error().to_string());
    eng.emplace(std::move(*e));
    (void)one_load(path, src, opt, &*eng, dev);  // pins the ring, loads the kernel
  }
  std::vector<LoadRun> runs;
  for (int i = 0; i < repeat; ++i) runs.push_back(one_load(path, src, opt, eng ? &*eng : nullptr, dev));
  std::sort(runs.begin(), runs.end(), [](const LoadRun& a, const LoadRun& b) { return a.seconds < b.seconds; });
  const LoadRun& m = runs[runs.size() / 2];
  double rss = 0, devo = 0;
  for (const auto& r : runs) {
    rss = std::max(rss, r.rss);
    devo = std::max(devo, r.dev);
  }
  Row row;
  row.what = what;
  row.mode = std::string(sc::io_mode_name(m.stats.io_mode)) + " r" + std::to_string(m.stats.reader_threads) + " s" +
             std::to_string(m.stats.streams) + " c" + std::to_string(opt.chunk_bytes >> 20) + "M";
  row.seconds = m.seconds;
  row.gbps = static_cast<double>(m.stats.bytes) / m.seconds / 1e9;
  row.first_ms = m.first * 1e3;
  row.rss_mib = rss;
  row.dev_mib = devo;
  char buf[160];
  std::snprintf(buf, sizeof buf, "n=%d, peak ring %.0f MiB", repeat,
                static_cast<double>(m.stats.peak_ring_bytes) / kMiB);
  row.note = buf;
  if (!note.empty()) row.note += ", " + note;
  return row;
}

void print_table(const std::vector<Row>& rows, std::FILE* out) {
  std::fprintf(out,
               "| what | mode | s | GB/s | first tensor ms | peak RSS growth MiB | device overhead MiB | notes |\n");
  std::fprintf(out, "|---|---|---|---|---|---|---|---|\n");
  auto num = [](double v, const char* fmt) {
    if (v < 0) return std::string("—");
    char b[32];
    std::snprintf(b, sizeof b, fmt, v);
    return std::string(b);
  };
  for (const auto& r : rows)
    std::fprintf(out, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(), r.mode.c_str(),
                 num(r.seconds, "%.3f").c_str(), num(r.gbps, "%.1f").c_str(), num(r.first_ms, "%.1f").c_str(),
                 num(r.rss_mib, "%.0f").c_str(), num(r.dev_mib, "%.0f").c_str(), r.note.c_str());
}

void usage() {
  std::puts(
      "usage: safeckpt_gpu_bench [--file F [--ranges R]] [--dir D] [--device N] [--threads N] [--streams N]\n"
      "                          [--chunk-mib N] [--ring-mib N] [--repeat N] [--no-cold] [--sweep FILE]\n"
      "                          [--baselines CMD] [--gen-storages N] [--gen-mib M]\n"
      "  no --file: generates D/safeckpt_bench_raw.bin (N x M MiB random storages, default 96 x 64 MiB;\n"
      "             D defaults to .)\n"
      "  --ranges: lines 'offset nbytes [crc32-hex]' (bench/torch_baselines.py make writes them)\n"
      "  --baselines: a command printing 'ROW\\t...' lines (bench/torch_baselines.py run ...)\n"
      "  --sweep: also time reader/chunk variants (warm, reused engine) into FILE");
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, ranges, dir = ".", baselines, sweep_out;
  int device = 0, repeat = 3;
  unsigned gen_count = 96;
  std::uint64_t gen_mib = 64;
  bool cold = true;
  sc::TransferOptions opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--file")
      file = val();
    else if (a == "--ranges")
      ranges = val();
    else if (a == "--dir")
      dir = val();
    else if (a == "--device")
      device = std::stoi(val());
    else if (a == "--threads")
      opt.reader_threads = static_cast<unsigned>(std::stoul(val()));
    else if (a == "--streams")
      opt.streams = static_cast<unsigned>(std::stoul(val()));
    else if (a == "--chunk-mib")
      opt.chunk_bytes = std::stoull(val()) << 20;
    else if (a == "--ring-mib")
      opt.ring_bytes = std::stoull(val()) << 20;
    else if (a == "--repeat")
      repeat = std::max(1, std::stoi(val()));
    else if (a == "--no-cold")
      cold = false;
    else if (a == "--gen-storages")
      gen_count = static_cast<unsigned>(std::stoul(val()));
    else if (a == "--gen-mib")
      gen_mib = std::stoull(val());
    else if (a == "--sweep")
      sweep_out = val();
    else if (a == "--baselines")
      baselines = val();
    else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      usage();
      die("unknown argument " + a);
    }
  }
  opt.device = device;

  if (sc::device_count() == 0) {
    std::puts("SKIP: no CUDA device");
    return 0;
  }
  // CUDA context first, timed on its own.
  const auto tc = Clock::now();
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaFree(nullptr), "context creation");
  const double context_ms = since(tc) * 1e3;
  auto desc = sc::device_description(device);
  const unsigned hw = std::thread::hardware_concurrency();

  // Input.
  std::vector<sc::StorageSource> src;
  std::string note_input;
  if (file.empty()) {
    file = (std::filesystem::path(dir) / "safeckpt_bench_raw.bin").string();
    const auto t0 = Clock::now();
    src = generate(file, gen_count, gen_mib << 20);
    note_input = "generated " + std::to_string(gen_count) + " x " + std::to_string(gen_mib) +
                 " MiB random storages in " + std::to_string(since(t0)).substr(0, 5) + " s";
  } else if (!ranges.empty()) {
    src = read_ranges(ranges);
    note_input = "ranges from " + ranges;
  } else {
    const std::uint64_t size = file_size(file), each = 64ull << 20;
    for (std::uint64_t off = 0; off < size; off += each)
      src.push_back({off, std::min(each, size - off), 1, 0, nullptr});
    note_input = "whole file as 64 MiB storages";
  }
  std::uint64_t bytes = 0;
  bool have_crc = false;
  for (const auto& s : src) {
    bytes += s.nbytes;
    have_crc |= s.expected_crc32 != 0;
  }
  const unsigned readers = opt.reader_threads ? opt.reader_threads : std::min(16u, hw ? hw : 4u);

  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  std::fprintf(stderr, "gpu_bench: %s\n", date);
  std::fprintf(stderr, "device: %s; %u CPU threads; context creation %.1f ms\n", desc ? desc->c_str() : "?", hw,
               context_ms);
  std::fprintf(stderr, "input: %s, %zu storages, %.2f GiB (%s)\n", file.c_str(), src.size(),
               static_cast<double>(bytes) / (1ull << 30), note_input.c_str());

  std::vector<Row> rows;
  // 1. Pinned ceiling.
  {
    Row r;
    r.what = "pinned H2D ceiling";
    r.mode = "cudaMemcpyAsync 16M x 4 streams";
    auto c = sc::measure_pinned_h2d(device, bytes);  // 16 MiB copies over 4 streams, median of 3
    if (!c) die(c.error().to_string());
    r.gbps = *c;
    r.seconds = static_cast<double>(bytes) / r.gbps / 1e9;
    r.note = "same bytes from one 256 MiB pinned buffer, median of 3";
    rows.push_back(r);
    std::fprintf(stderr, "pinned ceiling %.1f GB/s\n", r.gbps);
  }
  const double ceiling = rows[0].gbps;

  // 2. Cold rows.
  double odirect_gbps = -1;
  if (cold) {
    std::string how = drop_page_cache(file);
    {
      Row r;
      r.what = "plain O_DIRECT read (no GPU)";
      r.mode = "odirect r" + std::to_string(readers) + " c" + std::to_string(opt.chunk_bytes >> 20) + "M";
      RssProbe rss;
      rss.start();
      double s = 0;
      r.gbps = odirect_read_gbps(file, readers, opt.chunk_bytes, &s);
      r.seconds = r.gbps > 0 ? s : -1;
      r.rss_mib = rss.growth_mib();
      r.note = r.gbps > 0 ? "whole file" : "O_DIRECT refused by the file system";
      odirect_gbps = r.gbps;
      rows.push_back(r);
      std::fprintf(stderr, "O_DIRECT read %.2f GB/s\n", r.gbps);
    }
    how = drop_page_cache(file);
    {
      auto o = opt;
      o.io_mode = sc::IoMode::kAuto;
      rows.push_back(measure("ours cold", file, src, o, false, 1, device, "cache dropped via " + how));
      std::fprintf(stderr, "cold auto %.2f GB/s\n", rows.back().gbps);
    }
    how = drop_page_cache(file);
    {
      auto o = opt;
      o.io_mode = sc::IoMode::kPread;
      rows.push_back(measure("ours cold (buffered)", file, src, o, false, 1, device, "cache dropped via " + how));
      std::fprintf(stderr, "cold pread %.2f GB/s\n", rows.back().gbps);
    }
  }

  // 3. Warm rows.
  warm_page_cache(file, std::max(4u, hw));
  {
    auto o = opt;
    o.io_mode = sc::IoMode::kAuto;
    rows.push_back(measure("ours warm, new engine", file, src, o, false, repeat, device, "pins its ring each run"));
    rows.push_back(measure("ours warm, reused engine", file, src, o, true, repeat, device));
    std::fprintf(stderr, "warm %.1f / %.1f GB/s\n", rows[rows.size() - 2].gbps, rows.back().gbps);
    o.io_mode = sc::IoMode::kMmapRegister;
    rows.push_back(
        measure("ours warm, mmap+register", file, src, o, false, repeat, device, "RSS counts the mapped page cache"));
    o.io_mode = sc::IoMode::kAuto;
    if (have_crc) {
      o.verify_crc = true;
      rows.push_back(measure("ours warm, CRC-32 checked", file, src, o, true, repeat, device));
    }
    o.verify_crc = false;
    rows.push_back(measure("ours warm, CRC off", file, src, o, true, repeat, device));
    auto swap = src;
    for (auto& s : swap) {
      s.expected_crc32 = 0;
      if (s.nbytes % 2 == 0) s.swap_unit = 2;
    }
    rows.push_back(measure("ours warm, bf16 byte swap", file, swap, o, true, repeat, device, "swap kernel per chunk"));
  }

  // 4. Optional sweep (warm, reused engine), into its own file.
  if (!sweep_out.empty()) {
    std::vector<Row> sweep;
    // Fresh engine (pins its ring inside the timed region) by ring cap.
    for (std::uint64_t ring : {64ull, 96ull, 128ull, 192ull}) {
      auto o = opt;
      o.ring_bytes = ring << 20;
      o.verify_crc = false;
      sweep.push_back(
          measure("sweep new engine, ring " + std::to_string(ring) + " MiB", file, src, o, false, repeat, device));
    }
    for (unsigned t : {12u, 16u, 24u})
      for (std::uint64_t c : {2ull, 4ull, 8ull}) {
        if (t > 2 * hw) continue;
        auto o = opt;
        o.reader_threads = t;
        o.chunk_bytes = c << 20;
        o.ring_bytes =
            std::min<std::uint64_t>(512ull << 20, std::max<std::uint64_t>(128ull << 20, 2ull * t * o.chunk_bytes));
        o.verify_crc = false;
        sweep.push_back(measure("sweep reused engine", file, src, o, true, repeat, device));
      }
    if (std::FILE* f = std::fopen(sweep_out.c_str(), "w")) {
      print_table(sweep, f);
      std::fclose(f);
    }
    print_table(sweep, stderr);
  }

  // 5. Baselines from the companion script (same file set, same run).
  if (!baselines.empty()) {
    std::fprintf(stderr, "running baselines: %s\n", baselines.c_str());
    std::fflush(stderr);
    for (auto& b : safeckpt::bench::run_baseline_command(baselines, stderr)) {
      rows.push_back(Row{.what = b.what,
                         .mode = b.mode,
                         .seconds = b.seconds,
                         .gbps = b.gbps,
                         .first_ms = b.first_ms,
                         .rss_mib = b.rss_mib,
                         .dev_mib = b.dev_mib,
                         .note = b.note});
    }
  }

  // The one table.
  std::printf("\n### GPU loading — %s\n", date);
  std::printf("device: %s; %u CPU threads; CUDA context creation %.0f ms (not in any row)\n",
              desc ? desc->c_str() : "?", hw, context_ms);
  std::printf("input: %s — %zu storages, %.2f GiB (%s)\n\n", file.c_str(), src.size(),
              static_cast<double>(bytes) / (1ull << 30), note_input.c_str());
  print_table(rows, stdout);
  for (const auto& r : rows) {
    if (r.what == "ours warm, new engine" || r.what == "ours warm, reused engine")
      std::printf("\n%s: %.1f GB/s = %.0f%% of the pinned ceiling (target >= 45 GB/s and >= 80%%)", r.what.c_str(),
                  r.gbps, 100.0 * r.gbps / ceiling);
    if (r.what == "ours cold" && odirect_gbps > 0)
      std::printf("\n%s: %.2f GB/s = %.0f%% of plain O_DIRECT read (target >= 90%%)", r.what.c_str(), r.gbps,
                  100.0 * r.gbps / odirect_gbps);
  }
  std::printf("\n");
  return 0;
}
