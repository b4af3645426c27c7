// Catalogue of malformed and hostile inputs for the pickle, global, storage
// and view stages, each mapped to its exact ErrorCode. The inputs are built
// here byte by byte (each row says what it mimics); the zip stage has its own
// catalogue in test_zip.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"
#include "support/zip_builder.hpp"

using safeckpt::ErrorCode;
using namespace std::string_literals;

namespace {

std::string g(const std::string& m, const std::string& n) {
  return "c" + m + "\n" + n + "\n";
}
std::string uni(const std::string& s) {
  std::string out = "X";
  std::uint32_t n = static_cast<std::uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  return out + s;
}
std::string u32(std::uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}
std::string u64(std::uint64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}

safeckpt::Result<safeckpt::Checkpoint> load_pickle(const std::string& p, const safeckpt::Limits& lim = {}) {
  safeckpt::LoadOptions o;
  o.limits = lim;
  std::vector<std::uint8_t> buf(p.begin(), p.end());
  return safeckpt::load_buffer(std::move(buf), o);
}

// A torch.save-style zip around `pkl` with storages `data/<key>`.
safeckpt::Result<safeckpt::Checkpoint> load_zip(const std::string& pkl,
                                                std::vector<std::pair<std::string, std::string>> storages = {}) {
  test_support::ZipBuilder z("archive");
  z.add("data.pkl", pkl);
  z.add("byteorder", "little");
  for (auto& [k, v] : storages) z.add("data/" + k, v);
  z.add("version", "3\n");
  return safeckpt::load_buffer(z.finish());
}

// _rebuild_tensor_v2 over FloatStorage key "0" with numel `numel`.
std::string tensor_pickle(const std::string& numel_op, const std::string& offset_op, const std::string& size_tuple,
                          const std::string& stride_tuple) {
  return "\x80\x02" + g("torch._utils", "_rebuild_tensor_v2") + "((" + uni("storage") + g("torch", "FloatStorage") +
         uni("0") + uni("cpu") + numel_op + "tQ" + offset_op + size_tuple + stride_tuple + "\x89" +
         g("collections", "OrderedDict") + ")RtR.";
}

struct Row {
  const char* what;  // what the input mimics
  std::string pickle;
  ErrorCode code;
};

}  // namespace

TEST_CASE("pickle stage: malformed streams are kMalformed, never a crash") {
  const std::vector<Row> rows = {
      {"empty stream", "", ErrorCode::kMalformed},
      {"no STOP (truncated)", "\x80\x02K\x01", ErrorCode::kMalformed},
      {"invalid opcode byte", std::string("\x80\x02\xff.", 4), ErrorCode::kMalformed},
      {"broken stream after a call (nullifAI) with no policy issue", "\x80\x02]\xfe", ErrorCode::kMalformed},
      {"BINUNICODE length past the end",
       "\x80\x02X\xff\xff\x00\x00"s
       "ab.",
       ErrorCode::kMalformed},
      {"LONG4 negative length", "\x80\x02\x8b\xff\xff\xff\xff.", ErrorCode::kMalformed},
      {"BINSTRING negative length", "\x80\x02T\xff\xff\xff\xff.", ErrorCode::kMalformed},
      {"stack underflow: TUPLE1 on empty stack", "\x80\x02\x85.", ErrorCode::kMalformed},
      {"APPEND below a MARK fence", "\x80\x02](K\x01a.", ErrorCode::kMalformed},
      {"BINGET of an index never written", "\x80\x02h\x07.", ErrorCode::kMalformed},
      {"LONG_BINGET near 2^32", "\x80\x02j\xff\xff\xff\xff.", ErrorCode::kMalformed},
      {"STOP with two values", "\x80\x02K\x01K\x02.", ErrorCode::kMalformed},
      {"STOP with an open MARK", "\x80\x02(K\x01.", ErrorCode::kMalformed},
      {"odd SETITEMS", "\x80\x02}(K\x01u.", ErrorCode::kMalformed},
      {"invalid UTF-8 in BINUNICODE", "\x80\x02X\x01\x00\x00\x00\xff."s, ErrorCode::kMalformed},
      {"text INT with garbage", "I12x\n.", ErrorCode::kMalformed},
      {"STRING not quoted", "Sabc\n.", ErrorCode::kMalformed},
      {"FRAME longer than the stream", "\x80\x04\x95" + u64(1000) + "K\x01.", ErrorCode::kMalformed},
      {"opcode argument crossing a FRAME end",
       "\x80\x04\x95" + u64(2) +
           "X\x01\x00\x00\x00"s
           "a.",
       ErrorCode::kMalformed},
      {"new FRAME inside a frame", "\x80\x04\x95" + u64(10) + "\x95" + u64(1) + "N.", ErrorCode::kMalformed},
      {"REDUCE arguments not a tuple", "\x80\x02" + g("collections", "OrderedDict") + "]R.", ErrorCode::kMalformed},
      {"unsupported protocol 6", "\x80\x06N.", ErrorCode::kUnsupported},
      {"out-of-band buffer (protocol 5)", "\x80\x05\x97.", ErrorCode::kUnsupported},
      {"bytes after STOP in a bare pickle", "\x80\x02N.N.", ErrorCode::kMalformed},
  };
  for (const auto& r : rows) {
    auto res = load_pickle(r.pickle);
    REQUIRE_MESSAGE(!res.has_value(), r.what);
    CHECK_MESSAGE(res.error().code() == r.code, std::string(r.what) << ": got " << res.error().to_string());
    CHECK_MESSAGE(!res.error().message().empty(), r.what);
  }
}

TEST_CASE("limit stage: hostile sizes hit a Limits cap (kLimitExceeded)") {
  safeckpt::Limits small = safeckpt::fuzz_limits();
  // Billion laughs: a list DUP'ed and appended into itself-like growth.
  std::string laughs = "\x80\x02(]" + std::string(10000, '2') + "l.";  // one list DUP'ed 10000 times
  std::string deep = "\x80\x02";
  for (int i = 0; i < 5000; ++i) deep += "(";
  std::string memo_bomb = "\x80\x02N";
  for (int i = 0; i < 5000; ++i) memo_bomb += "r" + u32(static_cast<std::uint32_t>(i));
  memo_bomb += ".";
  std::string huge_str = "\x80\x04\x8d" + u64(1ull << 62) + "abc.";
  std::string big_long = "\x80\x02\x8b" + u32(100000) + std::string(100000, '\x01') + ".";
  const std::vector<Row> rows = {
      {"DUP flood (billion laughs)", laughs, ErrorCode::kLimitExceeded},
      {"MARK nesting 5000 deep", deep, ErrorCode::kLimitExceeded},
      {"memo with 5000 entries (cap 4096)", memo_bomb, ErrorCode::kLimitExceeded},
      {"declared string length 2^62", huge_str, ErrorCode::kLimitExceeded},
      {"100000-byte LONG4", big_long, ErrorCode::kLimitExceeded},
  };
  for (const auto& r : rows) {
    auto res = load_pickle(r.pickle, small);
    REQUIRE_MESSAGE(!res.has_value(), r.what);
    CHECK_MESSAGE(res.error().code() == r.code, std::string(r.what) << ": got " << res.error().to_string());
  }
}

TEST_CASE("global stage: imports and calls outside the allowlist are policy errors") {
  const std::vector<Row> rows = {
      {"GLOBAL os.system (blocked module)", "\x80\x02" + g("os", "system") + uni("true") + "\x85R.",
       ErrorCode::kDisallowedGlobal},
      {"py2 spelling __builtin__.eval maps to builtins.eval",
       "\x80\x02" + g("__builtin__", "eval") + uni("1") + "\x85R.", ErrorCode::kDisallowedGlobal},
      {"dotted name walks attributes", "\x80\x02" + g("collections", "OrderedDict.fromkeys") + ".",
       ErrorCode::kDisallowedGlobal},
      {"STACK_GLOBAL from memoized strings", "\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94.",
       ErrorCode::kDisallowedGlobal},
      {"STACK_GLOBAL with a non-string operand (dynamic import)", "\x80\x04K\x01K\x02\x93.",
       ErrorCode::kDisallowedGlobal},
      {"INST", "(S'true'\nios\nsystem\n.", ErrorCode::kDisallowedGlobal},
      {"EXT2", "\x80\x02\x83\x01\x00)R."s, ErrorCode::kDisallowedGlobal},
      {"NEWOBJ of a default-allowlisted class (torch allows only Parameter/user classes)",
       "\x80\x02" + g("collections", "OrderedDict") + ")\x81.", ErrorCode::kDisallowedOperation},
      {"NEWOBJ_EX", "\x80\x04" + g("collections", "OrderedDict") + ")}\x92.", ErrorCode::kDisallowedOperation},
      {"FROZENSET opcode without builtins.frozenset allowed", "\x80\x04(K\x01\x91.", ErrorCode::kDisallowedGlobal},
      {"SETITEM on a list (CVE-2026-24747 family)", "\x80\x02]K\x01K\x02s.", ErrorCode::kDisallowedOperation},
      {"APPEND on a dict",
       "\x80\x02}K\x01"
       "a.",
       ErrorCode::kDisallowedOperation},
      {"unhashable dict key", "\x80\x02}]K\x01s.", ErrorCode::kDisallowedOperation},
      {"BUILD on a plain dict", "\x80\x02}}b.", ErrorCode::kDisallowedOperation},
      {"calling a dtype", "\x80\x02" + g("torch", "float16") + ")R.", ErrorCode::kDisallowedOperation},
      {"text persistent id (protocol 0 PERSID)", "P0\n.", ErrorCode::kDisallowedOperation},
      {"BINPERSID with a non-tuple", "\x80\x02K\x01Q.", ErrorCode::kDisallowedOperation},
      {"BINPERSID not a storage", "\x80\x02" + uni("module") + "\x85Q.", ErrorCode::kDisallowedOperation},
  };
  for (const auto& r : rows) {
    auto res = load_pickle(r.pickle);
    REQUIRE_MESSAGE(!res.has_value(), r.what);
    CHECK_MESSAGE(res.error().code() == r.code, std::string(r.what) << ": got " << res.error().to_string());
  }
}

TEST_CASE("storage and view stage: records and views are checked") {
  std::string four_floats(16, '\0');
  // Valid baseline: 4 floats, shape (4,), stride (1,).
  auto ok = load_zip(tensor_pickle("K\x04", "K\x00"s, "K\x04\x85", "K\x01\x85"), {{"0", four_floats}});
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  CHECK(ok->tensors().size() == 1);
  CHECK(ok->storages()[0].nbytes == 16);

  struct VRow {
    const char* what;
    std::string pickle;
    std::vector<std::pair<std::string, std::string>> storages;
    ErrorCode code;
  };
  const std::vector<VRow> rows = {
      {"storage record missing", tensor_pickle("K\x04", "K\x00"s, "K\x04\x85", "K\x01\x85"), {}, ErrorCode::kMalformed},
      {"record shorter than numel x elsize (CVE-2026-24747)",
       tensor_pickle("K\x04", "K\x00"s, "K\x04\x85", "K\x01\x85"),
       {{"0", std::string(8, '\0')}},
       ErrorCode::kMalformed},
      {"record longer than numel x elsize",
       tensor_pickle("K\x04", "K\x00"s, "K\x04\x85", "K\x01\x85"),
       {{"0", std::string(20, '\0')}},
       ErrorCode::kMalformed},
      {"view past the end of its storage",
       tensor_pickle("K\x04", "K\x01", "K\x04\x85", "K\x01\x85"),
       {{"0", four_floats}},
       ErrorCode::kMalformed},
      {"negative stride",
       tensor_pickle("K\x04", "K\x03", "K\x04\x85", "J\xff\xff\xff\xff\x85"),
       {{"0", four_floats}},
       ErrorCode::kMalformed},
      {"negative storage offset",
       tensor_pickle("K\x04", "J\xff\xff\xff\xff", "K\x01\x85", "K\x01\x85"),
       {{"0", four_floats}},
       ErrorCode::kMalformed},
      {"size/stride overflow",
       tensor_pickle("K\x04", "K\x00"s, "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40K\x02\x86"s,
                     "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40K\x01\x86"s),
       {{"0", four_floats}},
       ErrorCode::kMalformed},
      {"size and stride of different rank",
       tensor_pickle("K\x04", "K\x00"s, "K\x02K\x02\x86", "K\x01\x85"),
       {{"0", four_floats}},
       ErrorCode::kMalformed},
  };
  for (const auto& r : rows) {
    auto res = load_zip(r.pickle, r.storages);
    REQUIRE_MESSAGE(!res.has_value(), r.what);
    CHECK_MESSAGE(res.error().code() == r.code, std::string(r.what) << ": got " << res.error().to_string());
  }
  // Zero-numel views pass with any offset and stride (PyTorch does the same).
  auto empty = load_zip(tensor_pickle("K\x04", "K\x63", "K\x00\x85"s, "K\x07\x85"), {{"0", four_floats}});
  CHECK_MESSAGE(empty.has_value(), (empty ? "" : empty.error().to_string()));
  // Stride 0 (expand) is allowed.
  auto expand = load_zip(tensor_pickle("K\x04", "K\x00"s, "K\x03K\x04\x86", "K\x00K\x01\x86"s), {{"0", four_floats}});
  CHECK_MESSAGE(expand.has_value(), (expand ? "" : expand.error().to_string()));
}

TEST_CASE("container stage: what the file is decides, not its name") {
  // TorchScript archive: constants.pkl present -> refused as executable code.
  test_support::ZipBuilder ts("archive");
  ts.add("data.pkl", "\x80\x02N.");
  ts.add("constants.pkl", "\x80\x02).");
  ts.add("version", "3\n");
  auto r = safeckpt::load_buffer(ts.finish());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::kUnsupported);
  CHECK(r.error().message().find("TorchScript") != std::string::npos);
  // version outside 1..10
  test_support::ZipBuilder v99("archive");
  v99.add("data.pkl", "\x80\x02N.");
  v99.add("version", "99\n");
  auto r2 = safeckpt::load_buffer(v99.finish());
  REQUIRE_FALSE(r2.has_value());
  CHECK(r2.error().code() == ErrorCode::kUnsupported);
  // gzip wrapper
  auto r3 = safeckpt::load_buffer({0x1f, 0x8b, 8, 0, 0, 0, 0, 0});
  REQUIRE_FALSE(r3.has_value());
  CHECK(r3.error().code() == ErrorCode::kUnsupported);
  // byteorder must be little or big
  test_support::ZipBuilder bo("archive");
  bo.add("data.pkl", "\x80\x02N.");
  bo.add("byteorder", "middle");
  bo.add("version", "3\n");
  auto r4 = safeckpt::load_buffer(bo.finish());
  REQUIRE_FALSE(r4.has_value());
  CHECK(r4.error().code() == ErrorCode::kMalformed);
}

TEST_CASE("data opcodes torch lacks still denote the same values") {
  // protocol 4 with FRAME/MEMOIZE/SHORT_BINUNICODE: {'a': [1, 2]}
  std::string body =
      "}\x94\x8c\x01"
      "a\x94]\x94(K\x01K\x02"
      "es.";
  std::string p4 = "\x80\x04\x95" + u64(body.size()) + body;
  auto r = load_pickle(p4);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  const auto& a = r->values();
  const auto& root = a[r->root()];
  REQUIRE(root.kind == safeckpt::Kind::kDict);
  REQUIRE(root.items.size() == 2);
  CHECK(a[root.items[0]].text == "a");
  CHECK(a[root.items[1]].items.size() == 2);
  // Python dict semantics: 1, 1.0 and True are one key; the first key object stays, the last value wins.
  auto d = load_pickle("\x80\x02}(K\x01K\x0aG?\xf0\x00\x00\x00\x00\x00\x00K\x0b\x88K\x0cu."s);
  REQUIRE(d.has_value());
  const auto& dn = d->values()[d->root()];
  REQUIRE(dn.items.size() == 2);
  CHECK(d->values()[dn.items[0]].kind == safeckpt::Kind::kInt);
  CHECK(d->values()[dn.items[1]].i == 12);
  // Text protocol 0: INT, FLOAT, STRING with escapes, UNICODE raw escapes, LIST/DICT.
  auto p0 = load_pickle("(lp0\nI-7\naF0.25\naS'a\\x41\\n'\naVx\\u00e9\na.");
  REQUIRE_MESSAGE(p0.has_value(), (p0 ? "" : p0.error().to_string()));
  const auto& l = p0->values()[p0->root()];
  REQUIRE(l.items.size() == 4);
  CHECK(p0->values()[l.items[0]].i == -7);
  CHECK(p0->values()[l.items[1]].re == 0.25);
  CHECK(p0->values()[l.items[2]].text == "aA\n");
  CHECK(p0->values()[l.items[3]].text == "x\xc3\xa9");
  // A memoized list appended to itself is a cycle, not an infinite copy.
  auto cyc = load_pickle(
      "\x80\x02]q\x00h\x00"s
      "a.");
  REQUIRE(cyc.has_value());
  const auto& cl = cyc->values()[cyc->root()];
  REQUIRE(cl.items.size() == 1);
  CHECK(cl.items[0] == cyc->root());
}

TEST_CASE("JSON output of a hostile shared graph stays bounded") {
  // L0 = []; L(i) = [L(i-1), L(i-1)] via the memo: 2^40 paths, 42 nodes.
  std::string p = "\x80\x02]q"s + '\0';
  for (int i = 1; i <= 40; ++i) {
    p += "0(h"s + static_cast<char>(i - 1) + "h" + static_cast<char>(i - 1) + "lq" + static_cast<char>(i);
  }
  p += ".";
  auto r = load_pickle(p);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  CHECK(r->values().size() < 200);
  safeckpt::JsonOptions o;
  o.max_output_nodes = 1u << 16;
  auto j = safeckpt::to_json(*r, o);
  REQUIRE_FALSE(j.has_value());
  CHECK(j.error().code() == ErrorCode::kLimitExceeded);
}
