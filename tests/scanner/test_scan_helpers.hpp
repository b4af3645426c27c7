// Builders for the scanner tests: pickles by opcode, zips with every knob an
// attacker turns (local/central names, CRC, flags, deflate, trailing bytes),
// legacy sequential-pickle files. Payloads are harmless strings ("true").
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "safeckpt/scan.hpp"
#include "safeckpt/zip.hpp"

namespace scantest {

using Buf = std::string;  // bytes

inline Buf u16(std::uint64_t v) {
  return Buf{static_cast<char>(v & 0xFF), static_cast<char>((v >> 8) & 0xFF)};
}
inline Buf u32(std::uint64_t v) {
  Buf b;
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return b;
}
inline Buf u64(std::uint64_t v) {
  Buf b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return b;
}

// ---- pickle opcodes ----
inline Buf proto(int n) {
  return Buf{'\x80', static_cast<char>(n)};
}
inline Buf global(const std::string& m, const std::string& n) {
  return "c" + m + "\n" + n + "\n";
}
inline Buf binunicode(const std::string& s) {
  return "X" + u32(s.size()) + s;
}
inline Buf short_binunicode(const std::string& s) {
  return Buf{'\x8c', static_cast<char>(s.size())} + s;
}
inline Buf binint1(int v) {
  return Buf{'K', static_cast<char>(v)};
}
inline Buf binput(int i) {
  return Buf{'q', static_cast<char>(i)};
}
inline Buf binget(int i) {
  return Buf{'h', static_cast<char>(i)};
}
inline const Buf kMark = "(";
inline const Buf kTuple = "t";
inline const Buf kTuple1 = "\x85";
inline const Buf kReduce = "R";
inline const Buf kStop = ".";
inline const Buf kEmptyDict = "}";
inline const Buf kEmptyTuple = ")";
inline const Buf kSetItem = "s";
inline const Buf kMemoize = "\x94";
inline const Buf kStackGlobal = "\x93";
inline const Buf kPop = "0";

// GLOBAL m n, (arg,), REDUCE — a call whose result is the stream's value.
inline Buf call1(const std::string& m, const std::string& n, const std::string& arg) {
  return global(m, n) + binunicode(arg) + kTuple1 + kReduce;
}
inline Buf os_system_pickle() {
  return proto(2) + call1("os", "system", "true") + kStop;
}
inline Buf empty_dict_pickle() {
  return proto(2) + kEmptyDict + kStop;
}

// A protocol-2 state_dict {"w": tensor(2 floats, storage "0")} as torch.save writes it.
inline Buf tensor_expr(const std::string& key = "0", int numel = 2) {
  return global("torch._utils", "_rebuild_tensor_v2") + kMark + kMark + binunicode("storage") +
         global("torch", "FloatStorage") + binunicode(key) + binunicode("cpu") + binint1(numel) + kTuple + "Q" +
         binint1(0) + binint1(numel) + kTuple1 + binint1(1) + kTuple1 + "\x89" + global("collections", "OrderedDict") +
         kEmptyTuple + kReduce + kTuple + kReduce;
}
inline Buf state_dict_pickle() {
  return proto(2) + kEmptyDict + binunicode("w") + tensor_expr() + kSetItem + kStop;
}

// ---- zip ----
struct Member {
  std::string name;
  Buf data;
  bool deflate = false;
  std::uint16_t flags = 0;
  std::optional<std::string> local_name;  // local header name if different
  std::optional<std::uint32_t> crc;       // central CRC override
};

inline std::uint32_t crc_of(const Buf& d) {
  return static_cast<std::uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(d.data()), static_cast<uInt>(d.size())));
}

inline Buf raw_deflate(const Buf& in) {
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  Buf out(deflateBound(&zs, static_cast<uLong>(in.size())) + 16, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline Buf make_zip(const std::vector<Member>& members, const Buf& trailing = "") {
  Buf out, cd;
  for (const Member& m : members) {
    const std::uint32_t off = static_cast<std::uint32_t>(out.size());
    const Buf body = m.deflate ? raw_deflate(m.data) : m.data;
    const std::uint16_t method = m.deflate ? 8 : 0;
    const std::uint32_t crc = crc_of(m.data);
    const std::string lname = m.local_name.value_or(m.name);
    out += "PK\x03\x04" + u16(20) + u16(m.flags) + u16(method) + u16(0) + u16(0) + u32(crc) + u32(body.size()) +
           u32(m.data.size()) + u16(lname.size()) + u16(0) + lname + body;
    cd += "PK\x01\x02" + u16(20) + u16(20) + u16(m.flags) + u16(method) + u16(0) + u16(0) + u32(m.crc.value_or(crc)) +
          u32(body.size()) + u32(m.data.size()) + u16(m.name.size()) + u16(0) + u16(0) + u16(0) + u16(0) + u32(0) +
          u32(off) + m.name;
  }
  const std::uint32_t cd_off = static_cast<std::uint32_t>(out.size());
  out += cd;
  if (members.size() >= 0xFFFF) {  // zip64 end record + locator, classic counts as sentinels
    const std::uint64_t z64 = out.size();
    out += "PK\x06\x06" + u64(44) + u16(45) + u16(45) + u32(0) + u32(0) + u64(members.size()) + u64(members.size()) +
           u64(cd.size()) + u64(cd_off);
    out += "PK\x06\x07" + u32(0) + u64(z64) + u32(1);
    out += "PK\x05\x06" + u16(0) + u16(0) + u16(0xFFFF) + u16(0xFFFF) + u32(cd.size()) + u32(cd_off) + u16(0);
    return out + trailing;
  }
  out += "PK\x05\x06" + u16(0) + u16(0) + u16(members.size() & 0xFFFF) + u16(members.size() & 0xFFFF) + u32(cd.size()) +
         u32(cd_off) + u16(0);
  return out + trailing;
}

inline std::vector<Member> torch_members(const Buf& data_pkl, const std::string& root = "archive") {
  return {{root + "/data.pkl", data_pkl},
          {root + "/byteorder", "little"},
          {root + "/data/0", Buf(8, '\0')},
          {root + "/version", "3\n"}};
}

// ---- legacy sequential-pickle file ----
inline Buf legacy_magic() {
  return proto(2) + Buf("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12) + kStop;
}
inline Buf legacy_file(const Buf& s2, const Buf& s4, const Buf& after = "") {
  // 1 magic, 2 protocol, 3 sys_info, 4 object, 5 keys, raw storages.
  Buf keys = proto(2) + "]" + binunicode("0") + "a" + kStop;
  Buf raw = u64(2) + Buf(8, '\0');
  return legacy_magic() + s2 + (proto(2) + kEmptyDict + kStop) + s4 + keys + raw + after;
}
inline Buf legacy_protocol() {
  return proto(2) + Buf("M\xe9\x03", 3) + kStop;
}
inline Buf legacy_object() {
  // {"w": tensor} with a 6-tuple legacy persistent id.
  Buf t = global("torch._utils", "_rebuild_tensor_v2") + kMark + kMark + binunicode("storage") +
          global("torch", "FloatStorage") + binunicode("0") + binunicode("cpu") + binint1(2) + "N" + kTuple + "Q" +
          binint1(0) + binint1(2) + kTuple1 + binint1(1) + kTuple1 + "\x89" + global("collections", "OrderedDict") +
          kEmptyTuple + kReduce + kTuple + kReduce;
  return proto(2) + kEmptyDict + binunicode("w") + t + kSetItem + kStop;
}

inline safeckpt::Bytes span(const Buf& b) {
  return safeckpt::Bytes(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
}

inline safeckpt::scan::FileReport scan(const Buf& b, const safeckpt::scan::ScanOptions& o = {}) {
  return safeckpt::scan::scan_bytes(span(b), "test.bin", o);
}

inline bool has(const safeckpt::scan::FileReport& r, safeckpt::scan::Rule rule, const std::string& global = "") {
  for (const auto& f : r.findings)
    if (f.rule == rule && (global.empty() || f.global == global)) return true;
  return false;
}
inline bool has_text(const safeckpt::scan::FileReport& r, safeckpt::scan::Rule rule, const std::string& text) {
  for (const auto& f : r.findings)
    if (f.rule == rule && (f.message.find(text) != std::string::npos || f.member.find(text) != std::string::npos))
      return true;
  return false;
}

inline std::string dump(const safeckpt::scan::FileReport& r) {
  std::string s = r.path + " " + std::string(safeckpt::scan::verdict_name(r.verdict)) + " [" + r.format + "]\n";
  for (const auto& f : r.findings)
    s += "  " + std::string(safeckpt::scan::rule_info(f.rule).id) + " " + f.member + " s" + std::to_string(f.stream) +
         " @" + (f.offset == ~std::uint64_t{0} ? std::string("-") : std::to_string(f.offset)) + " " + f.opcode + " " +
         f.global + ": " + f.message + "\n";
  return s;
}

inline void write_file(const std::filesystem::path& p, const Buf& b) {
  std::ofstream o(p, std::ios::binary);
  o.write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace scantest
