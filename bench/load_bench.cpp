// Host loading benchmark (issue 2): safeckpt::load against a plain read(2)
// of the same file, measured in the same run, warm page cache.
//
//   safeckpt_load_bench [--gib N] [--corpus DIR] [--keep FILE]
//
// Cases: tests/data/corpus/torch-2.11/many_tensors.pt (3000 tensors,
// metadata-heavy) and a generated N-GiB bf16 state_dict (64 MiB tensors,
// written with safeckpt::save). Loading maps the file and parses only the
// central directory and data.pkl, so with storage CRC checks off its time
// must not grow with tensor bytes; with CRC checks on it reads every byte once.
// Cold rows drop the file from the page cache before each run (drop_caches as
// root, else posix_fadvise DONTNEED): a cold load with CRC off reads only the
// central directory, each record's local header and data.pkl.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "probes.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/save.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_of(const std::function<void()>& f, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// Baseline: read(2) the whole file into one buffer.
void plain_read(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) std::abort();
  std::vector<char> buf(16u << 20);
  std::uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    total += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  if (total == 0) std::abort();
}

void load_or_die(const fs::path& p, bool crc) {
  safeckpt::LoadOptions o;
  o.verify_storage_crc = crc;
  auto r = safeckpt::load(p, o);
  if (!r) {
    std::fprintf(stderr, "load failed: %s\n", r.error().to_string().c_str());
    std::exit(1);
  }
}

fs::path make_big(const fs::path& path, int gib) {
  safeckpt::CheckpointBuilder b;
  const std::int64_t rows = 4096, cols = 8192;  // 64 MiB of bf16
  int tensors = gib * 16;
  for (int i = 0; i < tensors; ++i) {
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * cols * 2));
    for (std::size_t k = 0; k < bytes.size(); k += 4096) bytes[k] = static_cast<std::uint8_t>(i + k);
    auto st = b.add_state_dict_tensor("layers." + std::to_string(i) + ".weight", safeckpt::DType::kBFloat16,
                                      {rows, cols}, std::move(bytes));
    if (!st) {
      std::fprintf(stderr, "builder: %s\n", st.error().to_string().c_str());
      std::exit(1);
    }
  }
  auto ck = std::move(b).finish();
  if (!ck) {
    std::fprintf(stderr, "builder: %s\n", ck.error().to_string().c_str());
    std::exit(1);
  }
  safeckpt::SaveOptions so;
  so.overwrite = true;
  so.fsync = false;
  auto st = safeckpt::save(path, *ck, so);
  if (!st) {
    std::fprintf(stderr, "save: %s\n", st.error().to_string().c_str());
    std::exit(1);
  }
  return path;
}

void row(const char* what, const fs::path& p, double s, std::uint64_t bytes) {
  std::printf("| %-44s | %10.2f | %9.2f |\n", what, s * 1e3, static_cast<double>(bytes) / s / 1e9);
  (void)p;
}

}  // namespace

int main(int argc, char** argv) {
  int gib = 4;
  fs::path corpus = fs::path(SAFECKPT_SOURCE_DIR) / "tests/data/corpus/torch-2.11";
  fs::path keep;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--gib" && i + 1 < argc)
      gib = std::stoi(argv[++i]);
    else if (a == "--corpus" && i + 1 < argc)
      corpus = argv[++i];
    else if (a == "--keep" && i + 1 < argc)
      keep = argv[++i];
  }
  fs::path many = corpus / "many_tensors.pt";
  fs::path big = keep.empty() ? fs::temp_directory_path() / "safeckpt_load_bench.pt" : keep;
  std::printf("generating %d GiB bf16 checkpoint at %s ...\n", gib, big.c_str());
  make_big(big, gib);
  // Warm the page cache for both files.
  plain_read(many);
  plain_read(big);
  std::uint64_t many_bytes = fs::file_size(many), big_bytes = fs::file_size(big);
  std::printf("\n| %-44s | %10s | %9s |\n", "case (warm page cache, best of 5)", "ms", "GB/s*");
  std::printf("|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(12, '-').c_str(), std::string(11, '-').c_str());
  row("many_tensors.pt: plain read() (baseline)", many, seconds_of([&] { plain_read(many); }, 5), many_bytes);
  row("many_tensors.pt: safeckpt::load, CRC on", many, seconds_of([&] { load_or_die(many, true); }, 5), many_bytes);
  row("many_tensors.pt: safeckpt::load, CRC off", many, seconds_of([&] { load_or_die(many, false); }, 5), many_bytes);
  std::string g = std::to_string(gib) + " GiB";
  row((g + ": plain read() (baseline)").c_str(), big, seconds_of([&] { plain_read(big); }, 5), big_bytes);
  row((g + ": safeckpt::load, CRC on").c_str(), big, seconds_of([&] { load_or_die(big, true); }, 5), big_bytes);
  row((g + ": safeckpt::load, CRC off (zero-copy)").c_str(), big, seconds_of([&] { load_or_die(big, false); }, 5),
      big_bytes);
  // Cold: best of 3, the page cache dropped before each.
  std::string how;
  auto cold = [&](const std::function<void()>& f) {
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      how = safeckpt::bench::drop_page_cache({big.string()});
      auto t0 = Clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  };
  row((g + ": plain read(), cold (baseline)").c_str(), big, cold([&] { plain_read(big); }), big_bytes);
  row((g + ": safeckpt::load, CRC off, cold").c_str(), big, cold([&] { load_or_die(big, false); }), big_bytes);
  std::printf("\n* file bytes / time (for load: bytes made available, not bytes copied)\n");
  std::printf("cold rows: page cache dropped with %s before each of 3 runs (best shown)\n",
              how.empty() ? "nothing (could not drop it!)" : how.c_str());
  if (keep.empty()) fs::remove(big);
  return 0;
}
