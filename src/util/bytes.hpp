// src/util/bytes.hpp — byte-level helpers shared by the readers and writers
// (internal, not installed; header-only): little-endian loads and stores (and
// the one big-endian load pickle's BINFLOAT needs),
// checked 64-bit arithmetic, UTF-8 validation and encoding, JSON string
// escaping. One copy each instead of one per file (issue 12).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace safeckpt::util {

// ---- little-endian -----------------------------------------------------------

// The unsigned T stored little-endian at p[0, sizeof(T)). The caller has
// checked that those bytes exist.
template <class T>
constexpr T load_le(const std::uint8_t* p) noexcept {
  static_assert(std::is_unsigned_v<T>);
  T v = 0;
  for (std::size_t i = sizeof(T); i-- > 0;) v = static_cast<T>((v << 8) | p[i]);
  return v;
}

// The unsigned T stored big-endian at p[0, sizeof(T)) (pickle's BINFLOAT).
// The caller has checked that those bytes exist.
template <class T>
constexpr T load_be(const std::uint8_t* p) noexcept {
  static_assert(std::is_unsigned_v<T>);
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>((v << 8) | p[i]);
  return v;
}

// Writes the unsigned v little-endian to p[0, sizeof(T)).
template <class T>
constexpr void store_le(std::uint8_t* p, T v) noexcept {
  static_assert(std::is_unsigned_v<T>);
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// Appends the sizeof(T) little-endian bytes of the unsigned v to `out` (a
// std::vector<std::uint8_t> or std::string).
template <class T, class Out>
void append_le(Out& out, T v) {
  static_assert(std::is_unsigned_v<T>);
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<typename Out::value_type>(v >> (8 * i)));
}

// ---- checked arithmetic ------------------------------------------------------

// out = a * b; false (out untouched) when the product does not fit 64 bits.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  out = r;
  return true;
}

// out = a + b; false (out untouched) when the sum does not fit 64 bits.
inline bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  std::uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return false;
  out = r;
  return true;
}

// ---- UTF-8 -------------------------------------------------------------------

// Whether `s` is well-formed UTF-8 (RFC 3629: 1-4 byte sequences, shortest
// form, at most U+10FFFF). Encoded surrogates U+D800..U+DFFF are refused
// unless `allow_surrogates` (Python's "surrogatepass", which the pickle
// BINUNICODE family uses: pickle.py's _Unpickler decodes with it).
inline bool valid_utf8(std::string_view s, bool allow_surrogates = false) noexcept {
  std::size_t i = 0;
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    unsigned c = u[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    std::uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((u[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (u[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    if (!allow_surrogates && cp >= 0xD800 && cp <= 0xDFFF) return false;
    i += len;
  }
  return true;
}

// Appends code point `cp` (at most U+10FFFF; surrogates are encoded as they
// are, like Python's "surrogatepass") as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// ---- JSON --------------------------------------------------------------------

// How append_json_string writes control characters (< 0x20).
enum class JsonControls {
  kSerde,    // \b \f \n \r \t by name, the rest as \u00xx: serde_json's escaping (safetensors headers)
  kUnicode,  // every one as \u00xx
};

// Appends `s` as a JSON string literal: '"', escapes for '"', '\\' and the
// control characters (lower-case hex), every other byte, non-ASCII included,
// verbatim (the caller has checked that `s` is UTF-8 where it must be).
inline void append_json_string(std::string& out, std::string_view s, JsonControls controls) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (unsigned char c : s) {
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20) {
      if (controls == JsonControls::kSerde) {
        switch (c) {
          case '\b': out += "\\b"; continue;
          case '\f': out += "\\f"; continue;
          case '\n': out += "\\n"; continue;
          case '\r': out += "\\r"; continue;
          case '\t': out += "\\t"; continue;
          default: break;
        }
      }
      out += "\\u00";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

}  // namespace safeckpt::util
