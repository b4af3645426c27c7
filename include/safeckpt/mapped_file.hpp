// safeckpt/mapped_file.hpp — read-only views of a file's bytes.
//
// MappedFile owns a read-only, private mmap of a whole file (or an owned
// buffer when mapping is impossible, e.g. a pipe). It is move-only; spans
// taken from bytes() borrow it and die with it.
//
// One open per load (issue 11 item 3, issue 12): a mapped MappedFile keeps
// its descriptor open, and every later stage that needs the file's bytes
// (the host views, save/convert, the CUDA transfer engine's pread/mmap/
// O_DIRECT reads through fd()) reads THIS open file, never the path again.
// What that guarantees and what it does not:
//  - replacing the path (rename/unlink + create, `mv other FILE`) after
//    open() changes nothing: the descriptor and the mapping keep the inode
//    that was opened and validated;
//  - modifying the opened inode IN PLACE (write(2) into the same file,
//    truncation) is not prevented: MAP_PRIVATE pages the process has not
//    written reflect later writes to the file on Linux, and pread sees them.
//    Zip storage records are CRC-checked where read (LoadOptions::
//    verify_storage_crc, the engine's verify_crc); safetensors files and
//    legacy storages carry no checksum, so for them only a hash of these
//    same bytes (the signing issue) can detect it. Don't load files that
//    an untrusted party can still write to.
//  - truncating the opened file while it is mapped makes a later access to
//    a page past the new end raise SIGBUS (mmap(2)), which kills the
//    process: a library cannot catch it without a process-wide signal
//    handler, which safeckpt does not install. Files of at most 1 MiB are
//    therefore read into memory by open()/adopt() (pread(2);
//    src/util/mapped_file.cpp kReadSmallBytes), so truncating them
//    afterwards changes nothing (a file that shrinks while it is read is
//    kIo); larger files are mapped, and for them the limit stands: don't
//    truncate a checkpoint while it is being loaded.
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

  // Maps `path` read-only (reads it when it has at most 1 MiB, above).
  // Errors: kIo (open/stat/mmap/read failed, not a regular file, the file
  // shrank while read). An empty file maps to an empty span. A FIFO, socket
  // or device is refused at once: it is opened non-blocking, so a FIFO with
  // no writer does not hang the caller.
  static Result<MappedFile> open(const std::filesystem::path& path);
  // Maps (or reads, as open()) an already open descriptor, taking ownership
  // of `fd` (closed on every error too). `path` only names the file in
  // messages and path(). Open it with O_NONBLOCK so that a FIFO cannot block
  // the open: anything but a regular file is refused here, and the flag is
  // cleared on the one kept. Errors: as open().
  static Result<MappedFile> adopt(int fd, const std::filesystem::path& path);
  // Reads everything from `read` (returns bytes read, 0 at end, -1 on error)
  // into an owned buffer of at most `max_bytes`. Errors: kIo, kLimitExceeded.
  static Result<MappedFile> from_reader(const std::function<std::int64_t(std::uint8_t*, std::size_t)>& read,
                                        std::uint64_t max_bytes);
  // Takes ownership of a buffer.
  static MappedFile from_buffer(std::vector<std::uint8_t> buf);

  Bytes bytes() const noexcept { return {data_, size_}; }
  std::size_t size() const noexcept { return size_; }
  // The open descriptor of a file from open()/adopt() (for pread, a second
  // mapping, or an O_DIRECT reopen of the same inode through
  // /proc/self/fd/N), owned by this object (also for a small file that was
  // read); -1 for buffers.
  int fd() const noexcept { return fd_; }
  // True when bytes() is a mapping of the file (pages read on first touch:
  // a truncation by another writer makes a later touch past the new end
  // SIGBUS); false when they are owned (a small file read by open(),
  // from_reader, from_buffer). A reader that must survive truncation copies
  // a mapped span with pread(fd(), ...) at its offset instead.
  bool mapped() const noexcept { return mapped_; }
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
