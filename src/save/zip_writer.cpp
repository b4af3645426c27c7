// PyTorchStreamWriter's zip layout (caffe2/serialize/inline_container.cc with
// miniz mz_zip_writer_add_mem_ex_v2, MZ_ZIP_FLAG_WRITE_ZIP64): see
// docs/torch-format.md §2.3 for the field-by-field description this follows.
#include "save/zip_writer.hpp"

#include <zlib.h>

#include "safeckpt/save.hpp"
#include "util/bytes.hpp"
#include "util/crc32.hpp"

namespace safeckpt {
namespace {

constexpr std::uint64_t kU32Max = 0xFFFFFFFFu;

// Little-endian fields, truncated to their width as the callers expect.
void put16(std::vector<std::uint8_t>& v, std::uint64_t x) {
  util::append_le(v, static_cast<std::uint16_t>(x));
}
void put32(std::vector<std::uint8_t>& v, std::uint64_t x) {
  util::append_le(v, static_cast<std::uint32_t>(x));
}
void put64(std::vector<std::uint8_t>& v, std::uint64_t x) {
  util::append_le(v, x);
}

// miniz mz_zip_writer_create_zip64_extra_data: id 1, then the 64-bit fields
// present in the order uncompressed size, compressed size, header offset.
void zip64_extra(std::vector<std::uint8_t>& v, bool sizes, std::uint64_t usize, std::uint64_t csize, bool offset,
                 std::uint64_t header_offset) {
  put16(v, 0x0001);
  put16(v, (sizes ? 16 : 0) + (offset ? 8 : 0));
  if (sizes) {
    put64(v, usize);
    put64(v, csize);
  }
  if (offset) put64(v, header_offset);
}

}  // namespace

std::uint32_t save_crc32(std::uint32_t crc, Bytes data) noexcept {
  return detail::crc32_fast(crc, data.data(), data.size());
}

std::uint64_t zip_record_data_offset(std::uint64_t cursor, std::uint64_t full_name_bytes, std::uint64_t size,
                                     std::uint32_t alignment) {
  // caffe2 detail::getPadding: start = cursor + 30 + name + 4 (FB header),
  // plus the zip64 extra miniz puts first when size or cursor >= 0xFFFFFFFF.
  std::uint64_t start = cursor + 30 + full_name_bytes + 4;
  if (size >= kU32Max || cursor >= kU32Max) {
    start += 4;
    if (size >= kU32Max) start += 16;
    if (cursor >= kU32Max) start += 8;
  }
  const std::uint64_t pad = (alignment - start % alignment) % alignment;
  return start + pad;
}

Status ZipWriter::emit(Bytes b) {
  if (b.empty()) return {};
  SAFECKPT_CHECK(write_(b));
  offset_ += b.size();
  return {};
}

Status ZipWriter::add(std::string_view name, std::span<const Bytes> pieces) {
  const std::string full = root_ + "/" + std::string(name);
  if (full.size() > 0xFFFF) return make_error(ErrorCode::kInvalidArgument, "zip record name too long: " + full);
  for (const Entry& e : entries_)
    if (e.name == full) return make_error(ErrorCode::kInternal, "Tried to serialize file twice: " + full);
  std::uint64_t size = 0;
  for (Bytes p : pieces) size += p.size();
  const std::uint64_t cursor = offset_;
  const bool zip64 = size >= kU32Max || cursor >= kU32Max;
  const std::uint64_t data_at = zip_record_data_offset(cursor, full.size(), size, alignment_);
  const std::uint64_t zip64_len = zip64 ? 4 + (size >= kU32Max ? 16 : 0) + (cursor >= kU32Max ? 8 : 0) : 0;
  const std::uint64_t pad = data_at - (cursor + 30 + full.size() + zip64_len + 4);
  if (pad > 0xFFFF) return make_error(ErrorCode::kInternal, "zip padding too large");
  const std::uint16_t flags = size > 0 ? 0x0808 : 0x0800;

  std::vector<std::uint8_t> h;
  h.reserve(30 + full.size() + zip64_len + 4 + pad);
  put32(h, 0x04034b50);
  put16(h, 0);      // version needed
  put16(h, flags);  // data descriptor + UTF-8
  put16(h, 0);      // stored
  put16(h, 0);      // time
  put16(h, 0);      // date
  put32(h, 0);      // crc (in the descriptor)
  put32(h, 0);      // compressed size
  put32(h, 0);      // uncompressed size
  put16(h, full.size());
  put16(h, zip64_len + 4 + pad);
  h.insert(h.end(), full.begin(), full.end());
  // Local zip64 extra: miniz writes the uncompressed size and a compressed
  // size of 0 (not yet known when the header is written).
  if (zip64) zip64_extra(h, size >= kU32Max, size, 0, cursor >= kU32Max, cursor);
  h.push_back('F');
  h.push_back('B');
  put16(h, pad);
  h.insert(h.end(), pad, 'Z');
  SAFECKPT_CHECK(emit(h));

  std::uint32_t crc = 0;
  for (Bytes p : pieces) {
    if (crc_) crc = save_crc32(crc, p);
    SAFECKPT_CHECK(emit(p));
  }
  if (size > 0) {
    std::vector<std::uint8_t> d;
    put32(d, 0x08074b50);
    put32(d, crc);
    if (zip64) {
      put64(d, size);
      put64(d, size);
    } else {
      put32(d, size);
      put32(d, size);
    }
    SAFECKPT_CHECK(emit(d));
  }
  entries_.push_back({full, cursor, size, crc, flags});
  return {};
}

Status ZipWriter::finish() {
  const std::uint64_t cd_start = offset_;
  std::vector<std::uint8_t> cd;
  for (const Entry& e : entries_) {
    const bool big = e.size >= kU32Max, far = e.header_offset >= kU32Max;
    const std::uint64_t extra = (big || far) ? 4 + (big ? 16 : 0) + (far ? 8 : 0) : 0;
    put32(cd, 0x02014b50);
    put16(cd, 0);  // version made by
    put16(cd, 0);  // version needed
    put16(cd, e.flags);
    put16(cd, 0);  // stored
    put16(cd, 0);
    put16(cd, 0);
    put32(cd, e.crc);
    put32(cd, big ? kU32Max : e.size);
    put32(cd, big ? kU32Max : e.size);
    put16(cd, e.name.size());
    put16(cd, extra);
    put16(cd, 0);  // comment
    put16(cd, 0);  // disk
    put16(cd, 0);  // internal attributes
    put32(cd, 0);  // external attributes
    put32(cd, far ? kU32Max : e.header_offset);
    cd.insert(cd.end(), e.name.begin(), e.name.end());
    if (big || far) zip64_extra(cd, big, e.size, e.size, far, e.header_offset);
    if (cd.size() >= (1u << 20)) {
      SAFECKPT_CHECK(emit(cd));
      cd.clear();
    }
  }
  SAFECKPT_CHECK(emit(cd));
  const std::uint64_t cd_size = offset_ - cd_start;
  const std::uint64_t n = entries_.size();
  std::vector<std::uint8_t> end;
  const std::uint64_t z64 = offset_;
  put32(end, 0x06064b50);
  put64(end, 44);
  put16(end, 0x031E);  // made by (miniz)
  put16(end, 0x002D);  // needed: 4.5
  put32(end, 0);
  put32(end, 0);
  put64(end, n);
  put64(end, n);
  put64(end, cd_size);
  put64(end, cd_start);
  put32(end, 0x07064b50);
  put32(end, 0);
  put64(end, z64);
  put32(end, 1);
  put32(end, 0x06054b50);
  put16(end, 0);
  put16(end, 0);
  put16(end, n > 0xFFFF ? 0xFFFF : n);
  put16(end, n > 0xFFFF ? 0xFFFF : n);
  put32(end, cd_size >= kU32Max ? kU32Max : cd_size);
  put32(end, cd_start >= kU32Max ? kU32Max : cd_start);
  put16(end, 0);
  return emit(end);
}

}  // namespace safeckpt
