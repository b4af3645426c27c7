#include "safeckpt/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace safeckpt {
namespace {

// Files up to this size (bytes, inclusive) are read at open(), not mapped:
// truncating a mapped file makes a later access past the new end raise
// SIGBUS (mmap(2)), which a library cannot catch without a process-wide
// signal handler; a read copy cannot be cut short. Small enough that the
// copy is cheap next to opening the file; large enough for configs, indexes,
// small checkpoints and every hand-made test. Larger files stay mapped: the
// limit stands for them (README, "safeckpt::open").
constexpr std::size_t kReadSmallBytes = std::size_t{1} << 20;

}  // namespace

MappedFile::MappedFile(MappedFile&& o) noexcept {
  *this = std::move(o);
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    owned_ = std::move(o.owned_);
    mapped_ = o.mapped_;
    fd_ = o.fd_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    data_ = mapped_ ? o.data_ : owned_.data();
    o.data_ = nullptr;
    o.size_ = 0;
    o.mapped_ = false;
    o.fd_ = -1;
  }
  return *this;
}

MappedFile::~MappedFile() {
  reset();
}

void MappedFile::reset() noexcept {
  if (mapped_ && data_ != nullptr && size_ > 0) munmap(const_cast<std::uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
  fd_ = -1;
  owned_.clear();
}

Result<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO (one a hostile archive unpacked where a
  // checkpoint was expected) must not wait for a writer; adopt() then
  // refuses anything but a regular file and clears the flag. O_NOCTTY: a
  // terminal named here stays ours.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return make_error(ErrorCode::kIo, "cannot open " + path.string() + ": " + std::strerror(errno));
  return adopt(fd, path);
}

Result<MappedFile> MappedFile::adopt(int fd, const std::filesystem::path& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(ErrorCode::kIo, "cannot stat " + path.string() + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kIo, path.string() + " is not a regular file");
  }
  // A caller that opened with O_NONBLOCK (so that a FIFO could not block
  // the open) gets an ordinary descriptor back from here on.
  if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0 && (fl & O_NONBLOCK) != 0)
    (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  MappedFile f;
  f.fd_ = fd;
  f.path_ = path;
  f.size_ = static_cast<std::size_t>(st.st_size);
  if (f.size_ > 0 && f.size_ <= kReadSmallBytes) {
    // Read, not mapped: a later truncation cannot SIGBUS (mapped_file.hpp).
    f.owned_.resize(f.size_);
    std::size_t got = 0;
    while (got < f.size_) {
      const ssize_t n = ::pread(fd, f.owned_.data() + got, f.size_ - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "the file shrank while it was read";
        f.size_ = 0;
        return make_error(ErrorCode::kIo, "cannot read " + path.string() + ": " + why);
      }
      got += static_cast<std::size_t>(n);
    }
    f.data_ = f.owned_.data();
    return f;
  }
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      f.size_ = 0;
      return make_error(ErrorCode::kIo, "cannot mmap " + path.string() + ": " + std::strerror(e));
    }
    f.data_ = static_cast<const std::uint8_t*>(p);
    f.mapped_ = true;
  }
  return f;
}

Result<MappedFile> MappedFile::from_reader(const std::function<std::int64_t(std::uint8_t*, std::size_t)>& read,
                                           std::uint64_t max_bytes) {
  std::vector<std::uint8_t> buf;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    std::int64_t n = read(chunk, sizeof chunk);
    if (n < 0) return make_error(ErrorCode::kIo, "read callback failed");
    if (n == 0) break;
    if (static_cast<std::uint64_t>(n) > max_bytes - buf.size())
      return make_error(ErrorCode::kLimitExceeded, "input larger than " + std::to_string(max_bytes) + " bytes");
    buf.insert(buf.end(), chunk, chunk + n);
  }
  return from_buffer(std::move(buf));
}

MappedFile MappedFile::from_buffer(std::vector<std::uint8_t> buf) {
  MappedFile f;
  f.owned_ = std::move(buf);
  f.data_ = f.owned_.data();
  f.size_ = f.owned_.size();
  return f;
}

}  // namespace safeckpt
