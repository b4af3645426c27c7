// fuzz/replay_main.cpp — a main() for builds without libFuzzer (g++, or clang
// without SAFECKPT_LIBFUZZER): runs LLVMFuzzerTestOneInput once over every
// file named on the command line, descending into directories (sorted, so
// runs are reproducible). This is how every build, and ctest (label `fuzz`),
// replays the seed corpus and fuzz/regressions/<target>/.
//
// Usage: fuzz_<target> [-v] PATH...   (a missing PATH is an error, an empty
// directory is not; arguments starting with '-' other than -v are libFuzzer
// flags and are ignored). Exit status 0 when every input ran; a broken
// invariant aborts inside the harness and the SIGABRT handler names the input.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

namespace fs = std::filesystem;

// Kept for the abort handler: which input was running.
std::string g_current;

void on_abort(int) {
  std::fprintf(stderr, "replay: aborted while running %s\n", g_current.c_str());
  std::signal(SIGABRT, SIG_DFL);
  std::abort();
}

bool read_file(const fs::path& p, std::vector<std::uint8_t>& out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return !f.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::signal(SIGABRT, on_abort);
  bool verbose = false;
  std::vector<fs::path> files;
  int missing = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-v") == 0) {
      verbose = true;
      continue;
    }
    if (argv[i][0] == '-') continue;  // libFuzzer flags (-runs=0 ...) are accepted and ignored
    fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> in_dir;
      for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (it->is_regular_file(ec) && it->path().filename().string()[0] != '.') in_dir.push_back(it->path());
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", argv[i]);
      ++missing;
    }
  }
  std::vector<std::uint8_t> buf;
  std::size_t ran = 0;
  for (const auto& p : files) {
    if (!read_file(p, buf)) {
      std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
      ++missing;
      continue;
    }
    g_current = p.string();
    if (verbose) std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), buf.size());
    // A copy in a buffer of exactly the input size, so ASan sees overreads.
    std::unique_ptr<std::uint8_t[]> exact(new std::uint8_t[buf.size() ? buf.size() : 1]);
    if (!buf.empty()) std::memcpy(exact.get(), buf.data(), buf.size());
    LLVMFuzzerTestOneInput(exact.get(), buf.size());
    ++ran;
  }
  std::fprintf(stderr, "replay: %zu inputs ran, %d paths missing or unreadable\n", ran, missing);
  return missing == 0 ? 0 : 1;
}
