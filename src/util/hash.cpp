#include "safeckpt/hash.hpp"

#include <openssl/evp.h>

namespace safeckpt {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr);
}
Sha256::~Sha256() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}
void Sha256::update(std::span<const std::uint8_t> data) {
  if (!data.empty()) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size());
}
std::array<std::uint8_t, 32> Sha256::finish() {
  std::array<std::uint8_t, 32> out{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &n);
  return out;
}
std::string Sha256::finish_hex() {
  auto d = finish();
  return to_hex(d);
}
std::string sha256_hex(std::span<const std::uint8_t> data) {
  Sha256 h;
  h.update(data);
  return h.finish_hex();
}
std::string to_hex(std::span<const std::uint8_t> data) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(data.size() * 2);
  for (auto b : data) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

}  // namespace safeckpt
