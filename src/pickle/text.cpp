// Text of pickle operands: integers and strings as CPython's unpickler
// decodes them, and CPython's readings of textual number operands
// (declarations and sources of each rule: src/pickle/text.hpp). Moved out of
// machine.cpp unchanged (issue 12).
#include "pickle/text.hpp"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace safeckpt::pickle_text {

// Decimal text of a little-endian two's-complement integer.
std::string bigint_decimal(const std::uint8_t* p, std::size_t n) {
  bool neg = n > 0 && (p[n - 1] & 0x80);
  std::vector<std::uint32_t> mag((n + 3) / 4 + 1, 0);  // little-endian 32-bit limbs
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t b = neg ? static_cast<std::uint8_t>(~p[i]) : p[i];
    mag[i / 4] |= static_cast<std::uint32_t>(b) << (8 * (i % 4));
  }
  if (neg) {  // magnitude = ~x + 1
    for (auto& limb : mag) {
      if (++limb != 0) break;
    }
  }
  std::string digits;
  for (;;) {
    bool zero = true;
    for (auto l : mag)
      if (l) zero = false;
    if (zero) break;
    std::uint64_t rem = 0;
    for (std::size_t i = mag.size(); i-- > 0;) {
      std::uint64_t cur = (rem << 32) | mag[i];
      mag[i] = static_cast<std::uint32_t>(cur / 1000000000u);
      rem = cur % 1000000000u;
    }
    for (int k = 0; k < 9; ++k) {
      digits.push_back(static_cast<char>('0' + rem % 10));
      rem /= 10;
    }
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (digits.empty()) digits.push_back('0');  // not = "0": GCC 12 -Wrestrict false positive (PR 105329)
  if (neg) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// codecs.escape_decode (the STRING opcode's argument, without the quotes).
std::optional<std::string> escape_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size());  // output <= input: one allocation, charged by the caller
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (++i >= in.size()) return std::nullopt;  // "Trailing \ in string"
    char e = in[i];
    switch (e) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 't': out.push_back('\t'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 'v': out.push_back('\v'); break;
      case 'a': out.push_back('\a'); break;
      case 'x': {
        if (in.size() - i < 3) return std::nullopt;  // need two hex digits
        int h = hex_value(in[i + 1]), l = hex_value(in[i + 2]);
        if (h < 0 || l < 0) return std::nullopt;
        out.push_back(static_cast<char>(h * 16 + l));
        i += 2;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k)
            v = v * 8 + (in[++i] - '0');
          out.push_back(static_cast<char>(v & 0xFF));
        } else {
          out.push_back('\\');  // unknown escapes are kept verbatim
          out.push_back(e);
        }
    }
  }
  return out;
}

// raw-unicode-escape decoding (the UNICODE opcode): \uXXXX and \UXXXXXXXX are
// escapes, every other byte is a Latin-1 code point.
std::optional<std::string> raw_unicode_escape_decode(std::string_view in) {
  std::string out;
  out.reserve(2 * in.size());  // <= 2 UTF-8 bytes per input byte: one allocation, charged by the caller
  for (std::size_t i = 0; i < in.size(); ++i) {
    auto c = static_cast<unsigned char>(in[i]);
    if (c == '\\' && i + 1 < in.size() && (in[i + 1] == 'u' || in[i + 1] == 'U')) {
      // An odd run of backslashes is needed for an escape; pickle writes
      // backslashes themselves as \u005c, so a single '\' before u is one.
      std::size_t n = in[i + 1] == 'u' ? 4 : 8;
      if (in.size() - (i + 2) < n) return std::nullopt;
      std::uint32_t cp = 0;
      for (std::size_t k = 0; k < n; ++k) {
        int h = hex_value(in[i + 2 + k]);
        if (h < 0) return std::nullopt;
        cp = cp * 16 + static_cast<std::uint32_t>(h);
      }
      if (cp > 0x10FFFF) return std::nullopt;
      append_utf8(out, cp);
      i += 1 + n;
    } else {
      append_utf8(out, c);
    }
  }
  return out;
}

// ---- CPython's readings of textual number operands ---------------------------
// What Modules/_pickle.c does with the text of INT, LONG, FLOAT, GET and PUT
// (CPython 3.11, observed with Debian's /usr/bin/python3; see
// tests/scanner/test_scan_text_operands.cpp): the line is a C string, so a NUL
// ends it; load_int tries strtol(s, &end, 0) and accepts it when `end` is at
// the '\n' or a NUL (a 2-character line of value 0 or 1 is a bool), else
// falls back to int(s, 0); load_long drops a final 'L' and uses int(s, 0);
// load_float uses PyOS_string_to_double and accepts `end` at '\n' or NUL;
// GET/PUT use int(s, 10). int(s, base) = PyLong_FromString: surrounding
// whitespace, a sign, 0x/0o/0b prefixes (base 0), '_' between digits,
// no leading zeros for a base-0 decimal.

bool c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

// The text up to its first NUL (what a C function sees).
std::string_view c_string(std::string_view s) {
  auto z = s.find('\0');
  return z == std::string_view::npos ? s : s.substr(0, z);
}

// Digits in `base` (2..16) -> decimal digits. Callers bound the length.
std::string to_decimal(std::string_view digits, int base) {
  std::vector<std::uint32_t> limbs{0};  // little-endian, base 1e9
  for (char ch : digits) {
    std::uint64_t carry = static_cast<std::uint64_t>(digit_value(ch));
    for (auto& l : limbs) {
      std::uint64_t v = static_cast<std::uint64_t>(l) * static_cast<std::uint64_t>(base) + carry;
      l = static_cast<std::uint32_t>(v % 1000000000u);
      carry = v / 1000000000u;
    }
    if (carry != 0) limbs.push_back(static_cast<std::uint32_t>(carry));
  }
  std::string out = std::to_string(limbs.back());
  for (std::size_t i = limbs.size() - 1; i-- > 0;) {
    std::string part = std::to_string(limbs[i]);
    out += std::string(9 - part.size(), '0') + part;
  }
  return out;
}

// int(s, base) for base 0 or 10, as PyLong_FromString(s, NULL, base) reads
// the C string `s`; nullopt where Python raises ValueError.
std::optional<TextInt> python_int(std::string_view s, int base) {
  s = c_string(s);
  std::size_t i = 0, n = s.size();
  while (i < n && c_space(s[i])) ++i;
  TextInt t;
  if (i < n && (s[i] == '+' || s[i] == '-')) t.neg = s[i++] == '-';
  int b = 10;
  bool prefixed = false;
  if (base == 0 && i + 1 < n && s[i] == '0') {
    char p = s[i + 1];
    if (p == 'x' || p == 'X') b = 16;
    if (p == 'o' || p == 'O') b = 8;
    if (p == 'b' || p == 'B') b = 2;
    prefixed = b != 10;
    if (prefixed) i += 2;
  }
  if (prefixed && i < n && s[i] == '_') ++i;  // "0x_1f"
  std::string digits;
  bool need_digit = true;
  for (; i < n; ++i) {
    if (s[i] == '_') {
      if (need_digit) return std::nullopt;
      need_digit = true;
      continue;
    }
    if (digit_value(s[i]) >= b) break;
    digits.push_back(s[i]);
    need_digit = false;
  }
  if (digits.empty() || need_digit) return std::nullopt;
  while (i < n && c_space(s[i])) ++i;
  if (i != n) return std::nullopt;
  if (base == 0 && b == 10 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
    return std::nullopt;  // "010": leading zeros in a base-0 decimal
  t.dec = to_decimal(digits, b);
  return t;
}

// strtol(s, &end, 0) on the C string `s` (glibc, 64-bit long) followed by
// load_int's check that `end` is at the line end or a NUL. nullopt: CPython
// falls back to int(s, 0) (bad end, or overflow).
std::optional<std::int64_t> c_strtol_line(std::string_view line) {
  std::string_view s = c_string(line);
  std::size_t i = 0, n = s.size();
  while (i < n && c_space(s[i])) ++i;
  bool neg = false;
  if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  int b = 10;
  if (i < n && s[i] == '0') {
    b = 8;
    if (i + 2 < n && (s[i + 1] == 'x' || s[i + 1] == 'X') && digit_value(s[i + 2]) < 16) {
      b = 16;
      i += 2;
    }
  }
  std::size_t start = i;
  const std::uint64_t lim = std::uint64_t{1} << 63;  // |INT64_MIN|
  std::uint64_t v = 0;
  bool overflow = false;
  for (; i < n && digit_value(s[i]) < b; ++i) {
    auto d = static_cast<std::uint64_t>(digit_value(s[i]));
    if (v > (lim - d) / static_cast<std::uint64_t>(b)) {
      overflow = true;
    } else {
      v = v * static_cast<std::uint64_t>(b) + d;
    }
  }
  if (i == start) return n == 0 ? std::optional<std::int64_t>(0) : std::nullopt;  // no digits: end = s
  if (i != n) return std::nullopt;
  if (overflow || (!neg && v == lim)) return std::nullopt;  // ERANGE
  if (neg) return v == lim ? INT64_MIN : -static_cast<std::int64_t>(v);
  return static_cast<std::int64_t>(v);
}

// What Python's pickle writes: -?(0|[1-9][0-9]*).
bool canonical_decimal(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  if (s.empty() || (s[0] == '0' && s.size() > 1)) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

bool parse_decimal_int(std::string_view s, std::string& digits_out, bool& neg) {
  neg = false;
  std::size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) {
    neg = s[i] == '-';
    ++i;
  }
  if (i >= s.size()) return false;
  for (std::size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  std::size_t j = i;
  while (j + 1 < s.size() && s[j] == '0') ++j;
  digits_out = std::string(s.substr(j));
  return true;
}

// Printable form of a text operand for messages and findings.
std::string shown_text(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out.push_back(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

}  // namespace safeckpt::pickle_text
