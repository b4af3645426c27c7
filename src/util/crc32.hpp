// src/util/crc32.hpp — the fast CRC-32 every layer uses (not installed).
#pragma once

#include <cstddef>
#include <cstdint>

namespace safeckpt::detail {

// CRC-32 (zip / zlib polynomial) of n bytes at data, continuing `crc` (0 to
// start), equal to zlib's crc32(): carry-less multiply folding when the CPU
// has PCLMULQDQ + SSE4.1, zlib otherwise. Any length, any alignment.
std::uint32_t crc32_fast(std::uint32_t crc, const std::uint8_t* data, std::size_t n) noexcept;

}  // namespace safeckpt::detail
