// safeckpt/hash.hpp — digests used by tests, tools and integrity checks.
// SHA-256 comes from OpenSSL (a well-kept implementation beats our own).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace safeckpt {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const std::uint8_t> data);
  std::array<std::uint8_t, 32> finish();
  std::string finish_hex();

 private:
  void* ctx_;
};

std::string sha256_hex(std::span<const std::uint8_t> data);
std::string to_hex(std::span<const std::uint8_t> data);

}  // namespace safeckpt
