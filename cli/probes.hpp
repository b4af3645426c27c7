// bench/probes.hpp — host-side measurement helpers shared by `safeckpt bench`
// (cli/bench.cpp) and the benchmark programs in bench/: peak RSS growth, the
// page cache (drop / warm), and a plain O_DIRECT read of a file (the disk
// ceiling). Linux only; header-only so each program takes what it uses.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace safeckpt::bench {

// A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"), -1 if absent.
inline std::int64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return std::atoll(line.c_str() + n + 1);
  return -1;
}

// Peak RSS growth over a region: start() resets VmHWM to the current RSS
// (writing "5" to /proc/self/clear_refs, Linux >= 4.0) and remembers VmRSS;
// growth_mib() = VmHWM now - VmRSS then.
// growth_mib() is -1 when the peak could not be reset (it would otherwise
// report the peak since the process started).
struct RssProbe {
  std::int64_t before_kib = 0;
  bool reset_ok = false;
  void start() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
    f.flush();
    reset_ok = static_cast<bool>(f);
    before_kib = status_kib("VmRSS:");
  }
  double growth_mib() const {
    if (!reset_ok) return -1;
    return static_cast<double>(status_kib("VmHWM:") - before_kib) / 1024.0;
  }
};

// Drops `paths` from the page cache: "drop_caches" (all of it, needs root),
// else "fadvise" (posix_fadvise DONTNEED per file), else "" (neither worked).
inline std::string drop_page_cache(const std::vector<std::string>& paths) {
  ::sync();
  {
    std::ofstream f("/proc/sys/vm/drop_caches");
    if (f) {
      f << "3";
      f.flush();
      if (f) return "drop_caches";
    }
  }
  bool ok = !paths.empty();
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) {
      ok = false;
      continue;
    }
    ::fdatasync(fd);
    ok = ok && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
  }
  return ok ? "fadvise" : "";
}

// Reads the whole file with `threads` threads (16 MiB preads) so it is in the page cache.
inline void warm_page_cache(const std::string& path, unsigned threads = 8) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  struct stat sb {};
  ::fstat(fd, &sb);
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  constexpr std::uint64_t kChunk = 16u << 20;
  std::atomic<std::uint64_t> next{0};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      std::vector<char> buf(kChunk);
      for (std::uint64_t off; (off = next.fetch_add(kChunk)) < size;)
        if (::pread(fd, buf.data(), kChunk, static_cast<off_t>(off)) < 0) break;
    });
  for (auto& t : ts) t.join();
  ::close(fd);
}

// Plain O_DIRECT read of the whole file by `threads` threads, `chunk`-byte
// aligned reads into their own (pageable, 4096-aligned) buffers, no GPU.
// Returns GB/s (1e9) and the time in *seconds; -1 if O_DIRECT is refused or a read fails.
inline double odirect_read_gbps(const std::string& path, unsigned threads, std::uint64_t chunk, double* seconds) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return -1;
  struct stat sb {};
  ::fstat(fd, &sb);
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> err{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      void* buf = nullptr;
      if (::posix_memalign(&buf, 4096, chunk) != 0) {
        err = true;
        return;
      }
      for (std::uint64_t off; (off = next.fetch_add(chunk)) < size;)
        if (::pread(fd, buf, chunk, static_cast<off_t>(off)) < 0) {
          err = true;
          break;
        }
      std::free(buf);
    });
  for (auto& t : ts) t.join();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  return err ? -1 : static_cast<double>(size) / *seconds / 1e9;
}

// One measurement printed by a companion script (bench/torch_baselines.py):
// "ROW\twhat\tmode\tseconds\tGB/s\tfirst_tensor_ms\trss_growth_MiB\tdevice_overhead_MiB\tnote".
struct BaselineRow {
  std::string what, mode, note;
  double seconds = -1, gbps = -1, first_ms = -1, rss_mib = -1, dev_mib = -1;
};

// Runs `cmd` through the shell, copies its output to `echo` (may be null)
// and returns its ROW lines; a non-zero exit status is reported on `echo`.
inline std::vector<BaselineRow> run_baseline_command(const std::string& cmd, std::FILE* echo) {
  std::vector<BaselineRow> rows;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return rows;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    if (echo) std::fputs(line, echo);
    if (std::strncmp(line, "ROW\t", 4) != 0) continue;
    std::vector<std::string> f(1);
    for (const char* c = line + 4; *c && *c != '\n'; ++c) {
      if (*c == '\t')
        f.emplace_back();
      else
        f.back() += *c;
    }
    if (f.size() < 8) continue;
    BaselineRow r;
    r.what = f[0];
    r.mode = f[1];
    r.seconds = std::atof(f[2].c_str());
    r.gbps = std::atof(f[3].c_str());
    r.first_ms = std::atof(f[4].c_str());
    r.rss_mib = std::atof(f[5].c_str());
    r.dev_mib = std::atof(f[6].c_str());
    r.note = f[7];
    rows.push_back(std::move(r));
  }
  const int rc = ::pclose(p);
  if (rc != 0 && echo) std::fprintf(echo, "baselines: '%s' exited with status %d\n", cmd.c_str(), rc);
  return rows;
}

}  // namespace safeckpt::bench
