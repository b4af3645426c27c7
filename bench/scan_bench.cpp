// scan_bench: `safeckpt scan` time must not grow with tensor bytes.
//
// Writes torch.save-shaped zip checkpoints (archive/data.pkl + big STORED
// data/<k> records, as PyTorch writes them) of growing size, then times, in
// the same run and on the same file:
//   baseline  map the file, open the zip, read data.pkl  (the least any tool must do)
//   scan      safeckpt::scan::scan_file with default options (loader verdict +
//             every pickle + archive checks)
//   scan+crc  the same with verify_data (reads and CRCs every tensor byte)
// The tensor records are written as holes (sparse files): generating a
// multi-GB checkpoint takes no time and no disk, and the bytes read back as
// zeros. Nothing here asserts on time (STYLE.md): it prints a table.
//
// Usage: safeckpt_scan_bench [DIR] [--max-gib N] [--reps N]
#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "safeckpt/mapped_file.hpp"
#include "safeckpt/scan.hpp"
#include "safeckpt/zip.hpp"

namespace fs = std::filesystem;

namespace {

using Buf = std::string;

Buf le(std::uint64_t v, int w) {
  Buf b;
  for (int i = 0; i < w; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return b;
}

// CRC-32 of n zero bytes, by doubling with crc32_combine (no buffer).
std::uint32_t crc_zeros(std::uint64_t n) {
  std::uint32_t result = 0;
  std::uint64_t have = 0;
  unsigned char z = 0;
  std::uint32_t block = static_cast<std::uint32_t>(crc32(0, &z, 1));  // crc of 1 zero
  std::uint64_t block_len = 1;
  while (n > 0) {
    if (n & 1) {
      result = have == 0
                   ? block
                   : static_cast<std::uint32_t>(crc32_combine64(result, block, static_cast<z_off64_t>(block_len)));
      have += block_len;
    }
    block = static_cast<std::uint32_t>(crc32_combine64(block, block, static_cast<z_off64_t>(block_len)));
    block_len *= 2;
    n >>= 1;
  }
  return result;
}

// data.pkl: {"t0": tensor(storage "0"), ...} as torch.save protocol 2 writes it.
Buf data_pkl(const std::vector<std::uint64_t>& record_bytes) {
  auto uni = [](const std::string& s) { return "X" + le(s.size(), 4) + s; };
  Buf p = "\x80\x02}";
  for (std::size_t k = 0; k < record_bytes.size(); ++k) {
    const std::uint64_t numel = record_bytes[k] / 4;
    p += uni("t" + std::to_string(k));
    p += "ctorch._utils\n_rebuild_tensor_v2\n((" + uni("storage") + "ctorch\nFloatStorage\n" + uni(std::to_string(k)) +
         uni("cpu") + "J" + le(numel, 4) + Buf("tQK\x00J", 5) + le(numel, 4) + "\x85K\x01\x85\x89" +
         "ccollections\nOrderedDict\n)Rt" + "R" + "s";
  }
  return p + ".";
}

// Writes a stored zip: small records with bytes, big records as holes.
void write_checkpoint(const fs::path& path, const std::vector<std::uint64_t>& record_bytes) {
  struct Rec {
    std::string name;
    Buf data;            // small records
    std::uint64_t size;  // hole size for tensor records
    bool hole;
  };
  std::vector<Rec> recs;
  recs.push_back({"archive/data.pkl", data_pkl(record_bytes), 0, false});
  recs.push_back({"archive/byteorder", "little", 0, false});
  for (std::size_t k = 0; k < record_bytes.size(); ++k)
    recs.push_back({"archive/data/" + std::to_string(k), {}, record_bytes[k], true});
  recs.push_back({"archive/version", "3\n", 0, false});
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) {
    std::perror("open");
    std::exit(2);
  }
  std::uint64_t off = 0;
  auto put = [&](const Buf& b) {
    if (::pwrite(fd, b.data(), b.size(), static_cast<off_t>(off)) != static_cast<ssize_t>(b.size())) {
      std::perror("pwrite");
      std::exit(2);
    }
    off += b.size();
  };
  Buf cd;
  for (const Rec& r : recs) {
    const std::uint64_t size = r.hole ? r.size : r.data.size();
    const std::uint32_t crc = r.hole
                                  ? crc_zeros(size)
                                  : static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(r.data.data()),
                                                                     static_cast<uInt>(r.data.size())));
    const std::uint64_t lho = off;
    // 64-byte aligned data like PyTorch's writer (FB extra field of 'Z').
    std::uint64_t start = lho + 30 + r.name.size() + 4;
    std::uint64_t pad = (64 - start % 64) % 64;
    put("PK\x03\x04" + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(crc, 4) + le(size, 4) + le(size, 4) +
        le(r.name.size(), 2) + le(4 + pad, 2) + r.name + "FB" + le(pad, 2) + Buf(pad, 'Z'));
    if (r.hole) {
      off += size;
    } else {
      put(r.data);
    }
    // Offsets past 4 GiB go to a zip64 extra field (0x0001), the field holds the sentinel.
    const bool big = lho >= 0xFFFFFFFFull;
    const Buf extra = big ? le(1, 2) + le(8, 2) + le(lho, 8) : Buf();
    cd += "PK\x01\x02" + le(45, 2) + le(45, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(crc, 4) + le(size, 4) +
          le(size, 4) + le(r.name.size(), 2) + le(extra.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) +
          le(big ? 0xFFFFFFFFull : lho, 4) + r.name + extra;
  }
  const std::uint64_t cd_off = off;
  put(cd);
  if (cd_off >= 0xFFFFFFFFull) {  // zip64 end of central directory record + locator
    const std::uint64_t z64 = off;
    put("PK\x06\x06" + le(44, 8) + le(45, 2) + le(45, 2) + le(0, 4) + le(0, 4) + le(recs.size(), 8) +
        le(recs.size(), 8) + le(cd.size(), 8) + le(cd_off, 8));
    put("PK\x06\x07" + le(0, 4) + le(z64, 8) + le(1, 4));
  }
  put("PK\x05\x06" + le(0, 2) + le(0, 2) + le(recs.size(), 2) + le(recs.size(), 2) + le(cd.size(), 4) +
      le(std::min<std::uint64_t>(cd_off, 0xFFFFFFFFull), 4) + le(0, 2));
  ::close(fd);
}

template <class F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / "safeckpt_scan_bench";
  double max_gib = 6.0;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--max-gib" && i + 1 < argc) {
      max_gib = std::stod(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::stoi(argv[++i]));
    } else {
      dir = a;
    }
  }
  fs::create_directories(dir);
  struct utsname u {};
  ::uname(&u);
  std::printf("safeckpt scan bench: %s %s, %ld CPUs; files in %s (sparse)\n", u.sysname, u.machine,
              ::sysconf(_SC_NPROCESSORS_ONLN), dir.c_str());
  std::printf(
      "baseline = mmap + open zip + read data.pkl; scan = scan_file (loader verdict, every pickle, archive "
      "checks); scan+crc = --verify-data\n\n");
  std::printf("%12s %8s %14s %10s %14s %10s\n", "tensor bytes", "records", "baseline ms", "scan ms", "scan/baseline",
              "scan+crc ms");
  // 1 GiB records; archives past 4 GiB use zip64 offsets as PyTorch's writer does.
  const std::uint64_t kMiB = 1ull << 20;
  std::vector<std::uint64_t> totals = {16 * kMiB, 256 * kMiB, 1024 * kMiB};
  for (double g = 2; g <= max_gib + 1e-9; g += 1) totals.push_back(static_cast<std::uint64_t>(g) * 1024 * kMiB);
  for (std::uint64_t total : totals) {
    std::vector<std::uint64_t> recs;
    for (std::uint64_t left = total; left > 0;) {
      std::uint64_t r = std::min<std::uint64_t>(left, 1024 * kMiB);
      recs.push_back(r);
      left -= r;
    }
    fs::path file = dir / ("ckpt_" + std::to_string(total / kMiB) + "MiB.pt");
    write_checkpoint(file, recs);
    double base = median_ms(reps, [&] {
      auto mf = safeckpt::MappedFile::open(file);
      auto z = safeckpt::ZipArchive::open(mf->bytes(), safeckpt::Limits{});
      if (!z) {
        std::fprintf(stderr, "zip: %s\n", z.error().to_string().c_str());
        std::exit(3);
      }
      const auto* e = z->find("data.pkl");
      auto rb = z->read(*e, true);
      if (!rb || rb->bytes.empty()) std::exit(3);
    });
    safeckpt::scan::FileReport last;
    double scan = median_ms(reps, [&] { last = safeckpt::scan::scan_file(file); });
    if (last.verdict != safeckpt::scan::Verdict::kClean) {
      std::fprintf(stderr, "unexpected verdict %s for %s\n",
                   std::string(safeckpt::scan::verdict_name(last.verdict)).c_str(), file.c_str());
      for (const auto& f : last.findings) std::fprintf(stderr, "  %s\n", f.message.c_str());
      return 1;
    }
    safeckpt::scan::ScanOptions crc;
    crc.verify_data = true;
    double scan_crc = median_ms(1, [&] { last = safeckpt::scan::scan_file(file, crc); });
    std::printf("%12llu %8zu %14.3f %10.3f %14.2f %10.1f\n", static_cast<unsigned long long>(total), recs.size(), base,
                scan, scan / base, scan_crc);
    std::fflush(stdout);
    fs::remove(file);
  }
  return 0;
}
