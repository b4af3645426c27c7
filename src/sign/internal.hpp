// src/sign/internal.hpp — helpers shared by the sign layer's files (not installed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/sign.hpp"

namespace safeckpt::sign {

bool valid_utf8(std::string_view s);
// A relative '/'-separated path: non-empty, UTF-8, no NUL, no empty/./..
// component, not absolute. kMalformed naming `field`, kLimitExceeded.
Status check_path_name(std::string_view name, std::string_view field, const Limits& limits);

// Canonical standard base64 (kMalformed naming `field`).
Result<std::vector<std::uint8_t>> decode_base64(std::string_view s, std::string_view field);
std::string encode_base64(Bytes data);

struct ShardName {
  std::string path;
  std::uint64_t start = 0;
  std::uint64_t end = 0;
};
// "<path>:<start>:<end>", split at the last two colons (SPEC §6.3.2).
Result<ShardName> split_shard_name(std::string_view name);

// Compact bundle JSON in model_signing 1.1's key order; `hint` set = key
// method, else the certificate chain (DER, leaf first).
std::string bundle_json(const std::string& payload, Bytes signature, const std::optional<std::string>& hint,
                        const std::vector<std::vector<std::uint8_t>>& certificates);

// OpenSSL side (crypto.cpp).
// Hint of a PEM public key text: lowercase hex SHA-256 of its canonical PEM.
Result<std::string> public_key_hint(const std::string& pem);
// Signs PAE(payload) with the key; returns DER ECDSA. Also returns the
// hint of its public key. kInvalidArgument for a bad/unsupported key.
struct SignedPayload {
  std::vector<std::uint8_t> signature;
  std::string hint;
  std::vector<std::vector<std::uint8_t>> certificates;  // DER leaf + chain (certificate method)
};
Result<SignedPayload> sign_pae(const std::string& payload, const Signer& signer);

// Digest of a byte range with the OMS hash_type (OpenSSL EVP).
class Hasher {
 public:
  explicit Hasher(const std::string& hash_type);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  bool ok() const noexcept { return ctx_ != nullptr; }
  void update(const std::uint8_t* p, std::size_t n);
  std::string finish_hex();

 private:
  void* ctx_ = nullptr;
};

}  // namespace safeckpt::sign
