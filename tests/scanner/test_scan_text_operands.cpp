// Issue 11, item 7: text operands CPython's C unpickler accepts but pickle
// never writes ("I0x10", "I1_0", "L0x10L", "I1\0z", "F1.5\0x", GET/PUT
// indices with whitespace or '_'). The loader refuses them (kMalformed); the
// scanner reads them as CPython does, reports each with a finding, and walks
// on so a payload after them is named (verdict unsafe, not incomplete).
// Expected values were observed with CPython 3.11.2 by
// tests/data/text_operands/cpython_text_operands.py (output: observed.txt).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "test_scan_helpers.hpp"

using namespace scantest;
using safeckpt::ErrorCode;
using safeckpt::scan::Rule;
using safeckpt::scan::Verdict;
using namespace std::string_literals;

namespace {

struct Row {
  std::string op, arg, cpython;  // cpython: repr of pickle.loads, or "!ValueError"
};

// Rows of observed.txt (same order).
const std::vector<Row>& rows() {
  static const std::vector<Row> kRows = {
      {"I", "0x10", "16"},
      {"I", "1_0", "10"},
      {"I", "1\x00z"s, "1"},
      {"I", "010", "8"},
      {"I", " 7", "7"},
      {"I", "+1", "True"},
      {"I", "-0", "False"},
      {"I", "0o17", "15"},
      {"I", "0b11", "3"},
      {"I", "0X1F", "31"},
      {"I", "0x1_0", "16"},
      {"I", "1 ", "1"},
      {"I",
       "\x09"
       "8",
       "8"},
      {"I", "1\x0d", "1"},
      {"I", "1\x00"s, "True"},
      {"I", "99999999999999999999_0", "999999999999999999990"},
      {"I", "0x8000000000000000", "9223372036854775808"},
      {"I", "-0x8000000000000000", "-9223372036854775808"},
      {"I", "\x00"s, "0"},
      {"L", "0x10L", "16"},
      {"L", "1_0L", "10"},
      {"L", " 5 L", "5"},
      {"L", "0b1\x00L"s, "1"},
      {"L", "-0o7", "-7"},
      {"F", "1.5\x00x"s, "1.5"},
      {"F", "-2.5\x00"s, "-2.5"},
      {"I", "0x", "!ValueError"},
      {"I", "1__0", "!ValueError"},
      {"I", "_1", "!ValueError"},
      {"L", "010L", "!ValueError"},
      {"F", " 1.5", "!ValueError"},
      {"F", "1_0.5", "!ValueError"},
  };
  return kRows;
}

// <operand> POP, then os.system('true'): protocol 0 throughout.
Buf then_os_system(const Row& r) {
  return r.op + r.arg + "\n0" + global("os", "system") + "(S'true'\ntR.";
}

safeckpt::Result<safeckpt::Checkpoint> load_pickle(const Buf& p) {
  std::vector<std::uint8_t> buf(p.begin(), p.end());
  return safeckpt::load_buffer(std::move(buf));
}

}  // namespace

TEST_CASE("text operands: the scanner reads what CPython accepts and names the payload after it") {
  for (const Row& row : rows()) {
    if (row.cpython[0] == '!') continue;
    INFO(row.op << " '" << row.arg << "' (CPython: " << row.cpython << ")");
    auto r = scan(then_os_system(row));
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kUnsafe);
    CHECK(has(r, Rule::kImportDangerous, "os.system"));
    CHECK(has_text(r, Rule::kRefusedOpcode, "CPython reads it as " + row.cpython));
    CHECK_FALSE(has(r, Rule::kMalformed));
  }
}

TEST_CASE("text operands: the loader refuses every non-canonical form (kMalformed)") {
  for (const Row& row : rows()) {
    INFO(row.op << " '" << row.arg << "'");
    auto l = load_pickle(row.op + row.arg + "\n.");
    REQUIRE_FALSE(l.has_value());
    CHECK(l.error().code() == ErrorCode::kMalformed);
  }
  // The canonical forms still load, with CPython's values.
  for (const char* ok : {"I16\n.", "I-7\n.", "I00\n.", "I01\n.", "L16L\n.", "L-7\n.", "F1.5\n.", "F-2.5\n."}) {
    auto l = load_pickle(ok);
    CHECK_MESSAGE(l.has_value(), (l ? "" : l.error().to_string()));
  }
}

TEST_CASE("text operands: forms CPython refuses stop the scan there (incomplete, the payload is not run)") {
  for (const Row& row : rows()) {
    if (row.cpython[0] != '!') continue;
    INFO(row.op << " '" << row.arg << "'");
    auto r = scan(then_os_system(row));
    INFO(dump(r));
    CHECK(has(r, Rule::kMalformed));
    CHECK_FALSE(has(r, Rule::kImportDangerous, "os.system"));
  }
}

TEST_CASE("text operands: GET/PUT indices read as int(s, 10)") {
  // observed.txt: PUT " 01" / "1_0" / "1\0x" / "+1" store at the index GET
  // reads back (pickle.loads gives 7); PUT "0x1" is a ValueError.
  struct Put {
    std::string text, get;
  };
  for (const Put& p : std::vector<Put>{{" 01", "1"}, {"1_0", "10"}, {"1\x00x"s, "1"}, {"+1", "1"}}) {
    INFO("PUT '" << p.text << "'");
    Buf pk = "I7\np" + p.text + "\n0g" + p.get + "\n0" + global("os", "system") + "(S'true'\ntR.";
    auto r = scan(pk);
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kUnsafe);
    CHECK(has(r, Rule::kImportDangerous, "os.system"));
    CHECK(has_text(r, Rule::kRefusedOpcode, "PUT operand"));
    CHECK_FALSE(has(r, Rule::kMalformed));
    auto l = load_pickle("I7\np" + p.text + "\n0g" + p.get + "\n.");
    REQUIRE_FALSE(l.has_value());
    CHECK(l.error().code() == ErrorCode::kMalformed);
  }
  auto r = scan("I7\np0x1\n0g1\n0" + global("os", "system") + "(S'true'\ntR.");
  INFO(dump(r));
  CHECK(has(r, Rule::kMalformed));
}
