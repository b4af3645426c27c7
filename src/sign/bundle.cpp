// Bundle and statement reader/writer (grammar: include/safeckpt/sign.hpp).
// nlohmann's parser keeps the last of duplicate keys; the parse callback
// below tracks the keys of every open object and refuses a repeat, and
// bounds the nesting, so what we verify is what every other reader sees.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safeckpt/hash.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/sign.hpp"
#include "sign/internal.hpp"

namespace safeckpt::sign {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kMediaV03 = "application/vnd.dev.sigstore.bundle.v0.3+json";
constexpr std::string_view kPayloadType = "application/vnd.in-toto+json";
constexpr std::string_view kStatementType = "https://in-toto.io/Statement/v1";
constexpr std::string_view kPredicateType = "https://model_signing/signature/v1.0";
constexpr std::string_view kLegacyPredicateType = "https://model_signing/Digests/v0.1";

struct JsonRefusal {
  ErrorCode code;
  std::string message;
};

// Parses strictly: no duplicate keys, bounded depth. Never throws.
Result<Json> parse_json(Bytes bytes, std::uint32_t max_depth, std::string_view what) {
  std::vector<std::vector<std::string>> keys;  // keys of each open object
  try {
    auto cb = [&](int depth, Json::parse_event_t ev, Json& parsed) -> bool {
      if (depth > static_cast<int>(max_depth))
        throw JsonRefusal{ErrorCode::kLimitExceeded,
                          std::string(what) + ": JSON nested deeper than " + std::to_string(max_depth)};
      switch (ev) {
        case Json::parse_event_t::object_start: keys.emplace_back(); break;
        case Json::parse_event_t::object_end:
          if (!keys.empty()) keys.pop_back();
          break;
        case Json::parse_event_t::key: {
          const std::string& k = parsed.get_ref<const std::string&>();
          auto& top = keys.back();
          if (std::find(top.begin(), top.end(), k) != top.end())
            throw JsonRefusal{ErrorCode::kMalformed, std::string(what) + ": duplicate key \"" + k + "\""};
          top.push_back(k);
          break;
        }
        default: break;
      }
      return true;
    };
    return Json::parse(bytes.begin(), bytes.end(), cb);
  } catch (const JsonRefusal& r) {
    return make_error(r.code, r.message);
  } catch (const Json::exception& e) {
    return make_error(ErrorCode::kMalformed, std::string(what) + ": not JSON (" + e.what() + ")");
  }
}

Unexpected field_error(std::string_view field, std::string_view what) {
  return make_error(ErrorCode::kMalformed, std::string(field) + ": " + std::string(what));
}

// Every key of `o` must be in `allowed`.
Status only_keys(const Json& o, std::string_view field, std::initializer_list<std::string_view> allowed) {
  for (const auto& [k, v] : o.items()) {
    (void)v;
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      return field_error(field, "unknown field \"" + k + "\"");
  }
  return {};
}

Result<const Json*> member(const Json& o, std::string_view field, std::string_view key, Json::value_t type) {
  auto it = o.find(std::string(key));
  if (it == o.end()) return field_error(std::string(field) + "." + std::string(key), "missing");
  if (it->type() != type) {
    const char* want = type == Json::value_t::string    ? "a string"
                       : type == Json::value_t::object  ? "an object"
                       : type == Json::value_t::array   ? "an array"
                       : type == Json::value_t::boolean ? "a boolean"
                                                        : "a value of another type";
    return field_error(std::string(field) + "." + std::string(key), std::string("must be ") + want);
  }
  return &*it;
}

Result<std::string> string_member(const Json& o, std::string_view field, std::string_view key) {
  SAFECKPT_TRY(const Json* v, member(o, field, key, Json::value_t::string));
  return v->get<std::string>();
}

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Digest sizes in hex characters per hash_type.
std::size_t hex_size(std::string_view hash_type) {
  if (hash_type == "sha256" || hash_type == "blake3") return 64;
  if (hash_type == "blake2b") return 128;
  return 0;
}

bool parse_u64(std::string_view s, std::uint64_t& out) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

Status check_path_name(std::string_view name, std::string_view field, const Limits& limits) {
  if (name.empty()) return field_error(field, "empty name");
  if (name.size() > limits.max_name_bytes)
    return make_error(ErrorCode::kLimitExceeded,
                      std::string(field) + ": name longer than " + std::to_string(limits.max_name_bytes) + " bytes");
  if (name.find('\0') != std::string_view::npos) return field_error(field, "name contains NUL");
  if (!valid_utf8(name)) return field_error(field, "name is not UTF-8");
  if (name.front() == '/') return field_error(field, "absolute name \"" + std::string(name) + "\"");
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view comp = name.substr(start, end - start);
    if (comp.empty() || comp == "." || comp == "..")
      return field_error(field, "name \"" + std::string(name) + "\" has an empty, \".\" or \"..\" component");
    start = end + 1;
  }
  return {};
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t k = 1; k < n; ++k) {
      auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr std::uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// RFC 4648 §4 base64, canonical only.
Result<std::vector<std::uint8_t>> decode_base64(std::string_view s, std::string_view field) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (s.size() % 4 != 0) return field_error(field, "base64 length is not a multiple of 4");
  std::size_t pad = 0;
  if (!s.empty() && s.back() == '=') pad = (s.size() >= 2 && s[s.size() - 2] == '=') ? 2 : 1;
  std::vector<std::uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  for (std::size_t i = 0; i < s.size(); i += 4) {
    bool last = i + 4 == s.size();
    int v[4];
    for (int k = 0; k < 4; ++k) {
      char c = s[i + k];
      if (last && c == '=' && k >= 4 - static_cast<int>(pad)) {
        v[k] = 0;
        continue;
      }
      v[k] = val(c);
      if (v[k] < 0) return field_error(field, "not canonical base64 (character " + std::to_string(i + k) + ")");
    }
    std::uint32_t w =
        (std::uint32_t(v[0]) << 18) | (std::uint32_t(v[1]) << 12) | (std::uint32_t(v[2]) << 6) | std::uint32_t(v[3]);
    out.push_back(static_cast<std::uint8_t>(w >> 16));
    if (!last || pad < 2) out.push_back(static_cast<std::uint8_t>(w >> 8));
    if (!last || pad < 1) out.push_back(static_cast<std::uint8_t>(w));
    if (last && ((pad == 1 && (w & 0xff) != 0) || (pad == 2 && (w & 0xffff) != 0)))
      return field_error(field, "not canonical base64 (non-zero pad bits)");
  }
  return out;
}

std::string encode_base64(Bytes data) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    std::uint32_t w = (std::uint32_t(data[i]) << 16) | (std::uint32_t(data[i + 1]) << 8) | data[i + 2];
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(w >> (6 * k)) & 63]);
  }
  std::size_t rest = data.size() - i;
  if (rest > 0) {
    std::uint32_t w = std::uint32_t(data[i]) << 16;
    if (rest == 2) w |= std::uint32_t(data[i + 1]) << 8;
    out.push_back(kAlphabet[(w >> 18) & 63]);
    out.push_back(kAlphabet[(w >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(w >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> root_digest(const std::vector<Resource>& resources) {
  Sha256 h;
  for (const Resource& r : resources) {
    if (r.digest.size() % 2 != 0 || !is_lower_hex(r.digest))
      return field_error("predicate.resources[" + r.name + "].digest", "not lowercase hex");
    std::vector<std::uint8_t> raw(r.digest.size() / 2);
    for (std::size_t i = 0; i < raw.size(); ++i) {
      auto nib = [](char c) { return static_cast<std::uint8_t>(c <= '9' ? c - '0' : c - 'a' + 10); };
      raw[i] = static_cast<std::uint8_t>((nib(r.digest[2 * i]) << 4) | nib(r.digest[2 * i + 1]));
    }
    h.update(raw);
  }
  return h.finish_hex();
}

Result<ShardName> split_shard_name(std::string_view name) {
  std::size_t c2 = name.rfind(':');
  if (c2 == std::string_view::npos || c2 == 0) return field_error("resource name", "shard name without :start:end");
  std::size_t c1 = name.rfind(':', c2 - 1);
  if (c1 == std::string_view::npos) return field_error("resource name", "shard name without :start:end");
  ShardName s;
  s.path = std::string(name.substr(0, c1));
  if (!parse_u64(name.substr(c1 + 1, c2 - c1 - 1), s.start) || !parse_u64(name.substr(c2 + 1), s.end))
    return field_error("resource name", "shard offsets of \"" + std::string(name) + "\" are not decimal");
  return s;
}

Result<Statement> parse_statement(Bytes payload, const Limits& limits) {
  SAFECKPT_TRY(Json j, parse_json(payload, limits.max_json_depth, "statement"));
  if (!j.is_object()) return field_error("statement", "not a JSON object");
  SAFECKPT_CHECK(only_keys(j, "statement", {"_type", "subject", "predicateType", "predicate"}));
  SAFECKPT_TRY(std::string type, string_member(j, "statement", "_type"));
  if (type != kStatementType) return field_error("statement._type", "\"" + type + "\" is not in-toto Statement v1");
  SAFECKPT_TRY(std::string ptype, string_member(j, "statement", "predicateType"));
  if (ptype == kLegacyPredicateType)
    return make_error(ErrorCode::kUnsupported,
                      "statement.predicateType: model_signing v0.2 format (Digests/v0.1, signed over a faulty "
                      "encoding): not verified (the OMS v1.0 spec forbids producing it)");
  if (ptype != kPredicateType) return field_error("statement.predicateType", "\"" + ptype + "\" is not OMS v1.0");
  Statement st;
  SAFECKPT_TRY(const Json* subj, member(j, "statement", "subject", Json::value_t::array));
  if (subj->size() != 1) return field_error("statement.subject", "must hold exactly one entry");
  const Json& s0 = (*subj)[0];
  if (!s0.is_object()) return field_error("statement.subject[0]", "not an object");
  SAFECKPT_CHECK(only_keys(s0, "statement.subject[0]", {"name", "digest"}));
  SAFECKPT_TRY(st.subject_name, string_member(s0, "statement.subject[0]", "name"));
  if (st.subject_name.empty()) return field_error("statement.subject[0].name", "empty");
  SAFECKPT_TRY(const Json* sd, member(s0, "statement.subject[0]", "digest", Json::value_t::object));
  SAFECKPT_CHECK(only_keys(*sd, "statement.subject[0].digest", {"sha256"}));
  SAFECKPT_TRY(st.root_digest, string_member(*sd, "statement.subject[0].digest", "sha256"));
  if (st.root_digest.size() != 64 || !is_lower_hex(st.root_digest))
    return field_error("statement.subject[0].digest.sha256", "not 64 lowercase hex digits");

  SAFECKPT_TRY(const Json* pred, member(j, "statement", "predicate", Json::value_t::object));
  SAFECKPT_CHECK(only_keys(*pred, "predicate", {"serialization", "resources"}));
  SAFECKPT_TRY(const Json* ser, member(*pred, "predicate", "serialization", Json::value_t::object));
  SAFECKPT_CHECK(only_keys(*ser, "predicate.serialization",
                           {"method", "hash_type", "allow_symlinks", "shard_size", "ignore_paths"}));
  SAFECKPT_TRY(std::string method, string_member(*ser, "predicate.serialization", "method"));
  if (method == "files")
    st.method = Method::kFiles;
  else if (method == "shards")
    st.method = Method::kShards;
  else
    return field_error("predicate.serialization.method", "\"" + method + "\" is neither files nor shards");
  SAFECKPT_TRY(st.hash_type, string_member(*ser, "predicate.serialization", "hash_type"));
  if (hex_size(st.hash_type) == 0)
    return field_error("predicate.serialization.hash_type", "\"" + st.hash_type + "\" is not sha256/blake2b/blake3");
  SAFECKPT_TRY(const Json* sym, member(*ser, "predicate.serialization", "allow_symlinks", Json::value_t::boolean));
  st.allow_symlinks = sym->get<bool>();
  auto ss = ser->find("shard_size");
  if (st.method == Method::kShards) {
    if (ss == ser->end()) return field_error("predicate.serialization.shard_size", "missing for shards");
    if (ss->is_number_unsigned()) {
      st.shard_size = ss->get<std::uint64_t>();
    } else if (ss->is_number_float()) {
      double d = ss->get<double>();
      if (!(d >= 1 && d <= 9007199254740992.0) || d != static_cast<double>(static_cast<std::uint64_t>(d)))
        return field_error("predicate.serialization.shard_size", "not a positive integer");
      st.shard_size = static_cast<std::uint64_t>(d);
    } else {
      return field_error("predicate.serialization.shard_size", "not a positive integer");
    }
    if (st.shard_size == 0) return field_error("predicate.serialization.shard_size", "zero");
  } else if (ss != ser->end()) {
    return field_error("predicate.serialization.shard_size", "only for method shards");
  }
  if (auto ip = ser->find("ignore_paths"); ip != ser->end()) {
    if (!ip->is_array()) return field_error("predicate.serialization.ignore_paths", "must be an array");
    if (ip->size() > limits.max_ignore_paths)
      return make_error(ErrorCode::kLimitExceeded, "predicate.serialization.ignore_paths: more than " +
                                                       std::to_string(limits.max_ignore_paths) + " entries");
    std::vector<std::string> v;
    for (const Json& e : *ip) {
      if (!e.is_string()) return field_error("predicate.serialization.ignore_paths", "entries must be strings");
      const auto& p = e.get_ref<const std::string&>();
      SAFECKPT_CHECK(check_path_name(p, "predicate.serialization.ignore_paths", limits));
      v.push_back(p);
    }
    st.ignore_paths = std::move(v);
  }

  SAFECKPT_TRY(const Json* res, member(*pred, "predicate", "resources", Json::value_t::array));
  if (res->empty()) return field_error("predicate.resources", "empty: nothing is signed (MT issue #661)");
  if (res->size() > limits.max_resources)
    return make_error(ErrorCode::kLimitExceeded,
                      "predicate.resources: more than " + std::to_string(limits.max_resources) + " entries");
  const std::string shard_alg = st.hash_type + "-sharded-" + std::to_string(st.shard_size);
  const std::size_t hexn = hex_size(st.hash_type);
  st.resources.reserve(res->size());
  for (std::size_t i = 0; i < res->size(); ++i) {
    const Json& r = (*res)[i];
    const std::string f = "predicate.resources[" + std::to_string(i) + "]";
    if (!r.is_object()) return field_error(f, "not an object");
    SAFECKPT_CHECK(only_keys(r, f, {"name", "algorithm", "digest"}));
    Resource out;
    SAFECKPT_TRY(out.name, string_member(r, f, "name"));
    SAFECKPT_TRY(out.algorithm, string_member(r, f, "algorithm"));
    SAFECKPT_TRY(out.digest, string_member(r, f, "digest"));
    if (out.digest.size() != hexn || !is_lower_hex(out.digest))
      return field_error(f + ".digest", "not " + std::to_string(hexn) + " lowercase hex digits");
    std::string path = out.name;
    if (st.method == Method::kShards) {
      if (out.algorithm != shard_alg)
        return field_error(f + ".algorithm", "\"" + out.algorithm + "\" is not " + shard_alg);
      auto sn = split_shard_name(out.name);
      if (!sn) return field_error(f + ".name", sn.error().message());
      if (sn->end <= sn->start || sn->end - sn->start > st.shard_size || sn->start % st.shard_size != 0)
        return field_error(
            f + ".name", "shard range of \"" + out.name + "\" is not a shard of size " + std::to_string(st.shard_size));
      path = sn->path;
    } else if (out.algorithm != st.hash_type) {
      return field_error(f + ".algorithm", "\"" + out.algorithm + "\" differs from hash_type " + st.hash_type);
    }
    if (path != ".") SAFECKPT_CHECK(check_path_name(path, f + ".name", limits));
    st.resources.push_back(std::move(out));
  }
  // "." only as the whole (single-file) model; names unique.
  std::vector<std::string_view> names;
  names.reserve(st.resources.size());
  bool dot = false;
  for (const Resource& r : st.resources) {
    names.push_back(r.name);
    std::string_view p = r.name;
    if (st.method == Method::kShards) p = p.substr(0, p.rfind(':', p.rfind(':') - 1));
    if (p == ".") dot = true;
    if (dot && p != ".") return field_error("predicate.resources", "\".\" (a single-file model) beside other files");
  }
  std::sort(names.begin(), names.end());
  if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end())
    return field_error("predicate.resources", "duplicate name \"" + std::string(*d) + "\"");
  return st;
}

Result<Bundle> parse_bundle(Bytes bytes, const Limits& limits) {
  if (bytes.size() > limits.max_bundle_bytes)
    return make_error(ErrorCode::kLimitExceeded, "bundle: " + std::to_string(bytes.size()) + " bytes, more than " +
                                                     std::to_string(limits.max_bundle_bytes));
  SAFECKPT_TRY(Json j, parse_json(bytes, limits.max_json_depth, "bundle"));
  if (!j.is_object()) return field_error("bundle", "not a JSON object");
  SAFECKPT_CHECK(only_keys(j, "bundle", {"mediaType", "verificationMaterial", "dsseEnvelope"}));
  Bundle b;
  SAFECKPT_TRY(b.media_type, string_member(j, "bundle", "mediaType"));
  if (b.media_type != kMediaV03 && b.media_type != "application/vnd.dev.sigstore.bundle+json;version=0.1" &&
      b.media_type != "application/vnd.dev.sigstore.bundle+json;version=0.2" &&
      b.media_type != "application/vnd.dev.sigstore.bundle+json;version=0.3")
    return field_error("mediaType", "\"" + b.media_type + "\" is not a Sigstore bundle v0.1-v0.3 media type");

  SAFECKPT_TRY(const Json* vm, member(j, "bundle", "verificationMaterial", Json::value_t::object));
  SAFECKPT_CHECK(
      only_keys(*vm, "verificationMaterial",
                {"publicKey", "x509CertificateChain", "certificate", "tlogEntries", "timestampVerificationData"}));
  int forms =
      int(vm->contains("publicKey")) + int(vm->contains("x509CertificateChain")) + int(vm->contains("certificate"));
  if (forms != 1)
    return field_error("verificationMaterial", "must hold exactly one of publicKey, x509CertificateChain, certificate");
  if (auto t = vm->find("tlogEntries"); t != vm->end() && !t->is_array())
    return field_error("verificationMaterial.tlogEntries", "must be an array");
  if (vm->contains("publicKey")) {
    b.material = Material::kPublicKey;
    SAFECKPT_TRY(const Json* pk, member(*vm, "verificationMaterial", "publicKey", Json::value_t::object));
    SAFECKPT_CHECK(only_keys(*pk, "verificationMaterial.publicKey", {"hint", "rawBytes", "keyDetails"}));
    if (pk->contains("hint")) {
      SAFECKPT_TRY(std::string h, string_member(*pk, "verificationMaterial.publicKey", "hint"));
      if (h.size() != 64 || !is_lower_hex(h))
        return field_error("verificationMaterial.publicKey.hint", "not 64 lowercase hex digits");
      b.hint = h;
    }
    if (pk->contains("rawBytes")) {
      SAFECKPT_TRY(std::string raw, string_member(*pk, "verificationMaterial.publicKey", "rawBytes"));
      SAFECKPT_TRY(auto dec, decode_base64(raw, "verificationMaterial.publicKey.rawBytes"));
      b.raw_public_key = std::string(dec.begin(), dec.end());
    }
    if (pk->contains("keyDetails")) SAFECKPT_CHECK(string_member(*pk, "verificationMaterial.publicKey", "keyDetails"));
    if (!b.hint && !b.raw_public_key) return field_error("verificationMaterial.publicKey", "neither hint nor rawBytes");
  } else {
    const bool chain = vm->contains("x509CertificateChain");
    b.material = chain ? Material::kCertificates : Material::kKeyless;
    std::vector<const Json*> certs;
    if (chain) {
      SAFECKPT_TRY(const Json* xc, member(*vm, "verificationMaterial", "x509CertificateChain", Json::value_t::object));
      SAFECKPT_CHECK(only_keys(*xc, "verificationMaterial.x509CertificateChain", {"certificates"}));
      SAFECKPT_TRY(const Json* cs,
                   member(*xc, "verificationMaterial.x509CertificateChain", "certificates", Json::value_t::array));
      if (cs->empty() || cs->size() > limits.max_certificates)
        return field_error("verificationMaterial.x509CertificateChain.certificates",
                           "must hold 1.." + std::to_string(limits.max_certificates) + " certificates");
      for (const Json& c : *cs) certs.push_back(&c);
    } else {
      SAFECKPT_TRY(const Json* c, member(*vm, "verificationMaterial", "certificate", Json::value_t::object));
      certs.push_back(c);
    }
    for (std::size_t i = 0; i < certs.size(); ++i) {
      const std::string f = "verificationMaterial.certificates[" + std::to_string(i) + "]";
      if (!certs[i]->is_object()) return field_error(f, "not an object");
      SAFECKPT_CHECK(only_keys(*certs[i], f, {"rawBytes"}));
      SAFECKPT_TRY(std::string raw, string_member(*certs[i], f, "rawBytes"));
      SAFECKPT_TRY(auto der, decode_base64(raw, f + ".rawBytes"));
      if (der.empty()) return field_error(f + ".rawBytes", "empty");
      b.certificates.push_back(std::move(der));
    }
  }

  SAFECKPT_TRY(const Json* env, member(j, "bundle", "dsseEnvelope", Json::value_t::object));
  SAFECKPT_CHECK(only_keys(*env, "dsseEnvelope", {"payload", "payloadType", "signatures"}));
  SAFECKPT_TRY(std::string ptype, string_member(*env, "dsseEnvelope", "payloadType"));
  if (ptype != kPayloadType)
    return field_error("dsseEnvelope.payloadType", "\"" + ptype + "\" is not " + std::string(kPayloadType));
  SAFECKPT_TRY(std::string payload, string_member(*env, "dsseEnvelope", "payload"));
  SAFECKPT_TRY(b.payload, decode_base64(payload, "dsseEnvelope.payload"));
  SAFECKPT_TRY(const Json* sigs, member(*env, "dsseEnvelope", "signatures", Json::value_t::array));
  if (sigs->size() != 1)
    return field_error("dsseEnvelope.signatures",
                       "must hold exactly one signature, not " + std::to_string(sigs->size()));
  const Json& s0 = (*sigs)[0];
  if (!s0.is_object()) return field_error("dsseEnvelope.signatures[0]", "not an object");
  SAFECKPT_CHECK(only_keys(s0, "dsseEnvelope.signatures[0]", {"sig", "keyid"}));
  SAFECKPT_TRY(std::string sig, string_member(s0, "dsseEnvelope.signatures[0]", "sig"));
  SAFECKPT_TRY(b.signature, decode_base64(sig, "dsseEnvelope.signatures[0].sig"));
  if (b.signature.empty()) return field_error("dsseEnvelope.signatures[0].sig", "empty");
  if (auto k = s0.find("keyid"); k != s0.end() && !k->is_null() && !k->is_string())
    return field_error("dsseEnvelope.signatures[0].keyid", "must be a string or null");

  auto st = parse_statement(b.payload, limits);
  if (!st) {
    Error e = std::move(st).error();
    return unexpected(Error(e.code(), "dsseEnvelope.payload: " + e.message()));
  }
  b.statement = std::move(*st);
  return b;
}

Result<Bundle> read_bundle(const std::filesystem::path& path, const Limits& limits) {
  // MappedFile: one open, a regular file only (a FIFO is refused, not
  // waited on), sized on the descriptor it reads.
  auto f = MappedFile::open(path);
  if (!f) return make_error(ErrorCode::kIo, "cannot read bundle: " + f.error().message());
  if (f->size() > limits.max_bundle_bytes)
    return make_error(ErrorCode::kLimitExceeded, "bundle " + path.string() + ": " + std::to_string(f->size()) +
                                                     " bytes, more than " + std::to_string(limits.max_bundle_bytes));
  return parse_bundle(f->bytes(), limits);
}

std::string statement_json(const Statement& st) {
  // By hand: model_signing 1.1's layout (json.dumps(indent=2) of its
  // message, key order as in its golden statements), so a statement built
  // from the golden fixtures is byte-identical to the golden file.
  auto q = [](std::string_view s) { return Json(std::string(s)).dump(); };
  std::string o;
  o += "{\n  \"_type\": \"https://in-toto.io/Statement/v1\",\n  \"subject\": [\n    {\n      \"name\": ";
  o += q(st.subject_name);
  o += ",\n      \"digest\": {\n        \"sha256\": " + q(st.root_digest) + "\n      }\n    }\n  ],\n";
  o += "  \"predicateType\": \"https://model_signing/signature/v1.0\",\n  \"predicate\": {\n    \"serialization\": {\n";
  o += "      \"method\": " + q(st.method == Method::kFiles ? "files" : "shards") + ",\n";
  o += "      \"hash_type\": " + q(st.hash_type) + ",\n";
  o += std::string("      \"allow_symlinks\": ") + (st.allow_symlinks ? "true" : "false");
  if (st.method == Method::kShards) o += ",\n      \"shard_size\": " + std::to_string(st.shard_size) + ".0";
  if (st.ignore_paths) {
    o += ",\n      \"ignore_paths\": [";
    for (std::size_t i = 0; i < st.ignore_paths->size(); ++i)
      o += (i ? ",\n        " : "\n        ") + q((*st.ignore_paths)[i]);
    o += st.ignore_paths->empty() ? "]" : "\n      ]";
  }
  o += "\n    },\n    \"resources\": [";
  for (std::size_t i = 0; i < st.resources.size(); ++i) {
    const Resource& r = st.resources[i];
    o += i ? ",\n      {\n" : "\n      {\n";
    o += "        \"algorithm\": " + q(r.algorithm) + ",\n";
    o += "        \"digest\": " + q(r.digest) + ",\n";
    o += "        \"name\": " + q(r.name) + "\n      }";
  }
  o += st.resources.empty() ? "]\n  }\n}" : "\n    ]\n  }\n}";
  return o;
}

std::vector<std::uint8_t> pae(Bytes payload) {
  std::string head = "DSSEv1 " + std::to_string(kPayloadType.size()) + " " + std::string(kPayloadType) + " " +
                     std::to_string(payload.size()) + " ";
  std::vector<std::uint8_t> out(head.begin(), head.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::string bundle_json(const std::string& payload, Bytes signature, const std::optional<std::string>& hint,
                        const std::vector<std::vector<std::uint8_t>>& certificates) {
  nlohmann::ordered_json b;
  b["mediaType"] = std::string(kMediaV03);
  nlohmann::ordered_json vm;
  if (hint) {
    vm["publicKey"]["hint"] = *hint;
  } else {
    nlohmann::ordered_json certs = nlohmann::ordered_json::array();
    for (const auto& c : certificates) certs.push_back({{"rawBytes", encode_base64(c)}});
    vm["x509CertificateChain"]["certificates"] = certs;
  }
  vm["tlogEntries"] = nlohmann::ordered_json::array();
  b["verificationMaterial"] = vm;
  nlohmann::ordered_json env;
  env["payload"] = encode_base64(Bytes(reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()));
  env["payloadType"] = std::string(kPayloadType);
  env["signatures"] = nlohmann::ordered_json::array({{{"sig", encode_base64(signature)}, {"keyid", ""}}});
  b["dsseEnvelope"] = env;
  return b.dump();
}

}  // namespace safeckpt::sign
