// safeckpt/sign.hpp — OpenSSF Model Signing (OMS v1.0): sign, verify, and
// verify-then-load on the same bytes [issue 15].
//
// Format: ../shared/docs/oms-format.md (cited as OMS §n) — what the reference
// implementation `model_signing` 1.1 (PyPI, sigstore/model-transparency)
// writes and accepts, and the spec (ossf/model-signing-spec v1.0, SPEC §n).
// A signature file is one Sigstore bundle (JSON) holding a DSSE envelope whose
// payload is an in-toto Statement v1 with the OMS predicate.
//
// Accepted bundle grammar (parse_bundle; anything else is refused, kMalformed,
// with a message naming the field):
//  1. a JSON object of at most Limits::max_bundle_bytes, no duplicate keys at
//     any level, nesting at most Limits::max_json_depth;
//  2. `mediaType` == "application/vnd.dev.sigstore.bundle.v0.3+json" or
//     "application/vnd.dev.sigstore.bundle+json;version=0.1|0.2|0.3";
//  3. `verificationMaterial` holds exactly one of `publicKey` ({hint} or
//     {rawBytes, keyDetails}: the forms of model_signing 1.1 and <= 1.0.1),
//     `x509CertificateChain` ({certificates: [{rawBytes}...]}, DER, leaf
//     first, 1..max_certificates) or `certificate` ({rawBytes}: the keyless
//     Sigstore form, parsed but refused by verify, kUnsupported);
//     `tlogEntries` absent or an array (not interpreted); nothing else;
//  4. `dsseEnvelope` = {payload, payloadType, signatures}: payloadType
//     "application/vnd.in-toto+json", exactly one signature {sig, keyid}
//     with keyid absent, null or a string;
//  5. every base64 field canonical standard base64 (RFC 4648 §4, padded, no
//     whitespace, zero pad bits);
//  6. the payload: an in-toto Statement v1 (`_type`
//     "https://in-toto.io/Statement/v1"), exactly one subject {name (non-empty),
//     digest {sha256: 64 lowercase hex}}, `predicateType`
//     "https://model_signing/signature/v1.0" (the v0.2 `Digests/v0.1`
//     format, signed over a faulty PAE, is refused: SPEC "MUST NOT produce,
//     MAY verify"), `predicate` = {serialization, resources} and nothing else
//     (SPEC predicate.schema.json additionalProperties: false);
//     serialization = {method "files"|"shards", hash_type "sha256"|"blake2b"|
//     "blake3", allow_symlinks bool, shard_size (shards only: a positive
//     integer, written by Python as a float `N.0`), ignore_paths (optional
//     array of strings)}; resources = [{name, algorithm, digest (lowercase
//     hex of the algorithm's size)}], 1..max_resources (an empty list is
//     refused: MT issue #661), names unique, relative, '/'-separated, no
//     empty, "." or ".." component except the single-file name "."; shard
//     names "<path>:<start>:<end>" (split at the last two colons) with
//     start < end, end - start <= shard_size, start a multiple of it;
//     algorithm == hash_type for files, "<hash_type>-sharded-<shard_size>"
//     for shards (OMS §2.4: what Python and Go write, not SPEC's plain name).
//
// Root digest (OMS §2.2, SPEC §6.5.1): SHA-256 over the hex-decoded resource
// digests in the order listed, whatever hash_type is.
//
// Names and order (OMS §2.3): a resource name is the path relative to the
// model root with '/' separators. Written in byte (= Unicode code point)
// order of the file path; the shards of one file by numeric start offset, as
// model_signing 1.1 writes them (its golden statements). Verification
// accepts any order. A single-file model's one resource is named "." —
// what the deployed Python verifier recomputes (`path.relative_to(path)`);
// SPEC §6.1.2(5) says basename, which model_signing 1.1 rejects, so we
// write "." and, like the Go verifier, accept either when verifying.
//
// Model walk (sign and verify): regular files only, directories recursed
// (no directory entries), depth and count bounded; ignored: `.git`,
// `.gitattributes`, `.github`, `.gitignore` at the root, the signature file
// when it lies in the model, the bundle's ignore_paths and the caller's,
// each matched as a path-component prefix. A symbolic link is refused
// unless allow_symlinks; when allowed, it is hashed through but only if it
// resolves to a regular file INSIDE the model (never followed out of it;
// model_signing follows any link — a deliberate narrowing). A name that
// is not valid UTF-8 is refused (SPEC §6.1.2). A file whose size, inode or
// mtime changes while it is hashed fails the operation (kIo).
//
// Crypto (OpenSSL, private to src/sign/): ECDSA over P-256/P-384/P-521 with
// SHA-256/384/512 respectively, DER signatures, over the DSSE PAE
// "DSSEv1 28 application/vnd.in-toto+json <len> <payload>" (OMS §3).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "safeckpt/error.hpp"
#include "safeckpt/mapped_file.hpp"

namespace safeckpt::sign {

// Caps on untrusted bundles and models. Inclusive.
struct Limits {
  // Whole bundle file. Python writes ~1.7 KB + ~150 B per resource; 64 MiB
  // holds ~400k resources.
  std::uint64_t max_bundle_bytes = 64ull << 20;
  // Nesting of the bundle and statement JSON (the real ones reach 5).
  std::uint32_t max_json_depth = 16;
  // predicate.resources entries (a 100 TB model at the default shard size is
  // 100k shards).
  std::uint64_t max_resources = 1u << 20;
  // One resource name or ignore path, in bytes (Linux PATH_MAX).
  std::uint64_t max_name_bytes = 4096;
  // x509CertificateChain.certificates.
  std::uint32_t max_certificates = 8;
  // serialization.ignore_paths entries.
  std::uint32_t max_ignore_paths = 4096;
  // Files in a model walk and directory depth below the root.
  std::uint64_t max_files = 1u << 20;
  std::uint32_t max_dir_depth = 64;
};

enum class Method : std::uint8_t { kFiles, kShards };

// The model_signing default shard size (MT hashing.py).
inline constexpr std::uint64_t kDefaultShardSize = 1'000'000'000;

struct Resource {
  std::string name;       // "a/b.bin", "." (single file), or "a/b.bin:0:1000" (shards)
  std::string algorithm;  // "sha256", "sha256-sharded-1000000000", ...
  std::string digest;     // lowercase hex
};

// The in-toto statement's meaningful content.
struct Statement {
  std::string subject_name;  // informational (basename of the model path)
  std::string root_digest;   // lowercase hex SHA-256 (see the header comment)
  Method method = Method::kFiles;
  std::string hash_type = "sha256";
  bool allow_symlinks = false;
  std::uint64_t shard_size = 0;  // shards only
  std::optional<std::vector<std::string>> ignore_paths;
  std::vector<Resource> resources;
};

enum class Material : std::uint8_t {
  kPublicKey,     // publicKey (hint or rawBytes)
  kCertificates,  // x509CertificateChain
  kKeyless,       // certificate (Fulcio) + tlog: not verifiable here
};

struct Bundle {
  std::string media_type;
  Material material = Material::kPublicKey;
  std::optional<std::string> hint;                      // publicKey.hint (lowercase hex)
  std::optional<std::string> raw_public_key;            // publicKey.rawBytes (PEM text, pre-1.1)
  std::vector<std::vector<std::uint8_t>> certificates;  // DER, leaf first
  std::vector<std::uint8_t> payload;                    // statement bytes, as signed
  std::vector<std::uint8_t> signature;                  // DER ECDSA
  Statement statement;
};

// Parses a bundle (grammar above). Errors: kMalformed (naming the field),
// kLimitExceeded (a Limits cap), kUnsupported (v0.2 predicate type).
Result<Bundle> parse_bundle(Bytes json, const Limits& limits = {});
// Reads and parses a bundle file (kIo when unreadable, then as above).
Result<Bundle> read_bundle(const std::filesystem::path& path, const Limits& limits = {});
// Parses a statement alone (grammar item 6).
Result<Statement> parse_statement(Bytes payload, const Limits& limits = {});

// Root digest of `resources` (lowercase hex). Errors: kMalformed (a digest
// that is not lowercase hex).
Result<std::string> root_digest(const std::vector<Resource>& resources);
// The statement as model_signing 1.1 lays it out (2-space indent, its key
// order, shard_size as `N.0`, no trailing newline). Sets nothing: the caller
// fills root_digest (build_statement does).
std::string statement_json(const Statement& st);
// DSSE pre-authentication encoding of an in-toto payload.
std::vector<std::uint8_t> pae(Bytes payload);

// Trust material for verification: exactly one of the two.
struct Trust {
  // key method: PEM SubjectPublicKeyInfo text (text before -----BEGIN is
  // skipped). EC P-256/384/521 only.
  std::string public_key_pem;
  // certificate method: the trust store, every certificate in these PEM
  // texts (the user's CA chain files). Bundle certificates beyond the leaf
  // are untrusted intermediates.
  std::vector<std::string> ca_pems;
};

// Reads PEM files into a Trust (kIo when unreadable).
Result<Trust> trust_from_public_key_file(const std::filesystem::path& pem);
Result<Trust> trust_from_chain_files(const std::vector<std::filesystem::path>& pems);

// Checks the bundle's signature with `trust`: key method — the bundle must
// carry publicKey, its hint (when present; the rawBytes form has none) must
// equal lowercase hex SHA-256 of the trusted key's PEM text as OpenSSL's
// PEM_write_bio_PUBKEY writes it (OMS §3), the signature verify under the
// trusted key; certificate method — the bundle must carry a chain, the leaf
// must chain to a trust-store certificate through the bundle's others, be
// valid NOW (SPEC §8.2; the bundle carries no trusted signing time, so
// "at signing time" can only be proven for the present: model_signing 1.1
// checks at the leaf's notBefore instead and so never reports expiry), have
// KeyUsage digitalSignature or ExtendedKeyUsage codeSigning, and its key
// verify the signature. Then the statement's root digest is recomputed.
// Errors: kIntegrity (signature, key mismatch, chain, expired certificate,
// key usage, root digest), kUnsupported (keyless bundle, non-EC key or other
// curve), kInvalidArgument (no or both trust forms, unparsable trust PEM).
// On success returns a one-line description of the signer.
Result<std::string> verify_signature(const Bundle& bundle, const Trust& trust);

// How the model is walked and hashed.
struct HashOptions {
  Method method = Method::kFiles;
  std::string hash_type = "sha256";  // "sha256" or "blake2b" (BLAKE2b-512)
  std::uint64_t shard_size = kDefaultShardSize;
  bool allow_symlinks = false;
  // Paths relative to the model root (path-component prefixes) skipped in
  // addition to the git defaults.
  std::vector<std::string> ignore_paths;
  // When set, only these names (file paths, not shard names) are hashed.
  std::optional<std::vector<std::string>> only;
  // Hashing threads; 0 = std::thread::hardware_concurrency().
  unsigned threads = 0;
  Limits limits;
};

// Hashes a model (a directory, or a single file whose one name is ".").
// Order: see the header comment. Errors: kIo (unreadable, changed while
// hashing), kUnsupported (symlink not allowed or out of the model, special
// file, unknown hash_type), kMalformed (non-UTF-8 name), kLimitExceeded.
Result<std::vector<Resource>> hash_model(const std::filesystem::path& model, const HashOptions& options);

// Resource digests of bytes already in memory, as hash_model names them for a
// single-file model called `name` (sharded in parallel for kShards).
std::vector<Resource> hash_bytes(Bytes data, const std::string& name, const HashOptions& options);

// A statement for `resources` of the model at `model` (subject = base name,
// root digest computed). Errors: kMalformed (bad digest hex).
Result<Statement> build_statement(const std::filesystem::path& model, const HashOptions& options,
                                  std::vector<Resource> resources, bool record_ignore_paths);

// The signer: key method (key only) or certificate method (key + leaf +
// chain PEM texts).
struct Signer {
  std::string private_key_pem;  // EC P-256/384/521 (text before BEGIN skipped)
  std::string certificate_pem;  // empty: key method
  std::vector<std::string> chain_pems;
};
Result<Signer> signer_from_files(const std::filesystem::path& key, const std::filesystem::path& certificate,
                                 const std::vector<std::filesystem::path>& chain);

struct SignOptions {
  HashOptions hash;
  bool overwrite = true;  // replace an existing signature file
};

// Hashes `model`, builds the statement (recording the ignore paths: git
// defaults, the signature file when inside the model, the caller's), signs
// it and writes the bundle to `signature` atomically (temp file, fsync,
// rename): compact JSON in model_signing 1.1's layout (mediaType v0.3,
// publicKey.hint or x509CertificateChain leaf first, tlogEntries [],
// keyid ""). Errors: those of hash_model; kInvalidArgument (bad key or
// certificate, certificate not matching the key, empty model: verifiers
// refuse one), kExists/kIo from the write.
Result<Bundle> sign_model(const std::filesystem::path& model, const std::filesystem::path& signature,
                          const Signer& signer, const SignOptions& options = {});
// Signs a statement's bytes and returns the bundle JSON.
Result<std::string> sign_payload(const std::string& payload, const Signer& signer);

// Per-name outcome of comparing a model with a statement.
enum class FileStatus : std::uint8_t { kVerified, kChanged, kMissing, kExtra };
std::string_view file_status_name(FileStatus s) noexcept;

// The file path a resource name stands for: the name itself for kFiles,
// "<path>" of a shard name "<path>:<start>:<end>" for kShards (split at the
// last two colons; a name without them is returned as it is).
std::string resource_path(const std::string& name, Method method);

struct FileResult {
  std::string name;  // resource name (shards: "path:start:end")
  FileStatus status = FileStatus::kVerified;
};

struct VerifyOptions {
  std::vector<std::string> ignore_paths;  // relative to the model root
  bool ignore_unsigned_files = false;     // extra files are not hashed nor reported
  // The signature file, skipped when inside the model.
  std::filesystem::path signature_path;
  unsigned threads = 0;
  Limits limits;
};

struct VerifyReport {
  std::string signer;             // from verify_signature
  std::vector<FileResult> files;  // sorted by name
  bool ok() const noexcept;       // every file verified
  std::string summary() const;    // "verified N files" / "2 changed: a, b; 1 missing: c"
};

// Full verification: signature (verify_signature), then the model re-hashed
// with the bundle's method/hash_type/shard_size/allow_symlinks and compared
// name by name. A mismatch is a report with !ok(), not an error.
// Errors: those of verify_signature and hash_model.
Result<VerifyReport> verify_model(const std::filesystem::path& model, const Bundle& bundle, const Trust& trust,
                                  const VerifyOptions& options = {});

// Verify-then-load (LoadOptions::verify_bytes): checks the bundle's
// signature now (errors as verify_signature) and returns a callable that
// hashes the bytes the loader has mapped — the same bytes it then parses
// and uploads — and compares them with the signed resource(s) of
// `resource_name` (empty: "." when the bundle has that single resource, else
// the loaded file's base name; for a file of a directory model pass its
// path relative to the model root). The callable returns kIntegrity when
// the bytes differ or the name is not signed.
Result<std::function<Status(Bytes, const std::filesystem::path&)>> make_load_verifier(const Bundle& bundle,
                                                                                      const Trust& trust,
                                                                                      std::string resource_name = {},
                                                                                      unsigned threads = 0);

}  // namespace safeckpt::sign
