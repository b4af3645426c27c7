// Internal: the text of pickle operands, for the machine (src/pickle/machine.cpp).
// Integers and strings decoded as CPython's Modules/_pickle.c decodes them,
// and CPython's readings of the textual number operands of INT, LONG, FLOAT,
// GET and PUT (PickleOptions::cpython_text_operands; the rules are stated
// above each definition in text.cpp). No recursion; inputs are bounded by the
// caller (the machine checks lengths against Limits first).
// UTF-8 helpers are the shared ones (src/util/bytes.hpp; pickle passes
// allow_surrogates = true: Python's "surrogatepass").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "util/bytes.hpp"

namespace safeckpt::pickle_text {

// Decimal text of a little-endian two's-complement integer of `n` bytes.
std::string bigint_decimal(const std::uint8_t* p, std::size_t n);
using util::append_utf8;
using util::valid_utf8;
// Value of a hex digit, or -1.
int hex_value(char c);
// Python's escape decoding of a STRING operand's quoted body; nullopt if invalid.
std::optional<std::string> escape_decode(std::string_view in);
// raw-unicode-escape decoding of a UNICODE operand, to UTF-8; nullopt if invalid.
std::optional<std::string> raw_unicode_escape_decode(std::string_view in);

// C isspace() in the "C" locale.
bool c_space(char c);
// Digit value of 0-9, a-z, A-Z (10..35); 99 for anything else.
int digit_value(char c);
// The text up to its first NUL (what a C function sees).
std::string_view c_string(std::string_view s);

// An integer as sign and decimal digits.
struct TextInt {
  bool neg = false;
  std::string dec;  // decimal digits, no leading zeros ("0" for zero)
};
// Digits in `base` (2..16) -> decimal digits. Callers bound the length.
std::string to_decimal(std::string_view digits, int base);
// int(s, base) for base 0 or 10, as PyLong_FromString(s, NULL, base) reads
// the C string `s`; nullopt where Python raises ValueError.
std::optional<TextInt> python_int(std::string_view s, int base);
// strtol(s, &end, 0) then load_int's end check; nullopt: CPython falls back
// to int(s, 0).
std::optional<std::int64_t> c_strtol_line(std::string_view line);
// What Python's pickle writes: -?(0|[1-9][0-9]*).
bool canonical_decimal(std::string_view s);
// The longest text number operand read CPython's way (int's 4300-digit
// limit, with room for prefixes, separators and whitespace).
inline constexpr std::size_t kMaxCPythonNumberText = 8192;
// An optional sign and decimal digits only: the digits without leading zeros.
bool parse_decimal_int(std::string_view s, std::string& digits_out, bool& neg);
// Printable form of a text operand for messages and findings (at most 40
// characters, other bytes as \xNN, then "...").
std::string shown_text(std::string_view s);

}  // namespace safeckpt::pickle_text
