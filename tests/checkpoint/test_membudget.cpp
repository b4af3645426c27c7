// Memory bombs (issue 11 item 2): every allocation a file drives is charged to
// Limits::max_memory_bytes before it happens, and an inflated pickle record
// is capped by Limits::max_pickle_record_bytes from its declared size. One
// row per bomb kind, each refused with kLimitExceeded naming the cap; then
// the real CLI on a 512 MiB deflate bomb under a 1.5 GiB address-space
// rlimit must refuse cleanly (not be killed).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/safetensors.hpp"
#include "support/run_cli.hpp"
#include "support/sanitizers.hpp"
#include "support/zip_builder.hpp"

using safeckpt::ErrorCode;
using namespace std::string_literals;  // literals below hold NUL bytes

namespace {

std::string g(const std::string& m, const std::string& n) {
  return "c" + m + "\n" + n + "\n";
}
std::string le(std::uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}
std::string uni(const std::string& s) {
  return "X" + le(s.size(), 4) + s;
}

// Raw deflate (zip method 8) of `n` bytes repeating `unit`, streamed so the
// plain text never exists in memory.
std::string deflate_repeat(const std::string& head, const std::string& unit, std::uint64_t n, const std::string& tail) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 1, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY) == Z_OK);  // level 1: fast
  std::string chunk;
  while (chunk.size() < (1u << 20)) chunk += unit;
  chunk.resize(1u << 20);
  std::string out;
  std::vector<unsigned char> buf(1u << 16);
  auto feed = [&](const std::string& in, int flush) {
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    do {
      zs.next_out = buf.data();
      zs.avail_out = static_cast<uInt>(buf.size());
      deflate(&zs, flush);
      out.append(reinterpret_cast<const char*>(buf.data()), buf.size() - zs.avail_out);
    } while (zs.avail_out == 0);
  };
  feed(head, Z_NO_FLUSH);
  for (std::uint64_t done = 0; done < n; done += chunk.size())
    feed(n - done >= chunk.size() ? chunk : chunk.substr(0, static_cast<std::size_t>(n - done)), Z_NO_FLUSH);
  feed(tail, Z_FINISH);
  deflateEnd(&zs);
  return out;
}

// A torch.save-shaped zip: archive/data.pkl deflated (declaring `declared`
// uncompressed bytes and CRC `crc`), then archive/version stored.
std::vector<std::uint8_t> bomb_zip(const std::string& deflated, std::uint32_t declared, std::uint32_t crc) {
  std::string out;
  auto entry = [&](const std::string& name, const std::string& data, std::uint16_t method, std::uint32_t c,
                   std::uint32_t usize, std::string& cd) {
    const auto off = static_cast<std::uint32_t>(out.size());
    out += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(method, 2) + le(0, 4) + le(c, 4) + le(data.size(), 4) +
           le(usize, 4) + le(name.size(), 2) + le(0, 2) + name + data;
    cd += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + le(method, 2) + le(0, 4) + le(c, 4) +
          le(data.size(), 4) + le(usize, 4) + le(name.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 2) +
          le(0, 4) + le(off, 4) + name;
  };
  std::string cd;
  entry("archive/data.pkl", deflated, 8, crc, declared, cd);
  const std::string ver = "3\n";
  entry("archive/version", ver, 0, static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(ver.data()), 2)),
        2, cd);
  const auto cd_off = static_cast<std::uint32_t>(out.size());
  out +=
      cd + le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(2, 2) + le(2, 2) + le(cd.size(), 4) + le(cd_off, 4) + le(0, 2);
  return {out.begin(), out.end()};
}

// Bombs are NONE POP pairs: every NONE is a new value node, the stack stays
// shallow (bench/membudget_bombs.py writes the 512 MiB one for RESULTS.md).
constexpr std::uint64_t kBombBytes = 512ull << 20;

safeckpt::Result<safeckpt::Checkpoint> load_with(std::vector<std::uint8_t> bytes, const safeckpt::Limits& lim) {
  safeckpt::LoadOptions o;
  o.limits = lim;
  return safeckpt::load_buffer(std::move(bytes), o);
}

safeckpt::Result<safeckpt::Checkpoint> load_pickle(const std::string& p, const safeckpt::Limits& lim) {
  return load_with(std::vector<std::uint8_t>(p.begin(), p.end()), lim);
}

void check_refused(const safeckpt::Result<safeckpt::Checkpoint>& r, const char* what, const std::string& cap,
                   const std::string& detail) {
  REQUIRE_MESSAGE(!r.has_value(), what);
  const std::string msg = r.error().to_string();
  CHECK_MESSAGE(r.error().code() == ErrorCode::kLimitExceeded, what << ": " << msg);
  CHECK_MESSAGE(msg.find(cap) != std::string::npos, what << ": " << msg);
  CHECK_MESSAGE(msg.find(detail) != std::string::npos, what << ": " << msg);
}

// A pickle of `n` tensors, all views of one 4-byte FloatStorage "0", each of
// rank 64 (size and stride tuples memoized and shared).
std::string views_pickle(int n) {
  std::string ones = "(";
  for (int i = 0; i < 64; ++i) ones += "K\x01";
  ones += "t";
  std::string p = "\x80\x02]("s + g("torch._utils", "_rebuild_tensor_v2") + "q\x01((" + uni("storage") +
                  g("torch", "FloatStorage") + uni("0") + uni("cpu") + "K\x01tQq\x02K\x00"s + ones + "q\x03" + ones +
                  "q\x04\x89" + g("collections", "OrderedDict") + ")Rq\x05tR";
  for (int i = 1; i < n; ++i) p += "h\x01(h\x02K\x00h\x03h\x04\x89h\x05tR"s;
  return p + "e.";
}

}  // namespace

TEST_CASE("memory budget: each bomb kind is refused naming the budget or the record cap") {
  safeckpt::Limits lim;  // defaults, but a 4 MiB budget so each bomb stays small
  lim.max_memory_bytes = 4u << 20;

  SUBCASE("deflate bomb: declared size above max_pickle_record_bytes, refused before inflating") {
    // 16 MiB inflated, declaring it; the record cap is lowered to 1 MiB
    // (default budget: the record cap is what refuses it).
    safeckpt::Limits l;
    l.max_pickle_record_bytes = 1u << 20;
    auto z = bomb_zip(deflate_repeat("\x80\x02", "N0", (16u << 20) - 4, "N."), 16u << 20, 0);
    check_refused(load_with(z, l), "deflate bomb", "max_pickle_record_bytes", "inflates to 16777216 bytes");
  }
  SUBCASE("deflate bomb: declared size within the record cap but above the budget") {
    auto z = bomb_zip(deflate_repeat("\x80\x02", "N0", (16u << 20) - 4, "N."), 16u << 20, 0);
    check_refused(load_with(z, lim), "deflate bomb", "max_memory_bytes", "inflated data.pkl");
  }
  SUBCASE("deflate bomb with a lying header: inflating stops at the declared size") {
    // Declares 1 MiB, would inflate to 64 MiB: malformed once the output
    // passes 1 MiB (the time spent is that of 1 MiB, not 64).
    auto z = bomb_zip(deflate_repeat("\x80\x02", "N0", (64u << 20) - 4, "N."), 1u << 20, 0);
    auto r = load_with(z, lim);
    REQUIRE(!r.has_value());
    CHECK_MESSAGE(r.error().code() == ErrorCode::kMalformed, r.error().to_string());
    CHECK_MESSAGE(r.error().message().find("inflates to more than its declared 1048576 bytes") != std::string::npos,
                  r.error().to_string());
  }
  SUBCASE("value nodes: NONE POP pairs") {
    std::string p = "\x80\x02";
    for (int i = 0; i < 40000; ++i) p += "N0";
    check_refused(load_pickle(p + "N.", lim), "NONE flood", "max_memory_bytes", "value node");
  }
  SUBCASE("memo bomb: one value put under 100,000 indices") {
    std::string p = "\x80\x02N";
    for (std::uint32_t i = 0; i < 100000; ++i) p += "r" + le(i, 4);
    check_refused(load_pickle(p + ".", lim), "memo bomb", "max_memory_bytes", "memo entry");
  }
  SUBCASE("huge container: one memoized value appended 1,000,000 times") {
    std::string p = "\x80\x02Nq\x01]";  // stack: None, list
    std::string round = "(";
    for (int i = 0; i < 1000; ++i) round += "h\x01";
    round += "e";
    for (int i = 0; i < 1000; ++i) p += round;
    check_refused(load_pickle(p + "0.", lim), "container bomb", "max_memory_bytes", "list items");
  }
  SUBCASE("many strings: 100-byte str values") {
    std::string p = "\x80\x02";
    for (int i = 0; i < 20000; ++i) p += uni(std::string(100, 'a')) + "0";
    check_refused(load_pickle(p + "N.", lim), "string flood", "max_memory_bytes", "max_memory_bytes");
  }
  SUBCASE("one string larger than the budget") {
    std::string p = "\x80\x02" + uni(std::string(5u << 20, 'a')) + ".";
    check_refused(load_pickle(p, lim), "big string", "max_memory_bytes", "string needs");
  }
  SUBCASE("long ints: 1 KiB LONG4 values") {
    std::string p = "\x80\x02";
    for (int i = 0; i < 2000; ++i) p += "\x8b" + le(1024, 4) + std::string(1024, '\x7f') + "0";
    check_refused(load_pickle(p + "N.", lim), "long flood", "max_memory_bytes", "long integer");
  }
  SUBCASE("stack depth: one value DUP'ed 600,000 times") {
    std::string p = "\x80\x02N" + std::string(600000, '2');
    check_refused(load_pickle(p + ".", lim), "stack bomb", "max_memory_bytes", "pickle stack");
  }
  SUBCASE("MARK stack: 300,000 nested MARKs") {
    safeckpt::Limits l = lim;
    l.max_mark_depth = 1u << 20;
    std::string p = "\x80\x02" + std::string(300000, '(');
    check_refused(load_pickle(p + ".", l), "mark bomb", "max_memory_bytes", "MARK stack");
  }
  SUBCASE("tensors per storage: rank-64 views of one 4-byte storage") {
    test_support::ZipBuilder z("archive");
    z.add("data.pkl", views_pickle(3000));
    z.add("data/0", std::string(4, '\0'));
    z.add("version", "3\n");
    // 3000 such tensors' nodes fit in 4 MiB; their metadata (rank 64: 2 KiB
    // of sizes and strides each) does not.
    check_refused(load_with(z.finish(), lim), "views bomb", "max_memory_bytes", "max_memory_bytes");
  }
  SUBCASE("safetensors header: JSON tree charged before parsing") {
    std::string header = "{" + std::string(200000, ' ') + "}";
    std::string file = le(header.size(), 8) + header;
    safeckpt::SafetensorsOptions o;
    o.limits = lim;
    auto r = safeckpt::SafetensorsFile::parse_buffer(std::vector<std::uint8_t>(file.begin(), file.end()), o);
    REQUIRE(!r.has_value());
    CHECK_MESSAGE(r.error().code() == ErrorCode::kLimitExceeded, r.error().to_string());
    CHECK_MESSAGE(r.error().message().find("safetensors header JSON") != std::string::npos, r.error().to_string());
  }
}

TEST_CASE("memory budget: the views bomb's tensors are fine under the budget when fewer") {
  // The same shape with 10 views loads: the bomb is refused for its count,
  // not its form.
  test_support::ZipBuilder z("archive");
  z.add("data.pkl", views_pickle(10));
  z.add("data/0", std::string(4, '\0'));
  z.add("version", "3\n");
  safeckpt::Limits lim;
  lim.max_memory_bytes = 4u << 20;
  auto r = load_with(z.finish(), lim);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  CHECK(r->tensors().size() == 10);
}

TEST_CASE("memory budget: the CLI refuses a 512 MiB deflate bomb under a 1.5 GiB address-space rlimit") {
#ifdef SAFECKPT_TEST_ASAN
  MESSAGE("SKIP: ASan reserves terabytes of address space, so an RLIMIT_AS test cannot run under it");
  return;
#else
  const auto dir = std::filesystem::temp_directory_path() / ("safeckpt_membudget_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  // Declared honestly (512 MiB: above max_pickle_record_bytes); lying
  // (declares 60 MiB: within the cap, inflation stops there); and 60 MiB
  // declared honestly, whose 31 M NONEs fill the whole default budget with
  // value nodes (the peak the budget allows, under the rlimit).
  struct Bomb {
    const char* name;
    std::uint64_t inflated;
    std::uint32_t declared;
    const char* want;
  };
  const Bomb bombs[] = {
      {"honest.pt", kBombBytes, static_cast<std::uint32_t>(kBombBytes), "max_pickle_record_bytes"},
      {"lying.pt", kBombBytes, 60u << 20, "inflates to more than"},
      {"fills_budget.pt", 60u << 20, 60u << 20, "memory budget exceeded"},
  };
  for (const Bomb& b : bombs) {
    const auto path = dir / b.name;
    {
      auto bytes = bomb_zip(deflate_repeat("\x80\x02", "N0", b.inflated - 4, "N."), b.declared, 0);
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    const std::string cli = test_support::cli_path();
    for (const char* cmd : {"inspect", "scan"}) {
      const auto r = test_support::run_shell("sh -c 'ulimit -v 1572864 && exec \"$0\" \"$1\" \"$2\"' '" + cli + "' " +
                                             cmd + " '" + path.string() + "' 2>&1");
      INFO(b.name << " " << cmd << ": " << r.out);
      REQUIRE(r.code >= 0);  // exited, not killed
      CHECK(r.out.find(b.want) != std::string::npos);
      // inspect: 2 = refused; scan: 1 = a finding (the loader's refusal).
      CHECK(r.code == (std::string(cmd) == "inspect" ? 2 : 1));
    }
  }
#endif
}

// Survey tool, not a check: with SAFECKPT_MEMBUDGET_PROBE="a.pt b.pt ...",
// prints the smallest max_memory_bytes (to 1 MiB, searched up to 4 GiB) each
// file loads under (the numbers in limits.hpp's survey came from here).
TEST_CASE("memory budget: probe (SAFECKPT_MEMBUDGET_PROBE)") {
  const char* env = std::getenv("SAFECKPT_MEMBUDGET_PROBE");
  if (env == nullptr) return;
  std::string list = env;
  std::size_t at = 0;
  while (at < list.size()) {
    std::size_t sp = list.find(' ', at);
    if (sp == std::string::npos) sp = list.size();
    const std::string path = list.substr(at, sp - at);
    at = sp + 1;
    if (path.empty()) continue;
    safeckpt::LoadOptions o;
    o.limits.max_memory_bytes = 4ull << 30;
    auto full = safeckpt::load(path, o);
    if (!full) {
      MESSAGE(path << ": does not load with a 4 GiB budget: " << full.error().to_string());
      continue;
    }
    std::uint64_t lo = 0, hi = o.limits.max_memory_bytes;  // lo fails, hi loads
    while (hi - lo > (1u << 20)) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      o.limits.max_memory_bytes = mid;
      if (safeckpt::load(path, o))
        hi = mid;
      else
        lo = mid;
    }
    MESSAGE(path << ": loads with max_memory_bytes >= " << hi << " (" << full->tensors().size() << " tensors)");
  }
}
