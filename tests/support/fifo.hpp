// A FIFO with a watchdog, for tests that a reader refuses a FIFO instead of
// waiting on it: opening a FIFO for reading blocks until a writer comes, so
// a reader that forgets O_NONBLOCK would hang the test binary for good. The
// watchdog plays that writer after a grace period (it opens the FIFO for
// writing, which only succeeds while a reader is blocked in open), which
// unblocks the reader and records that it was needed: the test then fails
// instead of hanging. Not a timing assertion: a correct reader never waits.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

namespace test_support {

class FifoWatchdog {
 public:
  // Makes a FIFO at `path` (mode 0600); `ok()` says whether mkfifo worked.
  explicit FifoWatchdog(std::filesystem::path path, std::chrono::seconds grace = std::chrono::seconds(10))
      : path_(std::move(path)), ok_(::mkfifo(path_.c_str(), 0600) == 0) {
    if (!ok_) return;
    thread_ = std::thread([this, grace] {
      std::unique_lock<std::mutex> lock(mu_);
      const auto until = std::chrono::steady_clock::now() + grace;
      while (!done_) {
        if (cv_.wait_until(lock, until) == std::cv_status::timeout && !done_) {
          // Keep trying until the test ends: the reader may not be in open() yet.
          const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
          if (fd >= 0) {
            unblocked_.store(true);
            ::close(fd);
          }
          cv_.wait_for(lock, std::chrono::milliseconds(100));
        }
      }
    });
  }
  FifoWatchdog(const FifoWatchdog&) = delete;
  FifoWatchdog& operator=(const FifoWatchdog&) = delete;
  ~FifoWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool ok() const { return ok_; }
  // True when a reader had to be released: it blocked on the FIFO.
  bool had_to_unblock() const { return unblocked_.load(); }

 private:
  std::filesystem::path path_;
  bool ok_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> unblocked_{false};
  std::thread thread_;
};

}  // namespace test_support
