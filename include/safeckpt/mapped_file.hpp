// safeckpt/mapped_file.hpp — read-only views of a file's bytes.
//
// MappedFile owns a read-only, private mmap of a whole file (or an owned
// buffer when mapping is impossible, e.g. a pipe). It is move-only; spans
// taken from bytes() borrow it and die with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "safeckpt/error.hpp"

namespace safeckpt {

using Bytes = std::span<const std::uint8_t>;

class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  ~MappedFile();

  // Maps `path` read-only. Errors: kIo (open/stat/mmap failed, not a regular
  // file). An empty file maps to an empty span.
  static Result<MappedFile> open(const std::filesystem::path& path);
  // Reads everything from `read` (returns bytes read, 0 at end, -1 on error)
  // into an owned buffer of at most `max_bytes`. Errors: kIo, kLimitExceeded.
  static Result<MappedFile> from_reader(const std::function<std::int64_t(std::uint8_t*, std::size_t)>& read,
                                        std::uint64_t max_bytes);
  // Takes ownership of a buffer.
  static MappedFile from_buffer(std::vector<std::uint8_t> buf);

  Bytes bytes() const noexcept { return {data_, size_}; }
  std::size_t size() const noexcept { return size_; }
  // Open file descriptor of a mapped file (for O_DIRECT/pread paths), or -1.
  int fd() const noexcept { return fd_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void reset() noexcept;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
  int fd_ = -1;
  std::vector<std::uint8_t> owned_;
  std::filesystem::path path_;
};

}  // namespace safeckpt
