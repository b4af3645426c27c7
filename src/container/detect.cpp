// src/container/detect.cpp — file format by content (include/safeckpt/detect.hpp).
//
// sniff_format checks, in this order (first match wins):
//  1. empty file                                  -> kEmpty
//  2. `PK\3\4` at 0 (torch's _is_zipfile)          -> kTorchZip (unclassified zip)
//  3. "PYTORCH1" at 0 (inline_container.cc)        -> kPreviewPytorch1
//  4. a tar header that Python's tarfile accepts: "ustar" at 257, or any
//     first 512-byte block (not all zeros) whose checksum field matches the
//     block's sum as tarfile.TarInfo.frombuf checks it (old V7 tars carry no
//     magic). torch.load tries tarfile.open before the legacy pickle
//     (serialization.py _legacy_load), so such a file is read as a tar
//     whatever else it is; a V7 header hidden in a legacy pickle's string
//     made a file scan as a clean pickle while torch.load ran the tar's
//     `storages` pickle (review 2026-12-06)       -> kLegacyTar
//  5. u64le N, 2 <= N <= max(size - 8, 100,000,000), byte 8 == '{'
//     (a header cut short is still safetensors: malformed, not unknown)
//                                                  -> kSafetensors
//  6. "\x93NUMPY"                                  -> kNumpyNpy
//  7. gzip 1F 8B, bzip2 "BZh", xz FD 37 7A 58 5A 00, zstd 28 B5 2F FD,
//     7z 37 7A BC AF 27 1C, rar "Rar!\x1a\x07"     -> kGzip ... kRar
//     (before 8-9: '(' and 'R' are also pickle opcodes)
//  8. the legacy magic number pickle 0x1950A86A20F9469CFC6C in any protocol
//     (torch/serialization.py _legacy_load; see legacy_magic_length) -> kLegacyPickle
//  9. first byte PROTO (0x80) or a protocol 0/1 opcode that can start a
//     pickle (kPickleFirstOpcodes)               -> kBarePickle
//     (lenient on purpose: torch.load(weights_only=False) would unpickle it;
//     CVE-2025-10155 hides a raw pickle behind a checkpoint extension)
// 10. JSON whitespace, then '{', and "weight_map" somewhere in the text
//     (a sharded checkpoint's *.safetensors.index.json; '{' and whitespace
//     start no pickle, so this cannot shadow 8-9) -> kSafetensorsIndex
// 11. anything else                               -> kUnknown
#include "safeckpt/detect.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "util/bytes.hpp"

namespace safeckpt {
namespace {

bool starts_with(Bytes f, std::string_view magic, std::size_t at = 0) noexcept {
  return at <= f.size() && magic.size() <= f.size() - at && std::memcmp(f.data() + at, magic.data(), magic.size()) == 0;
}

// The ten little-endian bytes of 0x1950A86A20F9469CFC6C (LONG1 payload).
constexpr std::string_view kMagicLong1 = "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
// Protocol 0/1 pickle the same number as text: LONG "<decimal>L\n".
constexpr std::string_view kMagicText = "L119547037146038801333356L\n";

// True when `f` starts with the legacy magic-number pickle:
//   protocol 0/1: LONG "119547037146038801333356L\n"
//   protocol 2/3: PROTO n, LONG1 10 <magic>
//   protocol 4/5: PROTO n, FRAME <u64>, LONG1 10 <magic>  (pickle frames it)
bool is_legacy_magic(Bytes f) noexcept {
  if (starts_with(f, kMagicText)) return true;
  if (f.size() < 2 || f[0] != 0x80) return false;
  if (starts_with(f, kMagicLong1, 2)) return true;
  return f.size() > 11 && f[2] == 0x95 && starts_with(f, kMagicLong1, 11);
}

// Protocol 0/1 opcodes (CPython Lib/pickle.py) that can be the first opcode
// of a pickle: those that push onto an empty stack without a memo. The rest
// (t, d, l, s, a, R, g, '.', ...) need a stack item, a MARK or a memo entry,
// so a file starting with them fails at its first byte in any unpickler.
constexpr std::string_view kPickleFirstOpcodes = "(NIJKMLFGSTUVXPc]})";

// The largest header safetensors accepts (safetensors/src/tensor.rs
// MAX_HEADER_SIZE; SafetensorsOptions::max_header_bytes defaults to it).
constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

// safetensors: u64le header length N, then N bytes of JSON starting with '{'.
// N larger than the file but within the format's header limit is still
// safetensors, cut short (a truncated download): the reader then says
// malformed instead of "unknown" (fail closed).
bool is_safetensors(Bytes f) noexcept {
  if (f.size() < 9) return false;
  const std::uint64_t n = util::load_le<std::uint64_t>(f.data());
  return n >= 2 && (n <= f.size() - 8 || n <= kMaxSafetensorsHeader) && f[8] == '{';
}

// huggingface_hub / transformers sharded index: {"metadata": ..., "weight_map": {...}}.
bool is_safetensors_index(Bytes f) noexcept {
  std::size_t i = 0;
  while (i < f.size() && (f[i] == ' ' || f[i] == '\t' || f[i] == '\n' || f[i] == '\r')) ++i;
  if (i == f.size() || f[i] != '{') return false;
  const std::string_view text(reinterpret_cast<const char*>(f.data()), f.size());
  return text.find("\"weight_map\"", i) != std::string_view::npos;
}

}  // namespace

std::string_view file_format_name(FileFormat f) noexcept {
  switch (f) {
    case FileFormat::kTorchZip: return "torch_zip";
    case FileFormat::kTorchScriptZip: return "torchscript_zip";
    case FileFormat::kPt2Archive: return "pt2_archive";
    case FileFormat::kOtherZip: return "other_zip";
    case FileFormat::kLegacyPickle: return "legacy_pickle";
    case FileFormat::kLegacyTar: return "legacy_tar";
    case FileFormat::kBarePickle: return "bare_pickle";
    case FileFormat::kSafetensors: return "safetensors";
    case FileFormat::kSafetensorsIndex: return "safetensors_index";
    case FileFormat::kNumpyNpy: return "numpy_npy";
    case FileFormat::kPreviewPytorch1: return "preview_pytorch1";
    case FileFormat::kGzip: return "gzip";
    case FileFormat::kBzip2: return "bzip2";
    case FileFormat::kXz: return "xz";
    case FileFormat::kZstd: return "zstd";
    case FileFormat::k7z: return "7z";
    case FileFormat::kRar: return "rar";
    case FileFormat::kEmpty: return "empty";
    case FileFormat::kUnknown: return "unknown";
  }
  return "unknown";
}

namespace {

// tarfile.nti() of the checksum field, leniently (a superset of what
// Python's int(text, 8) accepts: a file that would pass is never missed).
// nullopt: tarfile raises InvalidHeaderError on it.
std::optional<std::int64_t> tar_number(Bytes field) {
  if (field[0] == 0x80 || field[0] == 0xff) {  // base-256
    std::int64_t n = 0;
    for (std::size_t i = 1; i < field.size(); ++i)
      n = static_cast<std::int64_t>(static_cast<std::uint64_t>(n) << 8) | field[i];
    if (field[0] == 0xff) n -= std::int64_t{1} << (8 * (field.size() - 1));
    return n;
  }
  std::size_t end = 0;
  while (end < field.size() && field[end] != 0) ++end;  // nts(): up to the first NUL
  auto space = [](std::uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); };
  std::size_t b = 0;
  while (b < end && space(field[b])) ++b;
  while (end > b && space(field[end - 1])) --end;
  bool negative = false;
  if (b < end && (field[b] == '+' || field[b] == '-')) negative = field[b++] == '-';
  if (end - b >= 2 && field[b] == '0' && (field[b + 1] == 'o' || field[b + 1] == 'O')) b += 2;
  std::int64_t n = 0;
  for (std::size_t i = b; i < end; ++i) {
    if (field[i] == '_') continue;
    if (field[i] < '0' || field[i] > '7') return std::nullopt;
    n = n * 8 + (field[i] - '0');
  }
  return negative ? -n : n;
}

// tarfile.TarInfo.frombuf's acceptance of the first block (BLOCKSIZE 512).
bool is_tar_block(Bytes f) {
  if (f.size() < 512) return false;
  const Bytes h = f.first(512);
  if (std::all_of(h.begin(), h.end(), [](std::uint8_t c) { return c == 0; })) return false;  // EOFHeaderError
  const auto chksum = tar_number(h.subspan(148, 8));
  if (!chksum) return false;
  // calc_chksums: 256 (the field as 8 spaces) + every other byte, unsigned and signed.
  std::int64_t unsigned_sum = 256, signed_sum = 256;
  for (std::size_t i = 0; i < 512; ++i) {
    if (i >= 148 && i < 156) continue;
    unsigned_sum += h[i];
    signed_sum += static_cast<std::int8_t>(h[i]);
  }
  return *chksum == unsigned_sum || *chksum == signed_sum;
}

}  // namespace

FileFormat sniff_format(Bytes f) noexcept {
  using namespace std::string_view_literals;
  if (f.empty()) return FileFormat::kEmpty;
  if (starts_with(f, "PK\x03\x04"sv)) return FileFormat::kTorchZip;
  if (starts_with(f, "PYTORCH1"sv)) return FileFormat::kPreviewPytorch1;
  if (starts_with(f, "ustar"sv, 257) || is_tar_block(f)) return FileFormat::kLegacyTar;
  if (is_safetensors(f)) return FileFormat::kSafetensors;
  if (starts_with(f, "\x93NUMPY"sv)) return FileFormat::kNumpyNpy;
  if (starts_with(f, "\x1f\x8b"sv)) return FileFormat::kGzip;
  if (starts_with(f, "BZh"sv)) return FileFormat::kBzip2;
  if (starts_with(f, "\xfd\x37\x7a\x58\x5a\x00"sv)) return FileFormat::kXz;
  if (starts_with(f, "\x28\xb5\x2f\xfd"sv)) return FileFormat::kZstd;
  if (starts_with(f, "\x37\x7a\xbc\xaf\x27\x1c"sv)) return FileFormat::k7z;
  if (starts_with(f, "Rar!\x1a\x07"sv)) return FileFormat::kRar;
  if (is_legacy_magic(f)) return FileFormat::kLegacyPickle;
  if (f[0] == 0x80 || kPickleFirstOpcodes.find(static_cast<char>(f[0])) != std::string_view::npos) {
    return FileFormat::kBarePickle;
  }
  if (is_safetensors_index(f)) return FileFormat::kSafetensorsIndex;
  return FileFormat::kUnknown;
}

// PT2 layout (torch/export/pt2_archive/constants.py, docs "PT2 Archive
// Spec"): `<root>/archive_format` holds "pt2"; AOTInductor packages keep
// compiled code under `<root>/data/aotinductor/` (.so, .cubin,
// .wrapper.so ...). Any of these marks executable content. Checked after
// constants.pkl (TorchScript, what torch.load itself tests) and before
// data.pkl.
FileFormat classify_zip(const ZipArchive& zip) noexcept {
  if (zip.root().empty()) return FileFormat::kOtherZip;  // kNoRootFolder: not a PyTorch archive
  if (zip.find("constants.pkl") != nullptr) return FileFormat::kTorchScriptZip;
  if (zip.find("archive_format") != nullptr) return FileFormat::kPt2Archive;
  const std::string aoti_dir = zip.root() + "/data/aotinductor/";
  for (const ZipEntry& e : zip.entries()) {
    const std::string_view n = e.name;
    if (n.ends_with(".so") || n.ends_with(".cubin") || n.starts_with(aoti_dir)) return FileFormat::kPt2Archive;
  }
  if (zip.find("data.pkl") != nullptr) return FileFormat::kTorchZip;
  return FileFormat::kOtherZip;
}

// A zip that does not open (structural damage) is kUnknown: it is neither a
// checkpoint PyTorch reads nor something we can classify; callers that need
// the reason call ZipArchive::open themselves.
FileFormat detect_format(Bytes file, const Limits& limits) {
  const FileFormat f = sniff_format(file);
  if (f != FileFormat::kTorchZip) return f;
  auto zip = ZipArchive::open(file, limits);
  if (!zip || zip->root().empty()) return FileFormat::kUnknown;  // no root folder: PyTorch cannot open it
  return classify_zip(*zip);
}

}  // namespace safeckpt
