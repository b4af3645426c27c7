// fuzz/fuzz_bundle.cpp — the OMS bundle reader (safeckpt/sign.hpp
// parse_bundle, parse_statement) and signature verification of what it
// accepts.
//
// Option byte: bit 0 tiny limits (4 resources, depth 6, 2 certificates);
// bit 1 feed the bytes to parse_statement instead of parse_bundle; bit 2
// verify an accepted bundle's signature with the upstream test public key
// (seeds are its signed samples; the hint/raw-key and chain paths run).
//
// Invariants: documented error codes only (kMalformed, kLimitExceeded,
// kUnsupported; verification adds kIntegrity, kInvalidArgument); an accepted
// bundle has exactly one signature's bytes, a non-empty payload, 1..cap
// resources with unique names that are relative and free of ".."; its
// statement re-parses from its payload to the same resources; the root
// digest of the resources is computable.
#include <cstdint>
#include <set>
#include <string>

#include "fuzz_util.hpp"
#include "safeckpt/sign.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

namespace {

// The upstream test key (tests/data/oms/.../signing-key-pub.pem, PEM part).
constexpr const char* kPub =
    "-----BEGIN PUBLIC KEY-----\n"
    "MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEsu6rZGBTjxtvRWPMixT+3HyndV0J0Ybt\n"
    "aHZUcO4DEK+OJHO/4e32bb/fbJKSpRgcBsIpKLcVijUomyFOERbd7u+BTPSUjGZD\n"
    "Qq6J7lTvp/EAXQGOKxW9RP0MGX3qAkvi\n"
    "-----END PUBLIC KEY-----\n";

void check_statement(const sc::sign::Statement& st, const sc::sign::Limits& lim) {
  FUZZ_REQUIRE(!st.resources.empty() && st.resources.size() <= lim.max_resources, "resource count");
  std::set<std::string> names;
  for (const auto& r : st.resources) {
    FUZZ_REQUIRE(names.insert(r.name).second, "duplicate resource " + r.name);
    FUZZ_REQUIRE(!r.name.empty() && r.name[0] != '/', "absolute name " + r.name);
    FUZZ_REQUIRE(r.name.find("/../") == std::string::npos && r.name.rfind("../", 0) != 0, "traversal " + r.name);
  }
  auto root = sc::sign::root_digest(st.resources);
  FUZZ_REQUIRE(root.has_value(), "root digest of accepted resources");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fz::Input in = fz::split_input(data, size);
  sc::sign::Limits lim;
  if (in.bit(0)) {
    lim.max_resources = 4;
    lim.max_json_depth = 6;
    lim.max_certificates = 2;
  }
  if (in.bit(1)) {
    auto st = sc::sign::parse_statement(in.data, lim);
    if (!st) {
      fz::check_error(st.error(),
                      {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported},
                      "parse_statement");
      return 0;
    }
    check_statement(*st, lim);
    return 0;
  }
  auto b = sc::sign::parse_bundle(in.data, lim);
  if (!b) {
    fz::check_error(b.error(), {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported},
                    "parse_bundle");
    return 0;
  }
  FUZZ_REQUIRE(!b->signature.empty() && !b->payload.empty(), "accepted bundle without signature/payload");
  check_statement(b->statement, lim);
  auto again = sc::sign::parse_statement(b->payload, lim);
  FUZZ_REQUIRE(again.has_value() && again->resources.size() == b->statement.resources.size(),
               "payload does not re-parse to the same statement");
  if (in.bit(2)) {
    sc::sign::Trust t;
    t.public_key_pem = kPub;
    auto v = sc::sign::verify_signature(*b, t);
    if (!v)
      fz::check_error(v.error(),
                      {sc::ErrorCode::kIntegrity, sc::ErrorCode::kUnsupported, sc::ErrorCode::kMalformed,
                       sc::ErrorCode::kInvalidArgument},
                      "verify_signature");
  }
  return 0;
}
