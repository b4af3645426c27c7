// src/util/crc32.hpp: the fast CRC-32 every layer uses (zip reader, writer,
// GPU reader threads) equals zlib's crc32 — the reference the zip format and
// PyTorch's writer use — for every length, alignment and starting value.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <vector>

#include "util/crc32.hpp"

TEST_CASE("util: crc32_fast equals zlib's crc32 on random lengths, alignments and running values") {
  std::mt19937_64 gen(11);
  std::vector<std::uint8_t> data((1 << 20) + 128);
  for (auto& b : data) b = static_cast<std::uint8_t>(gen());
  std::mt19937 rng(5);
  for (int t = 0; t < 3000; ++t) {
    const std::size_t off = rng() % 64;
    const std::size_t n = t < 1500 ? rng() % 300 : rng() % (1 << 20);
    const std::uint32_t init = t % 3 == 0 ? static_cast<std::uint32_t>(rng()) : 0u;
    const auto want = static_cast<std::uint32_t>(::crc32(init, data.data() + off, static_cast<uInt>(n)));
    REQUIRE(safeckpt::detail::crc32_fast(init, data.data() + off, n) == want);
  }
  // Split anywhere: the running value carries over.
  const auto whole = safeckpt::detail::crc32_fast(0, data.data(), data.size());
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{4097},
                          data.size() - 1, data.size()}) {
    const auto a = safeckpt::detail::crc32_fast(0, data.data(), cut);
    CHECK(safeckpt::detail::crc32_fast(a, data.data() + cut, data.size() - cut) == whole);
  }
  CHECK(safeckpt::detail::crc32_fast(0, nullptr, 0) == 0u);
}
