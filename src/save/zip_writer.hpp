// The PyTorchStreamWriter (miniz) zip layout, streamed to a writer.
// See include/safeckpt/save.hpp rule 2 and docs/torch-format.md §2.3.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "safeckpt/error.hpp"
#include "safeckpt/mapped_file.hpp"

namespace safeckpt {

class ZipWriter {
 public:
  using Write = std::function<Status(Bytes)>;
  ZipWriter(const Write& write, std::string root, std::uint32_t alignment, bool compute_crc32)
      : write_(write), root_(std::move(root)), alignment_(alignment), crc_(compute_crc32) {}

  // Adds record `root/name` whose bytes are the concatenation of `pieces`.
  Status add(std::string_view name, std::span<const Bytes> pieces);
  Status add(std::string_view name, Bytes data) { return add(name, std::span<const Bytes>(&data, 1)); }
  // Central directory, zip64 end record + locator, end record.
  Status finish();

  std::uint64_t offset() const noexcept { return offset_; }

 private:
  struct Entry {
    std::string name;
    std::uint64_t header_offset, size;
    std::uint32_t crc;
    std::uint16_t flags;
  };
  Status emit(Bytes b);
  Status emit(const std::vector<std::uint8_t>& v) { return emit(Bytes(v.data(), v.size())); }

  const Write& write_;
  std::string root_;
  std::uint32_t alignment_;
  bool crc_;
  std::uint64_t offset_ = 0;
  std::vector<Entry> entries_;
};

// CRC-32 (zlib) of `data`, continuing from `crc`; handles > 4 GiB spans.
std::uint32_t save_crc32(std::uint32_t crc, Bytes data) noexcept;

}  // namespace safeckpt
