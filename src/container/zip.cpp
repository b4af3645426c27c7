// src/container/zip.cpp — the PyTorch zip container, read the way PyTorch's
// reader (caffe2/serialize/inline_container.cc on top of miniz) reads it.
//
// The accepted grammar is stated at the top of include/safeckpt/zip.hpp; this
// file implements exactly that list. Field offsets follow PKWARE APPNOTE.TXT
// 6.3.x (sections 4.3.7 local header, 4.3.12 central header, 4.3.14 zip64
// EOCD, 4.3.15 zip64 locator, 4.3.16 EOCD, 4.5.3 zip64 extra).
//
// Where miniz (PyTorch) and CPython's zipfile (what most scanners use) read a
// structure differently, the structure is refused or reported, never resolved
// silently in favour of one of them. Each such place says so in a comment.
//
// Arithmetic on file-provided numbers is written `len <= size && off <= size -
// len`, so nothing overflows; nothing is allocated before its count is checked
// against a Limits cap and against the bytes that could hold it.
#include "safeckpt/zip.hpp"

#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <new>
#include <utility>

#include "util/bytes.hpp"
#include "util/crc32.hpp"

namespace safeckpt {
namespace {

// Record signatures, as little-endian u32.
constexpr std::uint32_t kSigLocal = 0x04034b50;       // PK\3\4 local file header
constexpr std::uint32_t kSigCentral = 0x02014b50;     // PK\1\2 central directory header
constexpr std::uint32_t kSigEocd = 0x06054b50;        // PK\5\6 end of central directory
constexpr std::uint32_t kSigEocd64 = 0x06064b50;      // PK\6\6 zip64 end of central directory
constexpr std::uint32_t kSigLocator64 = 0x07064b50;   // PK\6\7 zip64 EOCD locator
constexpr std::uint32_t kSigDescriptor = 0x08074b50;  // PK\7\8 data descriptor (optional)

// Fixed record sizes in bytes (without their variable parts).
constexpr std::uint64_t kLocalHeaderSize = 30;
constexpr std::uint64_t kCentralHeaderSize = 46;
constexpr std::uint64_t kEocdSize = 22;
constexpr std::uint64_t kEocd64Size = 56;  // with "size of record" field == 44
constexpr std::uint64_t kLocator64Size = 20;
constexpr std::uint64_t kMaxCommentSize = 0xFFFF;

// General purpose bit flags (APPNOTE 4.4.4).
constexpr std::uint16_t kFlagEncrypted = 0x0001;
constexpr std::uint16_t kFlagDeflateOptions = 0x0006;  // bits 1-2: compression level hint
constexpr std::uint16_t kFlagDescriptor = 0x0008;
constexpr std::uint16_t kFlagPatched = 0x0020;
constexpr std::uint16_t kFlagStrongEncryption = 0x0040;
constexpr std::uint16_t kFlagUtf8 = 0x0800;

constexpr std::uint16_t kMethodStored = 0;
constexpr std::uint16_t kMethodDeflate = 8;
constexpr std::uint16_t kExtraZip64 = 0x0001;

constexpr std::uint32_t kMax16 = 0xFFFF;
constexpr std::uint32_t kMax32 = 0xFFFFFFFF;

// Deflate cannot expand by more than 1032:1 (zlib FAQ / RFC 1951: a 258-byte
// match costs at least 2 bits). A larger declared ratio is a lie.
constexpr std::uint64_t kMaxDeflateRatio = 1032;

// True when [off, off + len) lies inside a buffer of `size` bytes.
constexpr bool in_bounds(std::uint64_t size, std::uint64_t off, std::uint64_t len) noexcept {
  return off <= size && len <= size - off;
}

// Little-endian readers (src/util/bytes.hpp). Callers check bounds first.
std::uint16_t le16(Bytes b, std::uint64_t off) noexcept {
  return util::load_le<std::uint16_t>(b.data() + off);
}
std::uint32_t le32(Bytes b, std::uint64_t off) noexcept {
  return util::load_le<std::uint32_t>(b.data() + off);
}
std::uint64_t le64(Bytes b, std::uint64_t off) noexcept {
  return util::load_le<std::uint64_t>(b.data() + off);
}

std::string_view as_chars(Bytes b) noexcept {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// A name as it may appear in a message: quoted, control and non-ASCII bytes
// escaped, long names cut (the raw name is in Location::record).
std::string quote_name(std::string_view name) {
  constexpr std::size_t kMaxShown = 200;
  std::string s = "'";
  for (std::size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c >= 0x7f || c == '\'' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    } else {
      s += static_cast<char>(c);
    }
  }
  if (name.size() > kMaxShown) s += "...";
  s += "'";
  return s;
}

Unexpected fail(ErrorCode code, std::string message, std::uint64_t offset, std::string_view record = {}) {
  Location where;
  where.record = std::string(record);
  where.offset = offset;
  return make_error(code, std::move(message), std::move(where));
}

// Where the central directory is, from the (zip64) end of central directory.
struct EndRecord {
  std::uint64_t entries = 0;
  std::uint64_t cd_offset = 0;
  std::uint64_t cd_size = 0;
  // The central directory must end at or before this offset: the zip64 EOCD
  // record when there is one, else the classic EOCD.
  std::uint64_t cd_limit = 0;
};

// Grammar item 2. Finds the EOCD the way miniz does (the last `PK\5\6` with at
// least 22 bytes after it, at most 64 KiB + 22 from the end; CPython's
// zipfile also takes the last one), then the zip64 records.
Result<EndRecord> read_end_record(Bytes f, std::vector<ZipAnomaly>& anomalies) {
  const std::uint64_t size = f.size();
  if (size < kEocdSize) {
    return fail(ErrorCode::kMalformed,
                "file of " + std::to_string(size) + " bytes is too short for an end of central directory record", 0);
  }
  const std::uint64_t lowest = size - kEocdSize > kMaxCommentSize ? size - kEocdSize - kMaxCommentSize : 0;
  std::uint64_t eocd = size - kEocdSize;
  for (;;) {
    if (le32(f, eocd) == kSigEocd) break;
    if (eocd == lowest) {
      return fail(
          ErrorCode::kMalformed,
          "no end of central directory record (PK\\5\\6) in the last " + std::to_string(size - lowest) + " bytes",
          lowest);
    }
    --eocd;
  }

  const std::uint32_t disk = le16(f, eocd + 4);
  const std::uint32_t cd_disk = le16(f, eocd + 6);
  const std::uint64_t entries_disk16 = le16(f, eocd + 8);
  const std::uint64_t entries16 = le16(f, eocd + 10);
  const std::uint64_t cd_size32 = le32(f, eocd + 12);
  const std::uint64_t cd_offset32 = le32(f, eocd + 16);
  const std::uint64_t comment_len = le16(f, eocd + 20);
  const std::uint64_t comment_at = eocd + kEocdSize;
  if (comment_len > size - comment_at) {
    return fail(ErrorCode::kMalformed,
                "end of central directory comment of " + std::to_string(comment_len) +
                    " bytes runs past the end of the file (" + std::to_string(size - comment_at) + " bytes left)",
                eocd);
  }
  if (comment_at + comment_len < size) {
    // miniz and CPython both ignore these bytes: a place to hide a payload.
    anomalies.push_back({ZipAnomalyKind::kTrailingData, "", comment_at + comment_len,
                         std::to_string(size - comment_at - comment_len) +
                             " bytes after the end of central directory record and its comment"});
  }

  EndRecord end;
  end.entries = entries16;
  end.cd_size = cd_size32;
  end.cd_offset = cd_offset32;
  end.cd_limit = eocd;

  const bool has_locator = eocd >= kLocator64Size && le32(f, eocd - kLocator64Size) == kSigLocator64;
  if (!has_locator) {
    if (disk != 0 || cd_disk != 0 || entries_disk16 != entries16) {
      return fail(ErrorCode::kUnsupported,
                  "multi-disk archive (disk " + std::to_string(disk) + ", central directory on disk " +
                      std::to_string(cd_disk) + ", " + std::to_string(entries_disk16) + " of " +
                      std::to_string(entries16) + " entries on this disk)",
                  eocd);
    }
    return end;
  }

  // zip64. PyTorch always writes these records (MZ_ZIP_FLAG_WRITE_ZIP64), and
  // miniz and CPython both let them override the classic fields.
  const std::uint64_t locator = eocd - kLocator64Size;
  const std::uint32_t eocd64_disk = le32(f, locator + 4);
  const std::uint64_t eocd64 = le64(f, locator + 8);
  const std::uint32_t total_disks = le32(f, locator + 16);
  if (eocd64_disk != 0 || total_disks != 1) {
    return fail(ErrorCode::kUnsupported,
                "multi-disk zip64 archive (zip64 end record on disk " + std::to_string(eocd64_disk) + ", " +
                    std::to_string(total_disks) + " disks)",
                locator);
  }
  // miniz seeks to the locator's offset; CPython's zipfile reads the 56 bytes
  // right before the locator. Require both to be the same record (which also
  // rules out "zip64 extensible data", written by no PyTorch-relevant writer).
  if (locator < kEocd64Size || eocd64 != locator - kEocd64Size) {
    return fail(ErrorCode::kMalformed,
                "zip64 end of central directory locator points at offset " + std::to_string(eocd64) +
                    ", not at the 56-byte record right before it (offset " +
                    std::to_string(locator >= kEocd64Size ? locator - kEocd64Size : 0) + ")",
                locator);
  }
  if (le32(f, eocd64) != kSigEocd64) {
    return fail(ErrorCode::kMalformed, "bad zip64 end of central directory signature", eocd64);
  }
  const std::uint64_t record_size = le64(f, eocd64 + 4);
  if (record_size != kEocd64Size - 12) {
    return fail(ErrorCode::kUnsupported,
                "zip64 end of central directory record of " + std::to_string(record_size) +
                    " bytes (zip64 extensible data is not supported; expected 44)",
                eocd64);
  }
  const std::uint32_t disk64 = le32(f, eocd64 + 16);
  const std::uint32_t cd_disk64 = le32(f, eocd64 + 20);
  const std::uint64_t entries_disk64 = le64(f, eocd64 + 24);
  const std::uint64_t entries64 = le64(f, eocd64 + 32);
  const std::uint64_t cd_size64 = le64(f, eocd64 + 40);
  const std::uint64_t cd_offset64 = le64(f, eocd64 + 48);
  if (disk64 != 0 || cd_disk64 != 0 || entries_disk64 != entries64) {
    return fail(ErrorCode::kUnsupported,
                "multi-disk zip64 archive (disk " + std::to_string(disk64) + ", central directory on disk " +
                    std::to_string(cd_disk64) + ", " + std::to_string(entries_disk64) + " of " +
                    std::to_string(entries64) + " entries on this disk)",
                eocd64);
  }
  // A classic field must either be its "see zip64" sentinel or agree with the
  // zip64 value: a tool that ignores zip64 would otherwise see another archive.
  auto agree = [&](std::uint64_t classic, std::uint64_t sentinel, std::uint64_t z64, const char* what) -> Status {
    if (classic == sentinel || classic == z64) return {};
    return fail(ErrorCode::kMalformed,
                std::string("classic end of central directory record gives ") + what + " " + std::to_string(classic) +
                    " but the zip64 record gives " + std::to_string(z64),
                eocd);
  };
  SAFECKPT_CHECK(agree(disk, kMax16, disk64, "disk number"));
  SAFECKPT_CHECK(agree(cd_disk, kMax16, cd_disk64, "central directory disk"));
  SAFECKPT_CHECK(agree(entries_disk16, kMax16, entries_disk64, "entries on this disk"));
  SAFECKPT_CHECK(agree(entries16, kMax16, entries64, "entry count"));
  SAFECKPT_CHECK(agree(cd_size32, kMax32, cd_size64, "central directory size"));
  SAFECKPT_CHECK(agree(cd_offset32, kMax32, cd_offset64, "central directory offset"));
  end.entries = entries64;
  end.cd_size = cd_size64;
  end.cd_offset = cd_offset64;
  end.cd_limit = eocd64;
  return end;
}

// Walks the extra field of a central header. Every block must be framed
// correctly (CPython's zipfile refuses a bad frame; miniz reads extras only
// for zip64 entries). A second zip64 block is refused: miniz uses the first,
// CPython the last. When `want_*` is set, the zip64 block must carry that
// 64-bit value, in the order usize, csize, local header offset (APPNOTE 4.5.3).
Status read_central_extra(Bytes extra, bool want_usize, bool want_csize, bool want_offset, std::uint64_t& usize,
                          std::uint64_t& csize, std::uint64_t& offset, std::string_view name, std::uint64_t extra_at) {
  const bool want_any = want_usize || want_csize || want_offset;
  bool seen_zip64 = false;
  std::uint64_t pos = 0;
  while (pos < extra.size()) {
    if (extra.size() - pos < 4) {
      return fail(ErrorCode::kMalformed, "central extra field of " + quote_name(name) + " ends inside a block header",
                  extra_at + pos, name);
    }
    const std::uint16_t id = le16(extra, pos);
    const std::uint64_t len = le16(extra, pos + 2);
    if (len > extra.size() - pos - 4) {
      return fail(ErrorCode::kMalformed,
                  "central extra block 0x" + hex32(id).substr(6) + " of " + quote_name(name) + " declares " +
                      std::to_string(len) + " bytes but only " + std::to_string(extra.size() - pos - 4) + " remain",
                  extra_at + pos, name);
    }
    if (id == kExtraZip64) {
      if (seen_zip64) {
        return fail(ErrorCode::kMalformed, "two zip64 extra blocks in the central header of " + quote_name(name),
                    extra_at + pos, name);
      }
      seen_zip64 = true;
      const Bytes body = extra.subspan(pos + 4, len);
      std::uint64_t at = 0;
      auto take = [&](bool want, std::uint64_t& out, const char* what) -> Status {
        if (!want) return {};
        if (body.size() - at < 8) {
          return fail(ErrorCode::kMalformed,
                      "zip64 extra block of " + quote_name(name) + " is " + std::to_string(body.size()) +
                          " bytes, too short for the 64-bit " + what,
                      extra_at + pos, name);
        }
        out = le64(body, at);
        at += 8;
        return {};
      };
      SAFECKPT_CHECK(take(want_usize, usize, "uncompressed size"));
      SAFECKPT_CHECK(take(want_csize, csize, "compressed size"));
      SAFECKPT_CHECK(take(want_offset, offset, "local header offset"));
    }
    pos += 4 + len;
  }
  if (want_any && !seen_zip64) {
    return fail(ErrorCode::kMalformed,
                "central header of " + quote_name(name) + " has a 0xFFFFFFFF size or offset but no zip64 extra block",
                extra_at, name);
  }
  return {};
}

std::string flag_names(std::uint16_t bits) {
  std::string s;
  auto add = [&](std::uint16_t bit, const char* what) {
    if (!(bits & bit)) return;
    if (!s.empty()) s += ", ";
    s += what;
    bits = static_cast<std::uint16_t>(bits & ~bit);
  };
  add(kFlagEncrypted, "0x0001 encrypted");
  add(kFlagPatched, "0x0020 compressed patched data");
  add(kFlagStrongEncryption, "0x0040 strong encryption");
  if (bits) {
    if (!s.empty()) s += ", ";
    s += "unknown " + hex32(bits).replace(2, 4, "");
  }
  return s;
}

// Length of the data descriptor at `at` for an entry with flag bit 3, or 0 if
// the bytes there are not a descriptor matching the central directory.
// Forms (APPNOTE 4.3.9): optional PK\7\8, crc32, then 32-bit or (zip64)
// 64-bit sizes: 12, 16, 20 or 24 bytes. PyTorch writes 16 or 24.
std::uint64_t descriptor_length(Bytes f, std::uint64_t at, std::uint64_t limit, const ZipEntry& e) noexcept {
  if (at > limit) return 0;
  const std::uint64_t avail = limit - at;
  std::uint64_t sig = (avail >= 4 && le32(f, at) == kSigDescriptor) ? 4 : 0;
  for (std::uint64_t body : {sig + 12, sig + 20}) {
    if (body > avail) break;
    const std::uint64_t p = at + sig;
    if (le32(f, p) != e.crc32) continue;
    const bool wide = body == sig + 20;
    const std::uint64_t cs = wide ? le64(f, p + 4) : le32(f, p + 4);
    const std::uint64_t us = wide ? le64(f, p + 12) : le32(f, p + 8);
    if (cs == e.compressed_size && us == e.uncompressed_size) return body;
  }
  return 0;
}

class Inflater {
 public:
  Inflater() = default;
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() {
    if (live_) inflateEnd(&zs_);
  }
  bool init() noexcept {
    live_ = inflateInit2(&zs_, -MAX_WBITS) == Z_OK;
    return live_;
  }
  z_stream& stream() noexcept { return zs_; }

 private:
  z_stream zs_{};
  bool live_ = false;
};

// The CRC-32 check read() makes with verify_crc (a stored CRC of 0 is none).
Status verify_crc32(const ZipEntry& e, Bytes bytes) {
  if (e.crc32 == 0) return {};
  const std::uint32_t actual = crc32_update(0, bytes);
  if (actual == e.crc32) return {};
  return fail(ErrorCode::kMalformed,
              "CRC-32 mismatch in record " + quote_name(e.name) + ": central directory says " + hex32(e.crc32) +
                  ", data has " + hex32(actual),
              e.data_offset, e.name);
}

// Inflates a raw deflate record into an owned buffer of exactly
// e.uncompressed_size bytes. The buffer grows with the real output (doubling),
// so a lying uncompressed_size cannot make us allocate more than the stream
// produces (plus a factor of 2).
// The declared size is checked against `cap` (named `cap_name` in the error)
// before anything is allocated or inflated, and the output never grows past
// the declared size, so a lying header stops there: the work done is
// proportional to min(cap, declared size) whatever the stream would expand to.
Result<RecordBytes> inflate_record(Bytes in, const ZipEntry& e, std::uint64_t cap, std::string_view cap_name) {
  const std::uint64_t usize = e.uncompressed_size;
  if (usize > cap) {
    return fail(ErrorCode::kLimitExceeded,
                "record " + quote_name(e.name) + " inflates to " + std::to_string(usize) + " bytes, above limits." +
                    std::string(cap_name) + " = " + std::to_string(cap),
                e.data_offset, e.name);
  }
  if (usize / kMaxDeflateRatio > in.size() + 1) {
    return fail(ErrorCode::kMalformed,
                "record " + quote_name(e.name) + " declares " + std::to_string(usize) + " bytes from " +
                    std::to_string(in.size()) + " deflated bytes, beyond deflate's 1032:1 maximum",
                e.data_offset, e.name);
  }
  if (usize > SIZE_MAX) {
    return fail(ErrorCode::kLimitExceeded, "record " + quote_name(e.name) + " does not fit in memory", e.data_offset,
                e.name);
  }
  auto out = std::make_shared<std::vector<std::uint8_t>>();
  constexpr std::uint64_t kFirstChunk = 64u << 10;
  auto grow = [&](std::uint64_t want) -> Status {
    try {
      out->resize(static_cast<std::size_t>(want));
    } catch (const std::bad_alloc&) {
      return fail(ErrorCode::kLimitExceeded,
                  "out of memory inflating record " + quote_name(e.name) + " to " + std::to_string(want) + " bytes",
                  e.data_offset, e.name);
    }
    return {};
  };
  SAFECKPT_CHECK(grow(std::min(usize, std::max(kFirstChunk, std::min(usize, in.size() * 2)))));

  Inflater inf;
  if (!inf.init()) {
    return fail(ErrorCode::kLimitExceeded, "zlib inflateInit2 failed (out of memory)", e.data_offset, e.name);
  }
  z_stream& zs = inf.stream();
  constexpr std::uint64_t kMaxChunk = UINT_MAX >> 1;  // zlib counts in uInt
  std::uint64_t in_pos = 0;
  std::uint64_t out_pos = 0;
  std::uint8_t scratch[64];
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      const std::uint64_t n = std::min<std::uint64_t>(in.size() - in_pos, kMaxChunk);
      zs.next_in = const_cast<Bytef*>(in.data() + in_pos);  // zlib does not write input
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    if (out_pos == out->size() && out->size() < usize) {
      SAFECKPT_CHECK(grow(std::min(usize, out->size() * 2)));
    }
    // With the buffer full at the declared size, keep inflating into a
    // scratch buffer: any further output means the declared size is wrong.
    const bool full = out_pos == out->size();
    const std::uint64_t room = full ? sizeof scratch : std::min<std::uint64_t>(out->size() - out_pos, kMaxChunk);
    zs.next_out = full ? scratch : out->data() + out_pos;
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    const std::uint64_t produced = room - zs.avail_out;
    if (full && produced > 0) {
      return fail(
          ErrorCode::kMalformed,
          "record " + quote_name(e.name) + " inflates to more than its declared " + std::to_string(usize) + " bytes",
          e.data_offset, e.name);
    }
    out_pos += produced;
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_pos == in.size()) {
      return fail(ErrorCode::kMalformed,
                  "deflate stream of record " + quote_name(e.name) + " is truncated (" + std::to_string(out_pos) +
                      " of " + std::to_string(usize) + " bytes inflated)",
                  e.data_offset + in.size(), e.name);
    }
    if (rc == Z_MEM_ERROR) {
      return fail(ErrorCode::kLimitExceeded, "zlib out of memory inflating record " + quote_name(e.name), e.data_offset,
                  e.name);
    }
    const std::uint64_t consumed = in_pos - zs.avail_in;
    return fail(ErrorCode::kMalformed,
                "bad deflate data in record " + quote_name(e.name) + ": " +
                    (zs.msg != nullptr ? std::string(zs.msg) : "zlib error " + std::to_string(rc)),
                e.data_offset + consumed, e.name);
  }
  const std::uint64_t left = zs.avail_in + (in.size() - in_pos);
  if (left != 0) {
    return fail(ErrorCode::kMalformed,
                "deflate stream of record " + quote_name(e.name) + " ends " + std::to_string(left) +
                    " bytes before the end of the record",
                e.data_offset + in.size() - left, e.name);
  }
  if (out_pos != usize) {
    return fail(ErrorCode::kMalformed,
                "record " + quote_name(e.name) + " inflates to " + std::to_string(out_pos) +
                    " bytes but the central directory says " + std::to_string(usize),
                e.data_offset, e.name);
  }
  RecordBytes r;
  r.bytes = Bytes(out->data(), out->size());
  r.owned = std::move(out);
  return r;
}

// ---- duplicate names as miniz sees them (grammar item 7) -------------------

// miniz's key comparison: ASCII letters lower-cased, bytes unsigned
// (mz_zip_reader_filename_less).
int compare_ignoring_case(std::string_view a, std::string_view b) noexcept {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    auto lower = [](char c) {
      const auto u = static_cast<unsigned char>(c);
      return u >= 'A' && u <= 'Z' ? static_cast<unsigned char>(u - 'A' + 'a') : u;
    };
    const unsigned char x = lower(a[i]), y = lower(b[i]);
    if (x != y) return x < y ? -1 : 1;
  }
  return a.size() == b.size() ? 0 : (a.size() < b.size() ? -1 : 1);
}

// The central indices in the order miniz's heap sort leaves them
// (mz_zip_reader_sort_central_dir_offsets_by_filename: build a max-heap by
// sifting down from (size-2)/2, then swap the root to the end and sift).
std::vector<std::uint32_t> miniz_sorted(const std::vector<ZipEntry>& es) {
  const std::size_t size = es.size();
  std::vector<std::uint32_t> v(size);
  for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<std::uint32_t>(i);
  if (size <= 1) return v;
  auto less = [&](std::uint32_t a, std::uint32_t b) { return compare_ignoring_case(es[a].name, es[b].name) < 0; };
  auto sift = [&](std::size_t root, std::size_t end) {
    for (;;) {
      std::size_t child = root * 2 + 1;
      if (child >= end) break;
      if (child + 1 < end && less(v[child], v[child + 1])) ++child;
      if (!less(v[root], v[child])) break;
      std::swap(v[root], v[child]);
      root = child;
    }
  };
  for (std::size_t start = (size - 2) >> 1;; --start) {
    sift(start, size);
    if (start == 0) break;
  }
  for (std::size_t end = size - 1; end > 0; --end) {
    std::swap(v[end], v[0]);
    sift(0, end);
  }
  return v;
}

// mz_zip_locate_file_binary_search over `sorted`: the central index miniz
// returns for `name`, or -1.
std::int64_t miniz_locate(const std::vector<ZipEntry>& es, const std::vector<std::uint32_t>& sorted,
                          std::string_view name) {
  std::int64_t l = 0, h = static_cast<std::int64_t>(sorted.size()) - 1;
  while (l <= h) {
    const std::int64_t m = l + ((h - l) >> 1);
    const std::uint32_t idx = sorted[static_cast<std::size_t>(m)];
    const int c = compare_ignoring_case(es[idx].name, name);
    if (c == 0) return idx;
    if (c < 0) {
      l = m + 1;
    } else {
      h = m - 1;
    }
  }
  return -1;
}

// Groups entries whose names are equal ignoring ASCII case; `order` is
// scratch (overwritten). Each group becomes a ZipDuplicate and one
// kDuplicateName anomaly per copy after the first central one, naming the
// copy PyTorch (miniz) reads.
Status find_duplicates(const std::vector<ZipEntry>& es, std::vector<std::uint32_t>& order,
                       std::vector<ZipDuplicate>& dups, std::vector<ZipAnomaly>& anomalies,
                       std::uint64_t cd_offset) try {
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return compare_ignoring_case(es[a].name, es[b].name) < 0; });
  std::vector<std::uint32_t> sorted;  // miniz's order, made once if needed
  for (std::size_t k = 0; k < order.size();) {
    std::size_t j = k + 1;
    while (j < order.size() && compare_ignoring_case(es[order[k]].name, es[order[j]].name) == 0) ++j;
    if (j - k >= 2) {
      if (sorted.empty()) sorted = miniz_sorted(es);
      ZipDuplicate d;
      d.copies.assign(order.begin() + static_cast<std::ptrdiff_t>(k), order.begin() + static_cast<std::ptrdiff_t>(j));
      std::sort(d.copies.begin(), d.copies.end());
      d.read = miniz_locate(es, sorted, es[d.copies.front()].name);
      const ZipEntry& first = es[d.copies.front()];
      for (std::uint32_t i : d.copies) d.case_only = d.case_only || es[i].name != first.name;
      const std::string reads =
          d.read >= 0 ? "; PyTorch (miniz: binary search over an unstable, case-insensitive sort) reads entry #" +
                            std::to_string(d.read) + " (local header at " +
                            std::to_string(es[static_cast<std::size_t>(d.read)].local_header_offset) + ")"
                      : std::string();
      for (std::size_t c = 1; c < d.copies.size(); ++c) {
        const ZipEntry& e = es[d.copies[c]];
        anomalies.push_back({ZipAnomalyKind::kDuplicateName, e.name, e.local_header_offset,
                             "central entry #" + std::to_string(e.index) + " repeats the name of entry #" +
                                 std::to_string(first.index) +
                                 (e.name != first.name ? std::string(" (ignoring case)") : std::string()) + reads});
      }
      dups.push_back(std::move(d));
    }
    k = j;
  }
  return {};
} catch (const std::bad_alloc&) {
  return fail(ErrorCode::kLimitExceeded, "out of memory indexing duplicate names", cd_offset);
}

}  // namespace

std::string_view zip_anomaly_name(ZipAnomalyKind k) noexcept {
  switch (k) {
    case ZipAnomalyKind::kDuplicateName: return "duplicate_name";
    case ZipAnomalyKind::kLocalNameMismatch: return "local_name_mismatch";
    case ZipAnomalyKind::kOutsideRoot: return "outside_root";
    case ZipAnomalyKind::kFlagBits: return "flag_bits";
    case ZipAnomalyKind::kOverlap: return "overlap";
    case ZipAnomalyKind::kTrailingData: return "trailing_data";
    case ZipAnomalyKind::kUnsupportedMethod: return "unsupported_method";
    case ZipAnomalyKind::kCrcMismatch: return "crc_mismatch";
    case ZipAnomalyKind::kGapData: return "gap_data";
    case ZipAnomalyKind::kNoRootFolder: return "no_root_folder";
  }
  return "unknown";
}

std::uint32_t crc32_update(std::uint32_t crc, Bytes data) noexcept {
  return detail::crc32_fast(crc, data.data(), data.size());
}

namespace {

// madvise(MADV_WILLNEED) on the page(s) holding each local header (fixed part
// plus up to 4 KiB of name and extra field): for a file mapping the kernel
// starts reading them all at once; for memory already present (a heap
// buffer, a warm file) it does nothing. A hint only; errors are ignored. Only
// for archives of at least 64 MiB, where the headers are far apart.
void prefetch_local_headers(Bytes file, const std::vector<ZipEntry>& entries, std::uint64_t cd_offset) {
  constexpr std::uint64_t kMinFile = 64ull << 20;
  if (file.size() < kMinFile || entries.size() < 2) return;
  const long page_l = ::sysconf(_SC_PAGESIZE);
  const std::uintptr_t page = page_l > 0 ? static_cast<std::uintptr_t>(page_l) : 4096;
  const auto base = reinterpret_cast<std::uintptr_t>(file.data());
  for (const ZipEntry& e : entries) {
    const std::uint64_t lho = e.local_header_offset;
    if (lho >= cd_offset) continue;  // refused below
    const std::uint64_t len = std::min<std::uint64_t>(4096 + 30, cd_offset - lho);
    const std::uintptr_t begin = (base + lho) / page * page;
    const std::uintptr_t end = base + lho + len;
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
  }
}

}  // namespace

Result<ZipArchive> ZipArchive::open(Bytes file, const Limits& limits) {
  // The big allocations are checked one by one below; this also covers the
  // small ones (names, anomaly texts) so that nothing throws out of open().
  try {
    return open_unguarded(file, limits);
  } catch (const std::bad_alloc&) {
    return fail(ErrorCode::kLimitExceeded, "out of memory while reading the central directory", 0);
  }
}

Result<ZipArchive> ZipArchive::open_unguarded(Bytes file, const Limits& limits) {
  const std::uint64_t size = file.size();
  // Grammar item 1: torch's _is_zipfile looks at the first four bytes only.
  if (size < 4 || le32(file, 0) != kSigLocal) {
    return fail(ErrorCode::kMalformed, "not a zip archive: the file does not start with PK\\3\\4", 0);
  }

  ZipArchive z;
  z.file_ = file;
  z.limits_ = limits;
  SAFECKPT_TRY(const EndRecord end, read_end_record(file, z.anomalies_));

  // Grammar item 5 (first half): the central directory lies before the
  // (zip64) end record, so every record must end before the directory.
  if (!in_bounds(end.cd_limit, end.cd_offset, end.cd_size)) {
    return fail(ErrorCode::kMalformed,
                "central directory [" + std::to_string(end.cd_offset) + ", +" + std::to_string(end.cd_size) +
                    ") does not end before the end of central directory record at " + std::to_string(end.cd_limit),
                end.cd_limit);
  }
  if (end.entries > limits.max_zip_entries || end.entries > kMax32) {
    return fail(ErrorCode::kLimitExceeded,
                "archive declares " + std::to_string(end.entries) +
                    " entries, above limits.max_zip_entries = " + std::to_string(limits.max_zip_entries),
                end.cd_offset);
  }
  if (end.entries > end.cd_size / kCentralHeaderSize) {
    return fail(ErrorCode::kMalformed,
                "archive declares " + std::to_string(end.entries) + " entries but its central directory of " +
                    std::to_string(end.cd_size) + " bytes holds at most " +
                    std::to_string(end.cd_size / kCentralHeaderSize),
                end.cd_offset);
  }
  if (end.entries == 0) {
    return fail(ErrorCode::kMalformed, "archive has no entries", end.cd_offset);
  }
  try {
    z.entries_.reserve(static_cast<std::size_t>(end.entries));
  } catch (const std::bad_alloc&) {
    return fail(ErrorCode::kLimitExceeded,
                "out of memory for " + std::to_string(end.entries) + " central directory entries", end.cd_offset);
  }

  // Grammar item 3: central directory entries.
  const std::uint64_t cd_end = end.cd_offset + end.cd_size;
  std::uint64_t p = end.cd_offset;
  for (std::uint64_t i = 0; i < end.entries; ++i) {
    if (cd_end - p < kCentralHeaderSize) {
      return fail(ErrorCode::kMalformed,
                  "central directory ends inside entry #" + std::to_string(i) + " (" + std::to_string(cd_end - p) +
                      " bytes left)",
                  p);
    }
    if (le32(file, p) != kSigCentral) {
      return fail(ErrorCode::kMalformed, "bad central directory signature for entry #" + std::to_string(i), p);
    }
    ZipEntry e{};
    e.flags = le16(file, p + 8);
    e.method = le16(file, p + 10);
    e.crc32 = le32(file, p + 16);
    e.compressed_size = le32(file, p + 20);
    e.uncompressed_size = le32(file, p + 24);
    const std::uint64_t name_len = le16(file, p + 28);
    const std::uint64_t extra_len = le16(file, p + 30);
    const std::uint64_t comment_len = le16(file, p + 32);
    const std::uint32_t disk_start = le16(file, p + 34);
    e.local_header_offset = le32(file, p + 42);
    e.index = static_cast<std::uint32_t>(i);
    if (name_len > limits.max_zip_name_bytes) {
      return fail(ErrorCode::kLimitExceeded,
                  "entry #" + std::to_string(i) + " has a name of " + std::to_string(name_len) +
                      " bytes, above limits.max_zip_name_bytes = " + std::to_string(limits.max_zip_name_bytes),
                  p);
    }
    const std::uint64_t var_len = name_len + extra_len + comment_len;
    if (var_len > cd_end - p - kCentralHeaderSize) {
      return fail(ErrorCode::kMalformed,
                  "central directory entry #" + std::to_string(i) + " runs past the end of the central directory", p);
    }
    e.name = std::string(as_chars(file.subspan(p + kCentralHeaderSize, name_len)));
    const std::uint64_t extra_at = p + kCentralHeaderSize + name_len;
    SAFECKPT_CHECK(read_central_extra(file.subspan(extra_at, extra_len), e.uncompressed_size == kMax32,
                                      e.compressed_size == kMax32, e.local_header_offset == kMax32, e.uncompressed_size,
                                      e.compressed_size, e.local_header_offset, e.name, extra_at));
    if (disk_start != 0) {
      return fail(
          ErrorCode::kUnsupported,
          "entry " + quote_name(e.name) + " starts on disk " + std::to_string(disk_start) + " (multi-disk archive)", p,
          e.name);
    }
    // miniz refuses both at open; deflate cannot encode N > 0 bytes in 0.
    if (e.method == kMethodStored && e.compressed_size != e.uncompressed_size) {
      return fail(ErrorCode::kMalformed,
                  "stored entry " + quote_name(e.name) + " has compressed size " + std::to_string(e.compressed_size) +
                      " != uncompressed size " + std::to_string(e.uncompressed_size),
                  p, e.name);
    }
    if (e.compressed_size == 0 && e.uncompressed_size != 0) {
      return fail(ErrorCode::kMalformed,
                  "entry " + quote_name(e.name) + " has " + std::to_string(e.uncompressed_size) +
                      " uncompressed bytes from 0 compressed bytes",
                  p, e.name);
    }
    z.entries_.push_back(std::move(e));
    p += kCentralHeaderSize + var_len;
  }
  if (p != cd_end) {
    return fail(ErrorCode::kMalformed,
                std::to_string(cd_end - p) + " unexplained bytes after the last central directory entry", p);
  }

  // Grammar item 6: root folder from the first central entry.
  {
    const std::string& first = z.entries_.front().name;
    const std::size_t slash = first.find('/');
    // PyTorch's reader would accept "/data.pkl" (root ""), but its writer
    // refuses an empty archive name ("invalid file name", inline_container.cc)
    // so only a crafted file has one: refuse it.
    if (slash == 0) {
      return fail(ErrorCode::kMalformed, "empty root folder name in the first entry " + quote_name(first),
                  z.entries_.front().local_header_offset, first);
    }
    // PyTorch refuses an archive whose first entry has no folder; numpy's
    // .npz (and other zips) have none and are still read by their readers.
    if (slash == std::string::npos) {
      z.anomalies_.push_back({ZipAnomalyKind::kNoRootFolder, first, z.entries_.front().local_header_offset,
                              "file in archive is not in a subdirectory: " + quote_name(first)});
    } else {
      z.root_ = first.substr(0, slash);
    }
  }
  const bool has_root = !z.root_.empty();
  const std::string prefix = z.root_ + "/";

  // The local headers are read one after another below; in a big file that
  // is not in the page cache each is a separate disk read (138 of them over
  // 6 GiB took 610-750 ms on the H200 machine's virtio disk, bench/RESULTS.md).
  // Ask for all their pages first so the reads are in flight together.
  prefetch_local_headers(file, z.entries_, end.cd_offset);

  // Grammar items 3-5: local headers, data offsets, bounds, flags, method.
  for (ZipEntry& e : z.entries_) {
    const std::uint64_t lho = e.local_header_offset;
    if (!in_bounds(end.cd_offset, lho, kLocalHeaderSize)) {
      return fail(ErrorCode::kMalformed,
                  "local header of " + quote_name(e.name) + " at offset " + std::to_string(lho) +
                      " does not lie before the central directory at " + std::to_string(end.cd_offset),
                  lho, e.name);
    }
    if (le32(file, lho) != kSigLocal) {
      return fail(ErrorCode::kMalformed, "bad local header signature for " + quote_name(e.name), lho, e.name);
    }
    const std::uint16_t local_flags = le16(file, lho + 6);
    const std::uint64_t local_name_len = le16(file, lho + 26);
    const std::uint64_t local_extra_len = le16(file, lho + 28);
    const std::uint64_t header_end = lho + kLocalHeaderSize;
    if (local_name_len + local_extra_len > end.cd_offset - header_end) {
      return fail(ErrorCode::kMalformed,
                  "local header of " + quote_name(e.name) + " (name " + std::to_string(local_name_len) +
                      " bytes, extra " + std::to_string(local_extra_len) + " bytes) runs into the central directory",
                  lho, e.name);
    }
    e.data_offset = header_end + local_name_len + local_extra_len;
    if (!in_bounds(end.cd_offset, e.data_offset, e.compressed_size)) {
      return fail(ErrorCode::kMalformed,
                  "record " + quote_name(e.name) + " of " + std::to_string(e.compressed_size) + " bytes at offset " +
                      std::to_string(e.data_offset) + " runs past the start of the central directory at " +
                      std::to_string(end.cd_offset) + " (file size " + std::to_string(size) + ")",
                  e.data_offset, e.name);
    }
    // CVE-2025-1944: CPython's zipfile refuses a name mismatch, PyTorch
    // ignores the local name; report it and read what PyTorch reads.
    const std::string_view local_name = as_chars(file.subspan(header_end, local_name_len));
    if (local_name != e.name) {
      z.anomalies_.push_back({ZipAnomalyKind::kLocalNameMismatch, e.name, lho,
                              "local header names " + quote_name(local_name) + ", central directory names " +
                                  quote_name(e.name) + "; PyTorch uses the central name"});
    }
    // CVE-2025-1945: CPython refuses 0x01/0x20/0x40 (some in the local
    // header only), PyTorch loads the bytes anyway.
    // Bits 1-2 only hint at the deflate level (Info-ZIP `zip -9` sets 0x0002
    // on every entry, stored ones too); no reader changes behaviour on them.
    constexpr std::uint16_t allowed = kFlagDescriptor | kFlagUtf8 | kFlagDeflateOptions;
    const std::uint16_t central_bad = static_cast<std::uint16_t>(e.flags & ~allowed);
    const std::uint16_t local_bad = static_cast<std::uint16_t>(local_flags & ~allowed);
    if (central_bad != 0 || local_bad != 0) {
      std::string detail;
      if (central_bad != 0) detail += "central flags " + flag_names(central_bad);
      if (local_bad != 0) detail += std::string(detail.empty() ? "" : "; ") + "local flags " + flag_names(local_bad);
      z.anomalies_.push_back(
          {ZipAnomalyKind::kFlagBits, e.name, lho,
           detail + "; PyTorch ignores flag bits, other readers refuse the entry or decode it differently"});
    }
    if (e.method != kMethodStored && e.method != kMethodDeflate) {
      z.anomalies_.push_back(
          {ZipAnomalyKind::kUnsupportedMethod, e.name, lho,
           "compression method " + std::to_string(e.method) + " (only 0 stored and 8 deflate are read)"});
    }
    if (has_root && e.name.compare(0, prefix.size(), prefix) != 0) {
      z.anomalies_.push_back({ZipAnomalyKind::kOutsideRoot, e.name, lho,
                              "entry is not under the root folder " + quote_name(z.root_) +
                                  "; PyTorch's getAllRecords() refuses the archive"});
    }
  }

  // Grammar item 7: duplicates. sorted_ holds the first central entry of each
  // name (stable sort keeps central order within a name).
  std::vector<std::uint32_t> order;
  try {
    order.resize(z.entries_.size());
    z.sorted_.reserve(z.entries_.size());
  } catch (const std::bad_alloc&) {
    return fail(ErrorCode::kLimitExceeded, "out of memory indexing the central directory", end.cd_offset);
  }
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return z.entries_[a].name < z.entries_[b].name; });
  for (std::size_t k = 0; k < order.size(); ++k) {
    const ZipEntry& e = z.entries_[order[k]];
    if (!z.sorted_.empty() && z.entries_[z.sorted_.back()].name == e.name) continue;
    z.sorted_.push_back(order[k]);
  }
  SAFECKPT_CHECK(find_duplicates(z.entries_, order, z.duplicates_, z.anomalies_, end.cd_offset));

  // Grammar item 5 (second half): overlaps, and bytes owned by no record.
  // Each record owns [local header, data end); its data descriptor, when
  // flagged and matching, is not a gap (but is not checked for overlap).
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return z.entries_[a].local_header_offset < z.entries_[b].local_header_offset;
  });
  std::uint64_t covered = 0;    // end of the furthest record data seen so far
  std::uint64_t accounted = 0;  // same, including its data descriptor
  const ZipEntry* furthest = nullptr;
  for (std::uint32_t idx : order) {
    const ZipEntry& e = z.entries_[idx];
    const std::uint64_t data_end = e.data_offset + e.compressed_size;
    if (furthest != nullptr && e.local_header_offset < covered) {
      z.anomalies_.push_back({ZipAnomalyKind::kOverlap, e.name, e.local_header_offset,
                              "record [" + std::to_string(e.local_header_offset) + ", " + std::to_string(data_end) +
                                  ") overlaps record " + quote_name(furthest->name) + " [" +
                                  std::to_string(furthest->local_header_offset) + ", " + std::to_string(covered) +
                                  ")"});
    } else if (e.local_header_offset > accounted) {
      z.anomalies_.push_back({ZipAnomalyKind::kGapData, e.name, accounted,
                              std::to_string(e.local_header_offset - accounted) +
                                  " bytes before this record's local header belong to no record"});
    }
    std::uint64_t end_with_descriptor = data_end;
    if (e.flags & kFlagDescriptor) end_with_descriptor += descriptor_length(file, data_end, end.cd_offset, e);
    if (data_end > covered) {
      covered = data_end;
      furthest = &e;
    }
    accounted = std::max(accounted, end_with_descriptor);
  }
  if (accounted < end.cd_offset) {
    z.anomalies_.push_back({ZipAnomalyKind::kGapData, "", accounted,
                            std::to_string(end.cd_offset - accounted) +
                                " bytes between the last record and the central directory belong to no record"});
  }
  if (cd_end < end.cd_limit) {
    z.anomalies_.push_back({ZipAnomalyKind::kGapData, "", cd_end,
                            std::to_string(end.cd_limit - cd_end) +
                                " bytes between the central directory and the end of central directory record"});
  }
  return z;
}

const ZipEntry* ZipArchive::find_full(std::string_view full_name) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), full_name,
                             [&](std::uint32_t i, std::string_view n) { return entries_[i].name < n; });
  if (it == sorted_.end() || entries_[*it].name != full_name) return nullptr;
  return &entries_[*it];
}

// Compares `name` with root + '/' + rel without building the string, so
// find() does not allocate (classify_zip is noexcept).
namespace {
int compare_under_root(std::string_view name, std::string_view root, std::string_view rel) noexcept {
  const std::size_t n = std::min(name.size(), root.size());
  if (int c = name.substr(0, n).compare(root.substr(0, n)); c != 0 || n < root.size()) {
    return c != 0 ? c : -1;  // name is a proper prefix of root
  }
  name.remove_prefix(root.size());
  if (name.empty()) return -1;
  if (name.front() != '/') return static_cast<unsigned char>(name.front()) < '/' ? -1 : 1;
  name.remove_prefix(1);
  return name.compare(rel);
}
}  // namespace

const ZipEntry* ZipArchive::find(std::string_view name_under_root) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), name_under_root, [&](std::uint32_t i, std::string_view n) {
    return compare_under_root(entries_[i].name, root_, n) < 0;
  });
  if (it == sorted_.end() || compare_under_root(entries_[*it].name, root_, name_under_root) != 0) return nullptr;
  return &entries_[*it];
}

namespace {

// The raw (stored or deflated) bytes of `e` in `file`: refused when the entry
// is not of this archive (kInvalidArgument) or uses another compression
// method (kUnsupported). One copy for read() and read_prefix().
Result<Bytes> record_data(Bytes file, const ZipEntry& e) {
  if (!in_bounds(file.size(), e.data_offset, e.compressed_size)) {
    return fail(ErrorCode::kInvalidArgument, "entry " + quote_name(e.name) + " does not belong to this archive",
                e.data_offset, e.name);
  }
  if (e.method != kMethodStored && e.method != kMethodDeflate) {
    return fail(ErrorCode::kUnsupported,
                "record " + quote_name(e.name) + " uses compression method " + std::to_string(e.method) +
                    " (only 0 stored and 8 deflate are supported)",
                e.local_header_offset, e.name);
  }
  return file.subspan(static_cast<std::size_t>(e.data_offset), static_cast<std::size_t>(e.compressed_size));
}

}  // namespace

Result<RecordBytes> ZipArchive::read(const ZipEntry& e, bool verify_crc) const {
  return read(e, verify_crc, limits_.max_inflated_bytes, "max_inflated_bytes");
}

Result<RecordBytes> ZipArchive::read(const ZipEntry& e, bool verify_crc, std::uint64_t max_bytes,
                                     std::string_view cap_name) const try {
  SAFECKPT_TRY(const Bytes raw, record_data(file_, e));
  RecordBytes r;
  if (e.method == kMethodStored) {
    r.bytes = raw;
  } else {
    SAFECKPT_TRY(r, inflate_record(raw, e, std::min(max_bytes, limits_.max_inflated_bytes),
                                   max_bytes < limits_.max_inflated_bytes ? cap_name : "max_inflated_bytes"));
  }
  // Flag bits (encryption, ...) are reported by open() as anomalies; read()
  // still returns the bytes PyTorch would use, so the scanner can scan them.
  if (verify_crc) SAFECKPT_CHECK(verify_crc32(e, r.bytes));
  return r;
} catch (const std::bad_alloc&) {
  return fail(ErrorCode::kLimitExceeded, "out of memory reading record " + std::string(e.name), e.data_offset, e.name);
}

Status ZipArchive::verify_crc(const ZipEntry& e, Bytes bytes) const {
  return verify_crc32(e, bytes);
}

Result<RecordBytes> ZipArchive::read_prefix(const ZipEntry& e, std::size_t n) const try {
  SAFECKPT_TRY(const Bytes raw, record_data(file_, e));
  RecordBytes r;
  if (e.method == kMethodStored) {
    r.bytes = raw.first(std::min<std::size_t>(raw.size(), n));
    return r;
  }
  auto out = std::make_shared<std::vector<std::uint8_t>>(n);
  Inflater inf;
  if (!inf.init()) {
    return fail(ErrorCode::kLimitExceeded, "zlib inflateInit2 failed (out of memory)", e.data_offset, e.name);
  }
  z_stream& zs = inf.stream();
  constexpr std::size_t kMaxPrefixInput = 1u << 20;
  zs.next_in = const_cast<Bytef*>(raw.data());  // zlib does not write input
  zs.avail_in = static_cast<uInt>(std::min(raw.size(), kMaxPrefixInput));
  zs.next_out = out->data();
  zs.avail_out = static_cast<uInt>(std::min<std::size_t>(n, UINT_MAX >> 1));
  const std::size_t room = zs.avail_out;
  (void)inflate(&zs, Z_SYNC_FLUSH);  // whatever inflated before an error is the prefix
  out->resize(room - zs.avail_out);
  r.bytes = Bytes(out->data(), out->size());
  r.owned = std::move(out);
  return r;
} catch (const std::bad_alloc&) {
  return fail(ErrorCode::kLimitExceeded, "out of memory reading record " + std::string(e.name), e.data_offset, e.name);
}

Status ZipArchive::require_no_anomalies() const {
  if (anomalies_.empty()) return {};
  const ZipAnomaly& a = anomalies_.front();
  std::string msg = "zip anomaly " + std::string(zip_anomaly_name(a.kind));
  if (!a.entry.empty()) msg += " in " + quote_name(a.entry);
  msg += ": " + a.detail;
  if (anomalies_.size() > 1) msg += " (and " + std::to_string(anomalies_.size() - 1) + " more)";
  return fail(ErrorCode::kMalformed, std::move(msg), a.offset, a.entry);
}

}  // namespace safeckpt
