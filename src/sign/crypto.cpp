// The OpenSSL side of the sign layer: keys, certificates, ECDSA over the
// DSSE PAE (OMS §3). OpenSSL stays private to src/sign/.
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>
#include <string>

#include "safeckpt/hash.hpp"
#include "safeckpt/mapped_file.hpp"
#include "sign/internal.hpp"

namespace safeckpt::sign {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct StackFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::string openssl_reason() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

BioPtr mem_bio(const std::string& s) {
  return BioPtr(BIO_new_mem_buf(s.data(), static_cast<int>(s.size())));
}

// The digest ECDSA uses for a key's curve (model_signing get_ec_key_hash).
Result<const EVP_MD*> curve_digest(EVP_PKEY* key, std::string_view what) {
  if (EVP_PKEY_get_base_id(key) != EVP_PKEY_EC)
    return make_error(ErrorCode::kUnsupported, std::string(what) + ": not an EC key (OMS signs with ECDSA only)");
  char group[64] = {};
  std::size_t len = 0;
  if (EVP_PKEY_get_group_name(key, group, sizeof group, &len) != 1)
    return make_error(ErrorCode::kUnsupported, std::string(what) + ": EC key without a named curve");
  std::string g(group, len);
  if (g == "prime256v1" || g == "P-256") return EVP_sha256();
  if (g == "secp384r1" || g == "P-384") return EVP_sha384();
  if (g == "secp521r1" || g == "P-521") return EVP_sha512();
  return make_error(ErrorCode::kUnsupported, std::string(what) + ": curve " + g + " is not P-256/P-384/P-521");
}

Result<PkeyPtr> read_public_key(const std::string& pem, std::string_view what) {
  BioPtr bio = mem_bio(pem);
  PkeyPtr k(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (!k)
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(what) + ": no PEM public key (" + openssl_reason() + ")");
  return k;
}

Result<std::string> key_hint(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PUBKEY(bio.get(), key) != 1) return make_error(ErrorCode::kInternal, "PEM_write_bio_PUBKEY failed");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return sha256_hex(Bytes(reinterpret_cast<const std::uint8_t*>(data), static_cast<std::size_t>(n)));
}

Status verify_ecdsa(EVP_PKEY* key, Bytes payload, Bytes signature, std::string_view who) {
  SAFECKPT_TRY(const EVP_MD* md, curve_digest(key, who));
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  std::vector<std::uint8_t> msg = pae(payload);
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, md, nullptr, key) != 1)
    return make_error(ErrorCode::kInternal, "EVP_DigestVerifyInit: " + openssl_reason());
  int rc = EVP_DigestVerify(ctx.get(), signature.data(), signature.size(), msg.data(), msg.size());
  ERR_clear_error();
  if (rc != 1)
    return make_error(ErrorCode::kIntegrity, "signature: does not verify with " + std::string(who) +
                                                 " (ECDSA over the DSSE PAE of the payload)");
  return {};
}

std::vector<X509Ptr> read_pem_certificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = mem_bio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // the loop ends on "no start line"
  return out;
}

std::string asn1_time_text(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), t);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

std::string subject_text(X509* x) {
  char buf[256] = {};
  X509_NAME_oneline(X509_get_subject_name(x), buf, sizeof buf);
  return buf;
}

Result<std::string> verify_chain(const Bundle& bundle, const Trust& trust) {
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  std::size_t n_trusted = 0;
  for (const std::string& pem : trust.ca_pems) {
    for (auto& c : read_pem_certificates(pem)) {
      X509_STORE_add_cert(store.get(), c.get());
      ++n_trusted;
    }
  }
  if (n_trusted == 0)
    return make_error(ErrorCode::kInvalidArgument, "certificate chain: no PEM certificate in the trust files");
  std::vector<X509Ptr> certs;
  for (std::size_t i = 0; i < bundle.certificates.size(); ++i) {
    const unsigned char* p = bundle.certificates[i].data();
    X509* x = d2i_X509(nullptr, &p, static_cast<long>(bundle.certificates[i].size()));
    if (x == nullptr || p != bundle.certificates[i].data() + bundle.certificates[i].size()) {
      X509_free(x);
      ERR_clear_error();
      return make_error(ErrorCode::kMalformed, "verificationMaterial.x509CertificateChain.certificates[" +
                                                   std::to_string(i) + "]: not one DER certificate");
    }
    certs.emplace_back(x);
  }
  X509* leaf = certs[0].get();
  std::unique_ptr<STACK_OF(X509), StackFree> untrusted(sk_X509_new_null());
  for (std::size_t i = 1; i < certs.size(); ++i) {
    X509_up_ref(certs[i].get());
    sk_X509_push(untrusted.get(), certs[i].get());
  }
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  if (X509_STORE_CTX_init(ctx.get(), store.get(), leaf, untrusted.get()) != 1)
    return make_error(ErrorCode::kInternal, "X509_STORE_CTX_init: " + openssl_reason());
  // Validity is checked at the current time (SPEC §8.2): see sign.hpp.
  if (X509_verify_cert(ctx.get()) != 1) {
    int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    std::string msg = std::string("certificate chain: ") + X509_verify_cert_error_string(err);
    if (err == X509_V_ERR_CERT_HAS_EXPIRED) {
      X509* bad = X509_STORE_CTX_get_current_cert(ctx.get());
      if (bad == nullptr) bad = leaf;
      msg = "certificate chain: certificate \"" + subject_text(bad) + "\" expired on " +
            asn1_time_text(X509_get0_notAfter(bad)) +
            " (the bundle carries no trusted timestamp, so validity is checked now: SPEC §8.2)";
    } else if (err == X509_V_ERR_CERT_NOT_YET_VALID) {
      X509* bad = X509_STORE_CTX_get_current_cert(ctx.get());
      if (bad == nullptr) bad = leaf;
      msg = "certificate chain: certificate \"" + subject_text(bad) + "\" not valid before " +
            asn1_time_text(X509_get0_notBefore(bad));
    }
    return make_error(ErrorCode::kIntegrity, msg);
  }
  // Key usage (model_signing sign_certificate.py): digitalSignature or codeSigning.
  std::uint32_t ku = X509_get_key_usage(leaf);
  std::uint32_t xku = X509_get_extended_key_usage(leaf);
  bool ku_ok = ku != UINT32_MAX && (ku & KU_DIGITAL_SIGNATURE) != 0;
  bool xku_ok = xku != UINT32_MAX && (xku & XKU_CODE_SIGN) != 0;
  if (!ku_ok && !xku_ok)
    return make_error(
        ErrorCode::kIntegrity,
        "certificate chain: the leaf has neither KeyUsage digitalSignature nor ExtendedKeyUsage codeSigning");
  EVP_PKEY* key = X509_get0_pubkey(leaf);
  if (key == nullptr) return make_error(ErrorCode::kMalformed, "certificate chain: the leaf has no public key");
  SAFECKPT_CHECK(verify_ecdsa(key, bundle.payload, bundle.signature, "the leaf certificate's key"));
  return "certificate \"" + subject_text(leaf) + "\" chained to the trusted CA file(s)";
}

}  // namespace

Result<std::string> public_key_hint(const std::string& pem) {
  SAFECKPT_TRY(PkeyPtr k, read_public_key(pem, "public key"));
  return key_hint(k.get());
}

Result<std::string> verify_signature(const Bundle& bundle, const Trust& trust) {
  const bool key = !trust.public_key_pem.empty();
  const bool chain = !trust.ca_pems.empty();
  if (key == chain) return make_error(ErrorCode::kInvalidArgument, "give either a public key or a certificate chain");
  if (bundle.material == Material::kKeyless)
    return make_error(ErrorCode::kUnsupported,
                      "keyless Sigstore bundle (Fulcio certificate + Rekor entry): not verifiable here");
  std::string signer;
  if (key) {
    if (bundle.material != Material::kPublicKey)
      return make_error(ErrorCode::kIntegrity,
                        "key: the bundle was signed with a certificate, not a bare key "
                        "(verify with --certificate-chain)");
    SAFECKPT_TRY(PkeyPtr k, read_public_key(trust.public_key_pem, "public key"));
    SAFECKPT_TRY(std::string hint, key_hint(k.get()));
    if (bundle.hint && *bundle.hint != hint)
      return make_error(ErrorCode::kIntegrity, "key mismatch: the bundle's publicKey.hint " + *bundle.hint +
                                                   " is not the given key's " + hint);
    SAFECKPT_CHECK(verify_ecdsa(k.get(), bundle.payload, bundle.signature, "the given public key"));
    signer = "public key " + hint;
  } else {
    if (bundle.material != Material::kCertificates)
      return make_error(ErrorCode::kIntegrity,
                        "certificate chain: the bundle was signed with a bare key, not a "
                        "certificate (verify with --public-key)");
    SAFECKPT_TRY(signer, verify_chain(bundle, trust));
  }
  SAFECKPT_TRY(std::string root, root_digest(bundle.statement.resources));
  if (root != bundle.statement.root_digest)
    return make_error(ErrorCode::kIntegrity, "statement: subject digest " + bundle.statement.root_digest +
                                                 " is not the root digest of the resources (" + root + ")");
  return signer;
}

Result<SignedPayload> sign_pae(const std::string& payload, const Signer& signer) {
  BioPtr bio = mem_bio(signer.private_key_pem);
  PkeyPtr k(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!k)
    return make_error(ErrorCode::kInvalidArgument,
                      "private key: no unencrypted PEM private key (" + openssl_reason() + ")");
  auto md = curve_digest(k.get(), "private key");
  if (!md) return make_error(ErrorCode::kInvalidArgument, md.error().message());
  SignedPayload out;
  SAFECKPT_TRY(out.hint, key_hint(k.get()));
  if (!signer.certificate_pem.empty()) {
    auto leaf = read_pem_certificates(signer.certificate_pem);
    if (leaf.size() != 1)
      return make_error(ErrorCode::kInvalidArgument, "certificate: expected exactly one PEM certificate");
    if (EVP_PKEY_eq(X509_get0_pubkey(leaf[0].get()), k.get()) != 1) {
      ERR_clear_error();
      return make_error(ErrorCode::kInvalidArgument, "certificate: its public key is not the signing key's");
    }
    auto der = [](X509* x) {
      int n = i2d_X509(x, nullptr);
      std::vector<std::uint8_t> v(static_cast<std::size_t>(n > 0 ? n : 0));
      unsigned char* p = v.data();
      i2d_X509(x, &p);
      return v;
    };
    out.certificates.push_back(der(leaf[0].get()));
    for (const std::string& pem : signer.chain_pems)
      for (auto& c : read_pem_certificates(pem)) out.certificates.push_back(der(c.get()));
  }
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  std::vector<std::uint8_t> msg = pae(Bytes(reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()));
  std::size_t n = 0;
  if (EVP_DigestSignInit(ctx.get(), nullptr, *md, nullptr, k.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &n, msg.data(), msg.size()) != 1)
    return make_error(ErrorCode::kInternal, "EVP_DigestSign: " + openssl_reason());
  out.signature.resize(n);
  if (EVP_DigestSign(ctx.get(), out.signature.data(), &n, msg.data(), msg.size()) != 1)
    return make_error(ErrorCode::kInternal, "EVP_DigestSign: " + openssl_reason());
  out.signature.resize(n);
  return out;
}

Hasher::Hasher(const std::string& hash_type) {
  const EVP_MD* md = hash_type == "sha256" ? EVP_sha256() : hash_type == "blake2b" ? EVP_blake2b512() : nullptr;
  if (md == nullptr) return;
  EVP_MD_CTX* c = EVP_MD_CTX_new();
  if (c != nullptr && EVP_DigestInit_ex(c, md, nullptr) == 1) {
    ctx_ = c;
  } else {
    EVP_MD_CTX_free(c);
  }
}
Hasher::~Hasher() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}
void Hasher::update(const std::uint8_t* p, std::size_t n) {
  if (n > 0) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), p, n);
}
std::string Hasher::finish_hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out, &n);
  return to_hex(Bytes(out, n));
}

namespace {
// A regular file only (MappedFile: a FIFO or device is refused, not read
// until it ends), sized before it is read.
Result<std::string> read_text(const std::filesystem::path& p, std::string_view what) {
  auto f = MappedFile::open(p);
  if (!f) return make_error(ErrorCode::kIo, std::string(what) + ": " + f.error().message());
  if (f->size() > (16u << 20)) return make_error(ErrorCode::kLimitExceeded, std::string(what) + ": larger than 16 MiB");
  return std::string(reinterpret_cast<const char*>(f->bytes().data()), f->size());
}
}  // namespace

Result<Trust> trust_from_public_key_file(const std::filesystem::path& pem) {
  Trust t;
  SAFECKPT_TRY(t.public_key_pem, read_text(pem, "public key"));
  return t;
}

Result<Trust> trust_from_chain_files(const std::vector<std::filesystem::path>& pems) {
  Trust t;
  for (const auto& p : pems) {
    SAFECKPT_TRY(std::string s, read_text(p, "certificate chain"));
    t.ca_pems.push_back(std::move(s));
  }
  return t;
}

Result<Signer> signer_from_files(const std::filesystem::path& key, const std::filesystem::path& certificate,
                                 const std::vector<std::filesystem::path>& chain) {
  Signer s;
  SAFECKPT_TRY(s.private_key_pem, read_text(key, "private key"));
  if (!certificate.empty()) {
    SAFECKPT_TRY(s.certificate_pem, read_text(certificate, "certificate"));
  }
  for (const auto& p : chain) {
    SAFECKPT_TRY(std::string c, read_text(p, "certificate chain"));
    s.chain_pems.push_back(std::move(c));
  }
  return s;
}

}  // namespace safeckpt::sign
