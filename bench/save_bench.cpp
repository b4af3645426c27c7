// Save throughput: safeckpt::save / save_safetensors of a multi-GB state_dict
// against the baseline of writing the same bytes with plain write(2) calls
// (+ fsync) to a file in the same directory, measured in the same run.
//
//   safeckpt_save_bench [--gib N] [--tensors K] [--dir DIR] [--runs R]
//
// Prints one row per method: seconds (median of R runs), GB/s, and the ratio
// to the baseline. All methods fsync, so the numbers include the disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "safeckpt/builder.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"

namespace fs = std::filesystem;
using namespace safeckpt;

namespace {

double seconds(const std::function<bool()>& fn, bool& ok) {
  auto t0 = std::chrono::steady_clock::now();
  ok = fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool plain_write(const fs::path& p, const std::vector<std::vector<std::uint8_t>>& bufs) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  for (const auto& b : bufs) {
    const std::uint8_t* q = b.data();
    std::size_t left = b.size();
    while (left) {
      ssize_t n = ::write(fd, q, left);
      if (n <= 0) {
        ::close(fd);
        return false;
      }
      q += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  bool ok = ::fsync(fd) == 0;
  return ::close(fd) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 2;
  int tensors = 64, runs = 3;
  fs::path dir = fs::temp_directory_path();
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--gib")
      gib = std::atof(argv[i + 1]);
    else if (a == "--tensors")
      tensors = std::atoi(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--runs")
      runs = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--gib N] [--tensors K] [--dir DIR] [--runs R]\n", argv[0]);
      return 2;
    }
  }
  const std::uint64_t total = static_cast<std::uint64_t>(gib * (1ull << 30));
  const std::uint64_t per = (total / static_cast<std::uint64_t>(tensors)) / 4 * 4;
  std::vector<std::vector<std::uint8_t>> bufs;
  CheckpointBuilder b;
  for (int k = 0; k < tensors; ++k) {
    std::vector<std::uint8_t> buf(per);
    for (std::size_t i = 0; i < buf.size(); i += 4096) buf[i] = static_cast<std::uint8_t>(i * 31 + k);
    bufs.push_back(buf);
    auto st = b.add_state_dict_tensor_borrowed("layers." + std::to_string(k) + ".weight", DType::kFloat32,
                                               {static_cast<std::int64_t>(per / 4)},
                                               Bytes(bufs.back().data(), bufs.back().size()));
    if (!st) {
      std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
      return 1;
    }
  }
  auto ckpt = std::move(b).finish();
  if (!ckpt) return 1;
  std::vector<SafetensorsEntry> entries;
  for (int k = 0; k < tensors; ++k)
    entries.push_back({"layers." + std::to_string(k) + ".weight",
                       "F32",
                       {per / 4},
                       Bytes(bufs[static_cast<std::size_t>(k)].data(), per)});

  const fs::path out = dir / "safeckpt_save_bench.out";
  struct Method {
    const char* name;
    std::function<bool()> run;
  };
  SaveOptions so;
  so.overwrite = true;
  SaveOptions nocrc = so;
  nocrc.compute_crc32 = false;
  std::vector<Method> methods = {
      {"plain write+fsync (baseline)", [&] { return plain_write(out, bufs); }},
      {"save .pt (crc32)", [&] { return save(out, *ckpt, so).has_value(); }},
      {"save .pt (no crc32)", [&] { return save(out, *ckpt, nocrc).has_value(); }},
      {"save_safetensors",
       [&] {
         return save_safetensors(out, entries, {{"format", "pt"}}, true, so).has_value();
       }},
  };
  std::printf("state_dict: %d tensors, %.2f GiB; dir %s; median of %d runs\n", tensors,
              static_cast<double>(per) * tensors / (1ull << 30), dir.c_str(), runs);
  std::printf("%-30s %10s %10s %10s\n", "method", "seconds", "GB/s", "vs base");
  double base = 0;
  for (const auto& m : methods) {
    std::vector<double> t;
    for (int r = 0; r < runs; ++r) {
      bool ok = false;
      double s = seconds(m.run, ok);
      if (!ok) {
        std::fprintf(stderr, "%s failed\n", m.name);
        return 1;
      }
      t.push_back(s);
      fs::remove(out);
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2];
    if (base == 0) base = med;
    std::printf("%-30s %10.3f %10.2f %10.2f\n", m.name, med, static_cast<double>(per) * tensors / med / 1e9,
                med / base);
  }
  // Not timed: the .pt written loads back (zip64 offsets once past 4 GiB).
  if (!save(out, *ckpt, so)) return 1;
  LoadOptions lo;
  lo.verify_storage_crc = false;
  auto back = load(out, lo);
  const bool ok = back && back->state_dict().size() == static_cast<std::size_t>(tensors);
  std::printf("check: the saved .pt (%.2f GiB) loads back with %d tensors: %s\n",
              static_cast<double>(fs::file_size(out)) / (1ull << 30), tensors, ok ? "yes" : "NO");
  fs::remove(out);
  return ok ? 0 : 1;
}
