// Minimal stored-zip writer for tests that craft archives byte by byte
// (what Python's zipfile.writestr(ZIP_STORED) produces: local headers with
// real sizes and CRC, a central directory, a classic EOCD).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

namespace test_support {

class ZipBuilder {
 public:
  explicit ZipBuilder(std::string root) : root_(std::move(root)) {}

  // Adds `root/name` with `data` (stored). `raw_name` = name without root.
  void add(const std::string& name, const std::string& data, bool raw_name = false) {
    std::string full = raw_name ? name : root_ + "/" + name;
    Entry e{full, static_cast<std::uint32_t>(out_.size()),
            static_cast<std::uint32_t>(
                crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()))),
            static_cast<std::uint32_t>(data.size())};
    u32(0x04034b50);
    u16(20);
    u16(0);
    u16(0);
    u16(0);
    u16(0);
    u32(e.crc);
    u32(e.size);
    u32(e.size);
    u16(static_cast<std::uint16_t>(full.size()));
    u16(0);
    out_.insert(out_.end(), full.begin(), full.end());
    out_.insert(out_.end(), data.begin(), data.end());
    entries_.push_back(e);
  }

  std::vector<std::uint8_t> finish() {
    std::uint32_t cd = static_cast<std::uint32_t>(out_.size());
    for (const auto& e : entries_) {
      u32(0x02014b50);
      u16(20);
      u16(20);
      u16(0);
      u16(0);
      u16(0);
      u16(0);
      u32(e.crc);
      u32(e.size);
      u32(e.size);
      u16(static_cast<std::uint16_t>(e.name.size()));
      u16(0);
      u16(0);
      u16(0);
      u16(0);
      u32(0);
      u32(e.offset);
      out_.insert(out_.end(), e.name.begin(), e.name.end());
    }
    std::uint32_t cd_size = static_cast<std::uint32_t>(out_.size()) - cd;
    u32(0x06054b50);
    u16(0);
    u16(0);
    u16(static_cast<std::uint16_t>(entries_.size()));
    u16(static_cast<std::uint16_t>(entries_.size()));
    u32(cd_size);
    u32(cd);
    u16(0);
    return out_;
  }

 private:
  struct Entry {
    std::string name;
    std::uint32_t offset, crc, size;
  };
  void u16(std::uint16_t v) {
    out_.push_back(static_cast<std::uint8_t>(v));
    out_.push_back(static_cast<std::uint8_t>(v >> 8));
  }
  void u32(std::uint32_t v) {
    u16(static_cast<std::uint16_t>(v));
    u16(static_cast<std::uint16_t>(v >> 16));
  }
  std::string root_;
  std::vector<std::uint8_t> out_;
  std::vector<Entry> entries_;
};

}  // namespace test_support
