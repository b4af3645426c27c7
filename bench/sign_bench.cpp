// Hashing throughput of OMS sign/verify (issue 15) against `sha256sum` and
// `openssl dgst -sha256` of the same bytes, in the same run, warm page cache.
//
//   safeckpt_sign_bench DIR [--huge-gib G] [--files N] [--file-mib M] [--shard-mib S]
//
// Makes DIR/huge (one G GiB file) and DIR/many/ (N files of M MiB) of
// pseudo-random bytes unless present, reads each once to warm the cache,
// then times, on each set:
//   sha256sum / openssl dgst      one process over the same files (one core)
//   hash_model files, 1 thread    one core's SHA-256 rate through our reader
//   hash_model files, all threads files in parallel
//   hash_model shards, all threads shards of S MiB in parallel
// and prints the targets: shards >= 0.8 x cores x one core's rate,
// files >= 0.9 x one core's rate (for the one huge file).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "safeckpt/sign.hpp"

namespace fs = std::filesystem;
using namespace safeckpt::sign;

namespace {

void make_file(const fs::path& p, std::uint64_t bytes, std::uint64_t seed) {
  if (fs::exists(p) && fs::file_size(p) == bytes) return;
  std::ofstream out(p, std::ios::binary);
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> buf(1 << 17);  // 1 MiB
  for (std::uint64_t done = 0; done < bytes;) {
    for (auto& w : buf) w = rng();
    std::uint64_t n = std::min<std::uint64_t>(bytes - done, buf.size() * 8);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(n));
    done += n;
  }
}

double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double shell(const std::string& cmd) {
  return seconds_of([&] {
    if (std::system((cmd + " > /dev/null").c_str()) != 0) std::fprintf(stderr, "failed: %s\n", cmd.c_str());
  });
}

std::uint64_t bytes_under(const fs::path& p) {
  if (fs::is_regular_file(p)) return fs::file_size(p);
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [--huge-gib G] [--files N] [--file-mib M] [--shard-mib S]\n", argv[0]);
    return 2;
  }
  fs::path dir = argv[1];
  double huge_gib = 4;
  int files = 64;
  int file_mib = 32;
  int shard_mib = 256;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--huge-gib") huge_gib = std::atof(argv[i + 1]);
    if (a == "--files") files = std::atoi(argv[i + 1]);
    if (a == "--file-mib") file_mib = std::atoi(argv[i + 1]);
    if (a == "--shard-mib") shard_mib = std::atoi(argv[i + 1]);
  }
  fs::create_directories(dir / "many");
  make_file(dir / "huge", static_cast<std::uint64_t>(huge_gib * (1ull << 30)), 1);
  for (int i = 0; i < files; ++i)
    make_file(dir / "many" / ("f" + std::to_string(i)), std::uint64_t(file_mib) << 20, 100 + i);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf("cores: %u\n", cores);
  std::printf("%-8s %-34s %10s %10s\n", "set", "method", "seconds", "GB/s");
  for (const fs::path& set : {dir / "huge", dir / "many"}) {
    const std::string name = set.filename().string();
    const std::uint64_t bytes = bytes_under(set);
    const std::string files_arg = fs::is_directory(set) ? "'" + set.string() + "'/*" : "'" + set.string() + "'";
    shell("cat " + files_arg);  // warm the page cache
    auto row = [&](const std::string& what, double s) {
      std::printf("%-8s %-34s %10.3f %10.3f\n", name.c_str(), what.c_str(), s, double(bytes) / s / 1e9);
      return double(bytes) / s / 1e9;
    };
    row("sha256sum", shell("sha256sum " + files_arg));
    row("openssl dgst -sha256", shell("openssl dgst -sha256 " + files_arg));
    auto ours = [&](Method m, unsigned threads) {
      HashOptions ho;
      ho.method = m;
      ho.threads = threads;
      ho.shard_size = std::uint64_t(shard_mib) << 20;
      return seconds_of([&] {
        auto r = hash_model(set, ho);
        if (!r) std::fprintf(stderr, "hash_model: %s\n", r.error().to_string().c_str());
      });
    };
    const double one = row("safeckpt files, 1 thread", ours(Method::kFiles, 1));
    const double files_all = row("safeckpt files, all threads", ours(Method::kFiles, 0));
    const double shards_all =
        row("safeckpt shards " + std::to_string(shard_mib) + " MiB, all threads", ours(Method::kShards, 0));
    std::printf(
        "%-8s files/one-core %.2f (target >= 0.9 for one file), shards/(cores x one-core) %.2f (target >= 0.8)\n",
        name.c_str(), files_all / one, shards_all / (cores * one));
  }
  return 0;
}
