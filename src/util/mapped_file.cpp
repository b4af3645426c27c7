#include "safeckpt/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace safeckpt {

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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
  MappedFile f;
  f.fd_ = fd;
  f.path_ = path;
  f.size_ = static_cast<std::size_t>(st.st_size);
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
