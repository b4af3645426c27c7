// One test per technique of docs/threats.md (../shared/docs/threats.md),
// built here with harmless payloads; each must be flagged with the right
// finding and never come out clean.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>

#include "test_scan_helpers.hpp"

using namespace scantest;
using safeckpt::scan::Rule;
using safeckpt::scan::ScanOptions;
using safeckpt::scan::Verdict;

TEST_CASE("scan: a clean torch zip and a clean bare pickle are clean, and the loader agrees") {
  auto r = scan(make_zip(torch_members(state_dict_pickle())));
  INFO(dump(r));
  CHECK(r.format == "torch_zip");
  CHECK(r.verdict == Verdict::kClean);
  CHECK(r.loader.ran);
  CHECK(r.loader.ok);
  CHECK(r.complete);
  // every import is still listed, as allowed
  bool saw_rebuild = false;
  for (const auto& e : r.events)
    if (e.name == "torch._utils._rebuild_tensor_v2" && e.allowed) saw_rebuild = true;
  CHECK(saw_rebuild);
  auto b = scan(empty_dict_pickle());
  INFO(dump(b));
  CHECK(b.verdict == Verdict::kClean);
}

TEST_CASE("scan: broken stream after the call (nullifAI) reports the global, the call and the parse error") {
  Buf p = proto(2) + call1("os", "system", "true") + "\xff";
  auto r = scan(make_zip(torch_members(p)));
  INFO(dump(r));
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK_FALSE(r.complete);
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(has(r, Rule::kCall, "os.system"));
  CHECK(has(r, Rule::kMalformed));
  // and as a bare pickle
  auto b = scan(p);
  CHECK(has(b, Rule::kImportDangerous, "os.system"));
  CHECK(has(b, Rule::kMalformed));
}

TEST_CASE("scan: a raw pickle named pytorch_model.bin is detected by content (CVE-2025-10155)") {
  auto dir = std::filesystem::temp_directory_path() / "safeckpt_scan_rawbin";
  std::filesystem::create_directories(dir);
  write_file(dir / "pytorch_model.bin", os_system_pickle());
  auto r = safeckpt::scan::scan_file(dir / "pytorch_model.bin");
  INFO(dump(r));
  CHECK(r.format == "bare_pickle");
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(has(r, Rule::kCall, "os.system"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("scan: legacy file with the payload in stream 2, in stream 4, and after the storage data") {
  SUBCASE("clean legacy file") {
    auto r = scan(legacy_file(legacy_protocol(), legacy_object()));
    INFO(dump(r));
    CHECK(r.format == "legacy_pickle");
    CHECK(r.verdict == Verdict::kClean);
    CHECK(r.loader.ok);
  }
  SUBCASE("stream 2 (protocol version) is a call") {
    auto r = scan(legacy_file(proto(2) + call1("builtins", "exec", "true") + kStop, legacy_object()));
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kUnsafe);
    bool in_stream_1 = false;
    for (const auto& f : r.findings)
      if (f.rule == Rule::kImportDangerous && f.global == "builtins.exec" && f.stream == 1) in_stream_1 = true;
    CHECK(in_stream_1);
  }
  SUBCASE("stream 4 (object) hides a call in a dict value") {
    Buf obj = proto(2) + kEmptyDict + binunicode("x") + call1("subprocess", "Popen", "true") + kSetItem + kStop;
    auto r = scan(legacy_file(legacy_protocol(), obj));
    INFO(dump(r));
    bool in_stream_3 = false;
    for (const auto& f : r.findings)
      if (f.rule == Rule::kImportDangerous && f.global == "subprocess.Popen" && f.stream == 3) in_stream_3 = true;
    CHECK(in_stream_3);
    CHECK(r.verdict == Verdict::kUnsafe);
  }
  SUBCASE("a pickle appended after the storage data") {
    auto r = scan(legacy_file(legacy_protocol(), legacy_object(), os_system_pickle()));
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kUnsafe);
    CHECK(has(r, Rule::kTrailingData));
    bool in_stream_5 = false;
    for (const auto& f : r.findings)
      if (f.rule == Rule::kImportDangerous && f.global == "os.system" && f.stream == 5) in_stream_5 = true;
    CHECK(in_stream_5);
    CHECK_FALSE(r.loader.ok);  // the loader refuses bytes after the last storage
  }
}

TEST_CASE("scan: the legacy magic number produced by a call (picklescan GHSA-97f8-7cmv-76j2)") {
  Buf magic = proto(2) + call1("builtins", "eval", "0x1950A86A20F9469CFC6C") + kStop;
  Buf f = magic + legacy_protocol() + (proto(2) + kEmptyDict + kStop) + legacy_object();
  auto r = scan(f);
  INFO(dump(r));
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK(has(r, Rule::kImportDangerous, "builtins.eval"));
  CHECK(has(r, Rule::kCall, "builtins.eval"));
  CHECK(r.pickle_streams >= 4);  // every stream examined, not just the first
}

TEST_CASE("scan: local-header name differs from the central name (CVE-2025-1944)") {
  auto m = torch_members(os_system_pickle());
  m[0].local_name = "archive/data.pkX";
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kArchiveAnomaly, "local_name_mismatch"));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(r.verdict == Verdict::kUnsafe);
  // a benign pickle behind the mismatch is still not clean
  auto m2 = torch_members(state_dict_pickle());
  m2[0].local_name = "archive/data.pkX";
  auto r2 = scan(make_zip(m2));
  CHECK(r2.verdict == Verdict::kUnsafe);
  CHECK_FALSE(r2.loader.ok);
}

TEST_CASE("scan: CRC mismatch (CVE-2025-10156): reported, and the bytes PyTorch reads are scanned") {
  auto m = torch_members(os_system_pickle());
  m[0].crc = 0x12345678;
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kArchiveAnomaly, "crc_mismatch"));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  auto m2 = torch_members(state_dict_pickle());
  m2[0].crc = 0x12345678;
  auto r2 = scan(make_zip(m2));
  CHECK(r2.verdict != Verdict::kClean);
}

TEST_CASE("scan: general-purpose flag bits 0x01/0x20/0x40 (CVE-2025-1945)") {
  for (int flag : {0x01, 0x20, 0x40}) {
    CAPTURE(flag);
    auto m = torch_members(state_dict_pickle());
    m[0].flags = static_cast<std::uint16_t>(flag);
    auto r = scan(make_zip(m));
    INFO(dump(r));
    CHECK(has_text(r, Rule::kArchiveAnomaly, "flag_bits"));
    CHECK(r.verdict != Verdict::kClean);
  }
}

TEST_CASE("scan: TorchScript archive with constants.pkl is executable code; its pickles are scanned") {
  std::vector<Member> m = {{"archive/data.pkl", empty_dict_pickle()},
                           {"archive/constants.pkl", proto(2) + call1("builtins", "print", "x") + kStop},
                           {"archive/code/__torch__.py", "def forward(self): pass\n"},
                           {"archive/version", "3\n"}};
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(r.format == "torchscript_zip");
  CHECK(has(r, Rule::kExecutableCode));
  bool print_seen = false;
  for (const auto& f : r.findings)
    if (f.global == "builtins.print" && f.member == "archive/constants.pkl") print_seen = true;
  CHECK(print_seen);
  CHECK_FALSE(r.loader.ok);
  CHECK(r.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan: PT2 archive with native code") {
  std::vector<Member> m = {{"model/archive_format", "pt2"},
                           {"model/data/aotinductor/model/model.so",
                            "\x7f"
                            "ELF"},
                           {"model/data/aotinductor/model/k.cubin", "xx"}};
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(r.format == "pt2_archive");
  CHECK(has_text(r, Rule::kExecutableCode, ".so"));
  CHECK(has_text(r, Rule::kExecutableCode, ".cubin"));
  CHECK(r.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan: a pickle in a zip member not called .pkl (CVE-2025-1889)") {
  auto m = torch_members(state_dict_pickle());
  m.push_back({"archive/extra/data.txt", os_system_pickle()});
  auto r = scan(make_zip(m));
  INFO(dump(r));
  bool found = false;
  for (const auto& f : r.findings)
    if (f.global == "os.system" && f.member == "archive/extra/data.txt") found = true;
  CHECK(found);
  CHECK(r.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan: SETITEM on a tensor (CVE-2026-24747)") {
  Buf p = proto(2) + tensor_expr() + binunicode("k") + binunicode("v") + kSetItem + kStop;
  auto r = scan(make_zip(torch_members(p)));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kRefusedOperation, "SETITEM"));
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK_FALSE(r.loader.ok);
  CHECK(r.loader.code == safeckpt::ErrorCode::kDisallowedOperation);
}

TEST_CASE("scan: STACK_GLOBAL with names from the memo, decoys, out-of-order and missing memo keys") {
  SUBCASE("memo operands") {
    Buf p = proto(4) + short_binunicode("os") + kMemoize + short_binunicode("system") + kMemoize +
            short_binunicode("torch") + short_binunicode("Size") + kPop + kPop + binget(0) + binget(1) + kStackGlobal +
            short_binunicode("true") + kTuple1 + kReduce + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kImportDangerous, "os.system"));
    CHECK(has(r, Rule::kCall, "os.system"));
  }
  SUBCASE("out-of-order BINPUT indices") {
    Buf p = proto(4) + short_binunicode("system") + binput(9) + short_binunicode("os") + binput(3) + kPop + kPop +
            binget(3) + binget(9) + kStackGlobal + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kImportDangerous, "os.system"));
  }
  SUBCASE("BINGET of an index never written") {
    Buf p = proto(4) + short_binunicode("os") + binget(7) + kStackGlobal + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kMalformed));
    CHECK(r.verdict != Verdict::kClean);
    CHECK_FALSE(r.complete);
  }
}

TEST_CASE("scan: names built at run time (modelscan #331) are dynamic imports") {
  // STACK_GLOBAL whose module operand is the result of a call (str('os')).
  Buf p = proto(4) + global("builtins", "str") + short_binunicode("os") + kTuple1 + kReduce +
          short_binunicode("system") + kStackGlobal + kStop;
  auto r = scan(p);
  INFO(dump(r));
  CHECK(has(r, Rule::kImportDynamic));
  CHECK(has(r, Rule::kCall, "builtins.str"));
  CHECK(r.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan: INST, OBJ, NEWOBJ, NEWOBJ_EX and EXT1-4 are recorded whether or not the result is used") {
  SUBCASE("INST") {
    Buf p = proto(2) + kMark + binunicode("true") + "ios\nsystem\n" + kPop + kEmptyDict + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kImportDangerous, "os.system"));
    CHECK(has(r, Rule::kRefusedOpcode, "os.system"));
    CHECK(has(r, Rule::kCall, "os.system"));
  }
  SUBCASE("OBJ") {
    Buf p = proto(2) + kMark + global("subprocess", "call") + binunicode("true") + "o" + kPop + kEmptyDict + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kImportDangerous, "subprocess.call"));
    CHECK(has(r, Rule::kRefusedOpcode, "subprocess.call"));
  }
  SUBCASE("NEWOBJ") {
    Buf p =
        proto(2) + global("subprocess", "Popen") + binunicode("true") + kTuple1 + "\x81" + kPop + kEmptyDict + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kCall, "subprocess.Popen"));
    CHECK(r.verdict == Verdict::kUnsafe);
  }
  SUBCASE("NEWOBJ_EX") {
    Buf p = proto(4) + global("subprocess", "Popen") + kEmptyTuple + kEmptyDict + "\x92" + kPop + kEmptyDict + kStop;
    auto r = scan(p);
    INFO(dump(r));
    CHECK(has(r, Rule::kRefusedOpcode, "subprocess.Popen"));
    CHECK(has(r, Rule::kCall, "subprocess.Popen"));
  }
  SUBCASE("EXT1 EXT2 EXT4") {
    for (Buf ext : {Buf("\x82\x01", 2), Buf("\x83\x01\x02", 3), Buf("\x84\x01\x02\x03\x04", 5)}) {
      Buf p = proto(2) + ext + kPop + kEmptyDict + kStop;
      auto r = scan(p);
      INFO(dump(r));
      CHECK(has(r, Rule::kImportExtension));
      CHECK(r.verdict == Verdict::kUnsafe);
    }
  }
}

TEST_CASE("scan: resource exhaustion is a finding (scan incomplete), never a crash, never clean") {
  safeckpt::scan::ScanOptions small;
  small.limits = safeckpt::fuzz_limits();
  SUBCASE("billion laughs via BINGET/DUP stays linear (shared references)") {
    Buf p = proto(2) + "]" + binput(0);
    for (int i = 0; i < 40; ++i) {
      p += kMark;
      for (int k = 0; k < 10; ++k) p += binget(0);
      p += "l" + binput(0);
    }
    p += kStop;
    auto t0 = std::chrono::steady_clock::now();
    auto r = scan(p);
    INFO(dump(r));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));  // sanity, not a benchmark
    CHECK((r.verdict == Verdict::kClean || r.verdict == Verdict::kIncomplete));
  }
  SUBCASE("memo flood with indices near 2^32") {
    Buf p = proto(2) + kEmptyDict;
    for (std::uint32_t i = 0; i < 200000; ++i) p += "r" + u32(0xFFFFFFFFu - i);
    p += kStop;
    auto r = scan(p, small);
    INFO(dump(r));
    CHECK(has(r, Rule::kLimit));
    CHECK(r.verdict == Verdict::kIncomplete);
  }
  SUBCASE("deep nesting") {
    Buf p = proto(2) + Buf(200000, '(') + kEmptyDict + kStop;
    auto r = scan(p, small);
    INFO(dump(r));
    CHECK(has(r, Rule::kLimit));
    CHECK(r.verdict != Verdict::kClean);
  }
  SUBCASE("declared 2^62 lengths in a tiny file") {
    for (char op : {'\x8d', '\x8e', '\x96'}) {
      Buf p = proto(4) + Buf(1, op) + u64(1ull << 62) + "abc" + kStop;
      auto r = scan(p);
      INFO(dump(r));
      CHECK((has(r, Rule::kLimit) || has(r, Rule::kMalformed)));
      CHECK(r.verdict != Verdict::kClean);
      CHECK_FALSE(r.complete);
    }
    Buf p = proto(2) + "X" + u32(0xFFFFFFF0u) + "abc" + kStop;
    auto r = scan(p);
    CHECK(r.verdict != Verdict::kClean);
  }
  SUBCASE("deflate bomb in data.pkl") {
    Buf bomb = proto(2) + "]" + Buf(4u << 20, 'N') + kStop;  // 4 MiB -> a few KiB deflated
    auto m = torch_members(bomb);
    m[0].deflate = true;
    ScanOptions o = small;
    o.limits.max_inflated_bytes = 1u << 20;
    auto r = scan(make_zip(m), o);
    INFO(dump(r));
    CHECK(has(r, Rule::kLimit));
    CHECK(r.verdict != Verdict::kClean);
  }
  SUBCASE("deflate bomb in an unreferenced member is not inflated whole") {
    auto m = torch_members(state_dict_pickle());
    m.push_back({"archive/extra/blob", Buf(16u << 20, '\0'), true});
    ScanOptions o;
    o.limits.max_inflated_bytes = 1u << 20;
    auto r = scan(make_zip(m), o);
    INFO(dump(r));
    CHECK_FALSE(has(r, Rule::kLimit));  // only a prefix was inflated to sniff it
  }
}

TEST_CASE("scan: a 100,000-entry zip finishes in bounded memory") {
  std::vector<Member> m;
  m.reserve(100001);
  m.push_back({"archive/data.pkl", state_dict_pickle()});
  m.push_back({"archive/version", "3\n"});
  m.push_back({"archive/data/0", Buf(8, '\0')});
  for (int i = 0; i < 100000; ++i)
    m.push_back({"archive/extra/" + std::to_string(i), "N."});  // every member a pickle: the slow path
  Buf z = make_zip(m);
  auto t0 = std::chrono::steady_clock::now();
  auto r = scan(z);
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("100,000-entry zip scanned in " << secs << " s, " << r.findings.size() << " findings");
  INFO(dump(r).substr(0, 2000));
  CHECK(r.members >= 100000);
  CHECK(r.verdict == Verdict::kClean);  // 100,000 harmless members: nothing to report
  CHECK(r.findings.size() <= 10002);    // report cap + notes
}

TEST_CASE("scan: 7z, gzip, bzip2, xz, zstd wrappers are unscannable containers, never clean") {
  for (Buf magic : {Buf("7z\xbc\xaf\x27\x1c\x00\x04", 8), Buf("\x1f\x8b\x08\x00", 4), Buf("BZh91AY&SY", 10),
                    Buf("\xfd"
                        "7zXZ\x00",
                        6),
                    Buf("\x28\xb5\x2f\xfd", 4)}) {
    auto r = scan(magic + "payload-bytes");
    INFO(dump(r));
    CHECK(has(r, Rule::kUnscannable));
    CHECK(r.verdict == Verdict::kUnscannable);
    CHECK_FALSE(r.complete);
  }
  // ... also inside a zip
  auto m = torch_members(state_dict_pickle());
  m.push_back({"archive/extra/payload.7z", Buf("7z\xbc\xaf\x27\x1c\x00\x04", 8) + "x"});
  auto r = scan(make_zip(m));
  CHECK(has(r, Rule::kUnscannable));
}

TEST_CASE("scan: nested loaders and embedded pickles, with a depth cap") {
  // pickle.loads(_codecs.encode('<inner pickle as latin-1 text>', 'latin1'))
  auto latin1_as_utf8 = [](const Buf& raw) {
    Buf s;
    for (unsigned char c : raw) {
      if (c < 0x80) {
        s.push_back(static_cast<char>(c));
      } else {
        s.push_back(static_cast<char>(0xC0 | (c >> 6)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
    return s;
  };
  auto wrap = [&](const Buf& inner) {
    return proto(2) + global("pickle", "loads") + global("_codecs", "encode") + binunicode(latin1_as_utf8(inner)) +
           binunicode("latin1") + "\x86" + kReduce + kTuple1 + kReduce + kStop;
  };
  Buf one = wrap(os_system_pickle());
  auto r = scan(one);
  INFO(dump(r));
  CHECK(has(r, Rule::kImportDangerous, "pickle.loads"));
  CHECK(has(r, Rule::kCall, "pickle.loads"));
  CHECK(has(r, Rule::kEmbeddedPayload));
  bool inner = false;
  for (const auto& f : r.findings)
    if (f.global == "os.system" && f.member.find("!bytes#0") != std::string::npos) inner = true;
  CHECK(inner);
  // an embedded protocol-4 pickle without PROTO is still recognised
  Buf noproto = short_binunicode("os") + short_binunicode("system") + kStackGlobal + short_binunicode("true") +
                kTuple1 + kReduce + kStop;
  auto rn = scan(wrap(noproto));
  INFO(dump(rn));
  CHECK(has(rn, Rule::kEmbeddedPayload));
  // three levels deep with max_nesting 1: the deeper payload is not examined -> finding
  Buf three = wrap(wrap(wrap(os_system_pickle())));
  ScanOptions o;
  o.max_nesting = 1;
  auto r3 = scan(three, o);
  INFO(dump(r3));
  CHECK(has(r3, Rule::kLimit));
  CHECK(r3.verdict == Verdict::kUnsafe);
  // nested torch.load of an embedded checkpoint
  Buf ckpt = make_zip(torch_members(os_system_pickle()));
  Buf t = proto(2) + global("torch.serialization", "_load") + binunicode("x") + kTuple1 + kReduce + kPop +
          global("_codecs", "encode") + binunicode(latin1_as_utf8(ckpt)) + binunicode("latin1") + "\x86" + kReduce +
          kStop;
  auto rt = scan(t);
  INFO(dump(rt));
  CHECK(has(rt, Rule::kEmbeddedPayload));
}

TEST_CASE("scan: bare pickles are scanned to the end: every concatenated stream") {
  Buf p = empty_dict_pickle() + empty_dict_pickle() + os_system_pickle();
  auto r = scan(p);
  INFO(dump(r));
  CHECK(r.pickle_streams == 3);
  bool s2 = false;
  for (const auto& f : r.findings)
    if (f.global == "os.system" && f.stream == 2) s2 = true;
  CHECK(s2);
  // trailing garbage after the last STOP is a finding
  auto g = scan(empty_dict_pickle() + "\xff\xfe junk");
  CHECK(has(g, Rule::kTrailingData));
  CHECK(g.verdict != Verdict::kClean);
}

TEST_CASE("scan: a pickle without PROTO starting with a protocol-4 opcode is still scanned") {
  Buf p = short_binunicode("os") + short_binunicode("system") + kStackGlobal + short_binunicode("true") + kTuple1 +
          kReduce + kStop;
  auto r = scan(p);
  INFO(dump(r));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(r.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan: dotted names and fix_imports spellings are canonicalised like the loader") {
  auto d = scan(proto(2) + global("builtins", "getattr.__call__") + kPop + kEmptyDict + kStop);
  INFO(dump(d));
  CHECK(has(d, Rule::kImportDotted));
  // protocol 2: __builtin__.eval is builtins.eval
  auto e = scan(proto(2) + call1("__builtin__", "eval", "1") + kStop);
  INFO(dump(e));
  CHECK(has(e, Rule::kImportDangerous, "builtins.eval"));
  // __builtin__.set is allowlisted after mapping
  auto s = scan(proto(2) + global("__builtin__", "set") + "]" + kTuple1 + kReduce + kStop);
  INFO(dump(s));
  CHECK(s.verdict == Verdict::kClean);
}

TEST_CASE("scan: numpy .npy object arrays and safetensors validation") {
  auto npy = [](const std::string& descr, const Buf& body) {
    std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (1,), }";
    while ((10 + h.size() + 1) % 64) h += ' ';
    h += '\n';
    return Buf("\x93NUMPY\x01\x00", 8) + u16(h.size()) + h + body;
  };
  auto num = scan(npy("<f4", Buf(4, '\0')));
  INFO(dump(num));
  CHECK(num.format == "numpy_npy");
  CHECK(num.verdict == Verdict::kClean);
  auto obj = scan(npy("|O", os_system_pickle()));
  INFO(dump(obj));
  CHECK(has(obj, Rule::kNumpyObject));
  CHECK(has(obj, Rule::kImportDangerous, "os.system"));
  // npz = zip of npy members
  auto npz = scan(make_zip({{"a.npy", npy("|O", os_system_pickle())}, {"b.npy", npy("<f4", Buf(4, '\0'))}}));
  INFO(dump(npz));
  CHECK(has(npz, Rule::kNumpyObject));
  CHECK(has(npz, Rule::kImportDangerous, "os.system"));

  auto st = [](const std::string& header, const Buf& data) { return u64(header.size()) + header + data; };
  auto good =
      scan(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})", Buf(8, '\0')));
  INFO(dump(good));
  CHECK(good.format == "safetensors");
  CHECK(good.verdict == Verdict::kClean);
  auto overlap = scan(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         Buf(8, '\0')));
  CHECK(has(overlap, Rule::kSafetensors));
  auto gap = scan(st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", Buf(8, '\0')));
  CHECK(has(gap, Rule::kSafetensors));
  auto big = scan(st(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", Buf(8, '\0')));
  CHECK(has(big, Rule::kSafetensors));
  auto dup = scan(st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     Buf(8, '\0')));
  INFO(dump(dup));
  CHECK(has(dup, Rule::kSafetensors));  // duplicate keys: serde_json keeps the last one silently
  CHECK(dup.verdict != Verdict::kClean);
}

TEST_CASE("scan: text and JSON files are not models; an empty file neither") {
  auto j = scan("{\"architectures\": [\"Bert\"]}\n");
  CHECK(j.verdict == Verdict::kNotModel);
  auto t = scan("# README\nhello\n");
  CHECK(t.verdict == Verdict::kNotModel);
  auto e = scan("");
  CHECK(e.verdict == Verdict::kNotModel);
  auto v = scan("the\nof\nand\n");  // 't' = TUPLE needs a MARK: fails before anything can run
  CHECK(v.verdict == Verdict::kNotModel);
  // but a protocol-2 opcode that pushes a value can start a real pickle: fail closed
  auto p = scan(Buf("\x88\xff\xff", 3));
  INFO(dump(p));
  CHECK(p.verdict == Verdict::kIncomplete);
  CHECK(has(p, Rule::kMalformed));
}

TEST_CASE("scan: after a stream the loader refuses outright (INST, EXT), the next stream is still scanned") {
  Buf inst = proto(2) + kMark + binunicode("true") + "ios\nsystem\n" + kStop;
  Buf ext = proto(2) + Buf("\x82\x07", 2) + kStop;
  auto r = scan(inst + ext + proto(2) + call1("webbrowser", "open", "x") + kStop);
  INFO(dump(r));
  CHECK(r.pickle_streams == 3);
  CHECK(has(r, Rule::kRefusedOpcode, "os.system"));
  CHECK(has(r, Rule::kImportExtension));
  bool third = false;
  for (const auto& f : r.findings)
    if (f.global == "webbrowser.open" && f.stream == 2 && f.offset == inst.size() + ext.size() + 2) third = true;
  CHECK(third);
}
