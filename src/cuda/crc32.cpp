// src/cuda/crc32.cpp — the transfer engine's CRC-32 is the library's
// (src/util/crc32.cpp: PCLMULQDQ folding, zlib for the rest).
#include "util/crc32.hpp"

#include "safeckpt/cuda.hpp"

namespace safeckpt::cuda {

std::uint32_t crc32_update(std::uint32_t crc, const std::uint8_t* data, std::size_t n) noexcept {
  return safeckpt::detail::crc32_fast(crc, data, n);
}

}  // namespace safeckpt::cuda
