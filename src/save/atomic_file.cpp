// Atomic file replacement: temp file in the target directory, fsync, rename.
//
// Rules (save.hpp): nothing is lost on failure — an existing target is never
// truncated or partially written, the temporary file is removed on every
// error path, and without `overwrite` the final step is
// renameat2(RENAME_NOREPLACE) (or link()+unlink() where the filesystem lacks
// it), so a file that appears while we write is not replaced either.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "safeckpt/save.hpp"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

namespace safeckpt {
namespace {

Unexpected io_error(const std::string& what, const std::filesystem::path& p, int err) {
  return make_error(ErrorCode::kIo, what + " " + p.string() + ": " + std::strerror(err));
}

class TempFile {
 public:
  TempFile() = default;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() { discard(); }

  Status create(const std::filesystem::path& target) {
    std::filesystem::path dir = target.parent_path();
    if (dir.empty()) dir = ".";
    dir_ = dir;
    std::random_device rd;
    for (int attempt = 0; attempt < 64; ++attempt) {
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, ".%08x%04x.tmp", rd(), rd() & 0xFFFFu);
      path_ = dir / ("." + target.filename().string() + suffix);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) return {};
      if (errno != EEXIST) {
        int e = errno;
        path_.clear();
        return io_error("cannot create temporary file in", dir, e);
      }
    }
    path_.clear();
    return make_error(ErrorCode::kIo, "cannot create a unique temporary file in " + dir.string());
  }

  Status write(Bytes data) {
    // Small pieces are gathered; large ones go straight to the kernel.
    if (data.size() >= kBuf) {
      SAFECKPT_CHECK(flush());
      return write_all(data);
    }
    if (buf_.size() + data.size() > kBuf) SAFECKPT_CHECK(flush());
    buf_.insert(buf_.end(), data.begin(), data.end());
    return {};
  }

  Status copy_range(int src, std::uint64_t offset, std::uint64_t length) {
    SAFECKPT_CHECK(flush());
    auto in = static_cast<off_t>(offset);
    bool kernel = true;
    std::vector<std::uint8_t> tmp;
    while (length > 0) {
      const std::size_t want = length < (1u << 30) ? static_cast<std::size_t>(length) : (1u << 30);
      if (kernel) {
        const ssize_t n = ::copy_file_range(src, &in, fd_, nullptr, want, 0);
        if (n > 0) {
          length -= static_cast<std::uint64_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
          kernel = false;  // not on these files: copy through user space
          continue;
        }
        if (n < 0) return io_error("copy_file_range to", path_, errno);
        return make_error(ErrorCode::kIo, "copy_file_range to " + path_.string() + ": the source file ended early");
      }
      tmp.resize(std::min<std::size_t>(want, kBuf));
      const ssize_t n = ::pread(src, tmp.data(), tmp.size(), in);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return io_error("pread for", path_, errno);
      if (n == 0) return make_error(ErrorCode::kIo, "copy to " + path_.string() + ": the source file ended early");
      SAFECKPT_CHECK(write_all(Bytes(tmp.data(), static_cast<std::size_t>(n))));
      in += n;
      length -= static_cast<std::uint64_t>(n);
    }
    return {};
  }

  Status commit(const std::filesystem::path& target, bool overwrite, bool do_fsync) {
    SAFECKPT_CHECK(flush());
    if (do_fsync && ::fsync(fd_) != 0) return io_error("fsync", path_, errno);
    if (::close(fd_) != 0) {
      fd_ = -1;
      return io_error("close", path_, errno);
    }
    fd_ = -1;
    if (overwrite) {
      if (::rename(path_.c_str(), target.c_str()) != 0) return io_error("rename to", target, errno);
    } else {
      int rc = ::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE);
      if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)) {
        // No RENAME_NOREPLACE here: link() fails with EEXIST just the same.
        rc = ::link(path_.c_str(), target.c_str());
        if (rc == 0) ::unlink(path_.c_str());
      }
      if (rc != 0) {
        if (errno == EEXIST)
          return make_error(ErrorCode::kExists, "output exists: " + target.string() + " (overwrite not requested)");
        return io_error("rename to", target, errno);
      }
    }
    path_.clear();
    if (do_fsync) {
      int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        ::fsync(dfd);  // best effort: the data itself is already durable
        ::close(dfd);
      }
    }
    return {};
  }

  void discard() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!path_.empty()) ::unlink(path_.c_str());
    path_.clear();
  }

 private:
  static constexpr std::size_t kBuf = 1u << 20;

  Status flush() {
    if (buf_.empty()) return {};
    Status s = write_all(Bytes(buf_.data(), buf_.size()));
    buf_.clear();
    return s;
  }
  Status write_all(Bytes data) {
    const std::uint8_t* p = data.data();
    std::size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left < (1u << 30) ? left : (1u << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error("write", path_, errno);
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    return {};
  }

  std::filesystem::path dir_, path_;
  int fd_ = -1;
  std::vector<std::uint8_t> buf_;
};

}  // namespace

namespace {

Status run_atomically(const std::filesystem::path& path, const SaveOptions& options,
                      const std::function<Status(TempFile&)>& produce) {
  if (path.empty() || !path.has_filename()) return make_error(ErrorCode::kInvalidArgument, "save: empty output path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!options.overwrite)
      return make_error(ErrorCode::kExists, "output exists: " + path.string() + " (overwrite not requested)");
    if (S_ISDIR(st.st_mode)) return make_error(ErrorCode::kInvalidArgument, "output is a directory: " + path.string());
  }
  TempFile tmp;
  SAFECKPT_CHECK(tmp.create(path));
  SAFECKPT_CHECK(produce(tmp));
  return tmp.commit(path, options.overwrite, options.fsync);
}

}  // namespace

Status write_file_atomically(const std::filesystem::path& path, const SaveOptions& options,
                             const std::function<Status(const std::function<Status(Bytes)>& write)>& produce) {
  return run_atomically(path, options,
                        [&](TempFile& tmp) { return produce([&tmp](Bytes b) { return tmp.write(b); }); });
}

Status write_file_atomically_ranges(
    const std::filesystem::path& path, const SaveOptions& options,
    const std::function<Status(const std::function<Status(Bytes)>& write, const FileRangeCopy& copy)>& produce) {
  return run_atomically(path, options, [&](TempFile& tmp) {
    return produce(
        [&tmp](Bytes b) { return tmp.write(b); },
        [&tmp](int fd, std::uint64_t offset, std::uint64_t length) { return tmp.copy_range(fd, offset, length); });
  });
}

}  // namespace safeckpt
