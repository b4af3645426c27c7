// numpy .npy and safetensors (see scan.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "catalogue.hpp"
#include "pickle_scan.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/zip.hpp"
#include "scanner.hpp"
#include "util/bytes.hpp"

namespace safeckpt::scan {

// ---- numpy -------------------------------------------------------------------

void Scanner::scan_npy(Bytes data, const std::string& member, int depth) {
  // numpy/lib/format.py: magic, major, minor, header_len (u16 v1, u32 v2/3), header text.
  if (data.size() < 10) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header truncated", kIncompleteWhy, 0);
    return;
  }
  const int major = data[6];
  std::uint64_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = util::load_le<std::uint16_t>(data.data() + 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) {
      add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header truncated", kIncompleteWhy, 0);
      return;
    }
    hlen = util::load_le<std::uint32_t>(data.data() + 8);
    start = 12;
  } else {
    add(Rule::kUnsupported, Severity::kMedium, member, "numpy .npy format version " + std::to_string(major),
        kIncompleteWhy, 6);
    return;
  }
  if (hlen > data.size() - start) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header longer than the file", kIncompleteWhy, 8);
    return;
  }
  std::string header(reinterpret_cast<const char*>(data.data() + start), static_cast<std::size_t>(hlen));
  const std::uint64_t body = start + hlen;
  // The descr value: a quoted type string or a list of fields. Any field
  // type with kind 'O' makes numpy pickle the array.
  auto dpos = header.find("'descr'");
  if (dpos == std::string::npos) dpos = header.find("\"descr\"");
  if (dpos == std::string::npos) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header has no 'descr'", kIncompleteWhy, start);
    return;
  }
  auto fpos = header.find("'fortran_order'", dpos);
  auto spos = header.find("'shape'", dpos);
  std::size_t dend =
      std::min(fpos == std::string::npos ? header.size() : fpos, spos == std::string::npos ? header.size() : spos);
  std::string descr = header.substr(dpos + 7, dend - (dpos + 7));
  bool object = false;
  for (std::size_t i = 0; i < descr.size(); ++i) {
    char q = descr[i];
    if (q != '\'' && q != '"') continue;
    std::size_t j = descr.find(q, i + 1);
    if (j == std::string::npos) break;
    std::string tok = descr.substr(i + 1, j - i - 1);
    std::string_view t = tok;
    if (!t.empty() && (t[0] == '<' || t[0] == '>' || t[0] == '|' || t[0] == '=')) t.remove_prefix(1);
    if (!t.empty() && t[0] == 'O' && std::all_of(t.begin() + 1, t.end(), [](char c) { return c >= '0' && c <= '9'; }))
      object = true;
    i = j;
  }
  if (!object) return;  // plain numeric data: nothing to run
  add(Rule::kNumpyObject, Severity::kMedium, member,
      "numpy object array: its data is a pickle (numpy.load(allow_pickle=True) runs it)",
      "numpy refuses it by default (allow_pickle=False); its pickle is scanned below", body);
  if (body >= data.size()) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy object array without data", kIncompleteWhy, body);
    return;
  }
  scan_streams(data, member, depth, body, 0, true);
}

// ---- safetensors ---------------------------------------------------------------

// The library's own safetensors reader (include/safeckpt/safetensors_reader.hpp:
// header cap, UTF-8, duplicate keys, known dtypes, overflow-checked sizes,
// tensors tiling the data section exactly) — the parser the loader uses.
void Scanner::scan_safetensors(Bytes data, const std::string& member) {
  SafetensorsOptions so;
  so.limits = opt_.limits;
  auto r = SafetensorsFile::parse(data, so);
  if (r) return;
  const Error& e = r.error();
  Finding f;
  f.rule = e.code() == ErrorCode::kLimitExceeded ? Rule::kLimit : Rule::kSafetensors;
  f.severity = Severity::kMedium;
  f.member = member;
  f.offset = e.where().offset;
  f.message = "safetensors: " + std::string(error_code_name(e.code())) + ": " + e.message();
  f.why =
      "safetensors readers disagree on invalid files (duplicate keys, overlaps and gaps can hide data); the "
      "file is not clean";
  sink_.add(std::move(f));
}

}  // namespace safeckpt::scan
