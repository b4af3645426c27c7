// src/util/bytes.hpp: the one copy of the byte-level helpers. Expected values
// were observed with CPython 3.11 (struct.pack, bytes.decode with "strict" and
// "surrogatepass", json.dumps(..., ensure_ascii=False)).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "util/bytes.hpp"

namespace {

using safeckpt::util::append_json_string;
using safeckpt::util::append_le;
using safeckpt::util::append_utf8;
using safeckpt::util::checked_add;
using safeckpt::util::checked_mul;
using safeckpt::util::JsonControls;
using safeckpt::util::load_be;
using safeckpt::util::load_le;
using safeckpt::util::store_le;
using safeckpt::util::valid_utf8;

TEST_CASE("bytes: the big-endian load reads struct.pack('>d', 1.5) (pickle BINFLOAT)") {
  // struct.pack(">d", 1.5).hex() == "3ff8000000000000"
  const std::uint8_t d[8] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0};
  const std::uint64_t bits = load_be<std::uint64_t>(d);
  double v = 0;
  std::memcpy(&v, &bits, 8);
  CHECK(v == 1.5);
}

TEST_CASE("bytes: little-endian loads and stores match struct.pack('<Q') / ('<I')") {
  // struct.pack("<Q", 0x0102030405060708).hex() == "0807060504030201"
  const std::uint8_t q[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
  CHECK(load_le<std::uint64_t>(q) == 0x0102030405060708ull);
  // struct.pack("<I", 0xA1B2C3D4).hex() == "d4c3b2a1"
  const std::uint8_t i[4] = {0xd4, 0xc3, 0xb2, 0xa1};
  CHECK(load_le<std::uint32_t>(i) == 0xA1B2C3D4u);
  CHECK(load_le<std::uint16_t>(i) == 0xc3d4u);
  CHECK(load_le<std::uint8_t>(i) == 0xd4u);

  std::uint8_t out[8] = {};
  store_le(out, std::uint64_t{0x0102030405060708ull});
  CHECK(std::vector<std::uint8_t>(out, out + 8) == std::vector<std::uint8_t>(q, q + 8));
  std::vector<std::uint8_t> v;
  append_le(v, std::uint32_t{0xA1B2C3D4u});
  append_le(v, std::uint16_t{0x0102});
  CHECK(v == std::vector<std::uint8_t>{0xd4, 0xc3, 0xb2, 0xa1, 0x02, 0x01});
  std::string s;
  append_le(s, std::uint32_t{0xA1B2C3D4u});
  CHECK(s == std::string("\xd4\xc3\xb2\xa1", 4));
}

TEST_CASE("bytes: checked arithmetic refuses 64-bit overflow and leaves the output alone") {
  std::uint64_t out = 7;
  CHECK(checked_mul(1ull << 32, 1ull << 31, out));
  CHECK(out == 1ull << 63);
  out = 7;
  CHECK_FALSE(checked_mul(1ull << 32, 1ull << 32, out));
  CHECK(out == 7);
  CHECK(checked_mul(0, UINT64_MAX, out));
  CHECK(out == 0);
  out = 7;
  CHECK(checked_add(UINT64_MAX - 1, 1, out));
  CHECK(out == UINT64_MAX);
  out = 7;
  CHECK_FALSE(checked_add(UINT64_MAX, 1, out));
  CHECK(out == 7);
}

TEST_CASE("bytes: valid_utf8 agrees with bytes.decode('utf-8', strict / surrogatepass)") {
  struct Row {
    std::string bytes;
    bool strict, surrogatepass;
  };
  const Row rows[] = {
      {"\xed\xa0\x80", false, true},         // encoded surrogate U+D800
      {"\xc0\x80", false, false},            // overlong NUL
      {"\xf4\x90\x80\x80", false, false},    // above U+10FFFF
      {"\xe2\x82", false, false},            // truncated
      {"\xf0\x9f\x98\x80", true, true},      // U+1F600
      {"\xc3\xa9", true, true},              // U+00E9
      {std::string("a\0b", 3), true, true},  // NUL is a character
  };
  for (const auto& r : rows) {
    CAPTURE(r.bytes);
    CHECK(valid_utf8(r.bytes) == r.strict);
    CHECK(valid_utf8(r.bytes, true) == r.surrogatepass);
  }
}

TEST_CASE("bytes: append_utf8 encodes as str.encode('utf-8', 'surrogatepass')") {
  std::string s;
  append_utf8(s, 0xE9);
  CHECK(s == "\xc3\xa9");
  s.clear();
  append_utf8(s, 0xD7FF);
  CHECK(s == "\xed\x9f\xbf");
  s.clear();
  append_utf8(s, 0x1F600);
  CHECK(s == "\xf0\x9f\x98\x80");
  s.clear();
  append_utf8(s, 0xD800);
  CHECK(s == "\xed\xa0\x80");
}

TEST_CASE("bytes: append_json_string") {
  const std::string in = "a\"\\\b\f\n\r\t\x01\x1f\xc3\xa9";
  std::string serde;
  append_json_string(serde, in, JsonControls::kSerde);
  // json.dumps(in, ensure_ascii=False), which escapes as serde_json does
  CHECK(serde == "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\xc3\xa9\"");
  // what convert.cpp's json_quote wrote before it used the util (compiled from a1a8b3d and run)
  std::string unicode;
  append_json_string(unicode, in, JsonControls::kUnicode);
  CHECK(unicode == "\"a\\\"\\\\\\u0008\\u000c\\u000a\\u000d\\u0009\\u0001\\u001f\xc3\xa9\"");
}

}  // namespace
