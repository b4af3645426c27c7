// Model walk and parallel hashing (sign.hpp: "Model walk"). The cost of
// signing and verifying is hashing: files are hashed in parallel and, with
// `shards`, the shards of one big file too. Reads are pread(2) of 8 MiB into
// page-aligned buffers (the size the loader's readers use for large
// sequential reads); SHA-256 is OpenSSL's (SHA-NI where the CPU has it).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "sign/internal.hpp"

namespace safeckpt::sign {
namespace {

constexpr std::size_t kReadBytes = 8u << 20;

struct Entry {
  std::string name;                 // resource path ("." for a single file)
  std::filesystem::path open_path;  // what to open (a symlink's resolved target)
  std::uint64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool via_symlink = false;
};

struct Task {
  std::size_t entry = 0;
  std::uint64_t start = 0;
  std::uint64_t end = 0;
};

Unexpected io_error(const std::string& what, const std::filesystem::path& p, int err) {
  return make_error(ErrorCode::kIo, what + " " + p.string() + ": " + std::strerror(err));
}

bool ignored(const std::string& rel, const std::vector<std::string>& ignore) {
  for (const std::string& p : ignore) {
    if (rel == p) return true;
    if (rel.size() > p.size() && rel.compare(0, p.size(), p) == 0 && rel[p.size()] == '/') return true;
  }
  return false;
}

bool inside(const std::filesystem::path& root, const std::filesystem::path& p) {
  const std::string r = root.string();
  const std::string s = p.string();
  return s.size() > r.size() && s.compare(0, r.size(), r) == 0 && (r.back() == '/' || s[r.size()] == '/');
}

// Resolves an allowed symlink to a regular file inside the model.
Status resolve_link(const std::filesystem::path& root_canon, const std::filesystem::path& link, Entry& e) {
  std::error_code ec;
  std::filesystem::path target = std::filesystem::canonical(link, ec);
  if (ec)
    return make_error(ErrorCode::kUnsupported, "symlink " + e.name + ": cannot be resolved (" + ec.message() + ")");
  if (!inside(root_canon, target))
    return make_error(ErrorCode::kUnsupported,
                      "symlink " + e.name + " points out of the model (to " + target.string() + "): never followed");
  struct stat st {};
  if (::stat(target.c_str(), &st) != 0) return io_error("stat", target, errno);
  if (!S_ISREG(st.st_mode))
    return make_error(ErrorCode::kUnsupported, "symlink " + e.name + " does not point to a regular file");
  e.open_path = target;
  e.size = static_cast<std::uint64_t>(st.st_size);
  e.dev = st.st_dev;
  e.ino = st.st_ino;
  e.via_symlink = true;
  return {};
}

Result<std::vector<Entry>> walk(const std::filesystem::path& model, const HashOptions& opt) {
  struct stat st {};
  if (::lstat(model.c_str(), &st) != 0) return io_error("cannot read model", model, errno);
  std::vector<Entry> out;
  if (S_ISLNK(st.st_mode)) {
    if (!opt.allow_symlinks)
      return make_error(ErrorCode::kUnsupported, "model path " + model.string() + " is a symlink (not allowed)");
    if (::stat(model.c_str(), &st) != 0) return io_error("cannot read model", model, errno);
  }
  if (S_ISREG(st.st_mode)) {
    Entry e{".", model, static_cast<std::uint64_t>(st.st_size), st.st_dev, st.st_ino, false};
    out.push_back(std::move(e));
    return out;
  }
  if (!S_ISDIR(st.st_mode))
    return make_error(ErrorCode::kUnsupported, "model " + model.string() + " is neither a file nor a directory");
  std::error_code ec;
  const std::filesystem::path root_canon = std::filesystem::canonical(model, ec);
  if (ec) return make_error(ErrorCode::kIo, "cannot resolve model " + model.string() + ": " + ec.message());
  std::vector<std::pair<std::string, std::uint32_t>> stack{{"", 0}};  // explicit stack: no recursion
  while (!stack.empty()) {
    auto [dir_rel, depth] = stack.back();
    stack.pop_back();
    const std::filesystem::path dir = dir_rel.empty() ? model : model / dir_rel;
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return io_error("cannot list", dir, errno);
    while (dirent* de = ::readdir(d.get())) {
      const std::string n = de->d_name;
      if (n == "." || n == "..") continue;
      const std::string rel = dir_rel.empty() ? n : dir_rel + "/" + n;
      if (ignored(rel, opt.ignore_paths)) continue;
      if (!valid_utf8(n)) return make_error(ErrorCode::kMalformed, "file name in " + dir.string() + " is not UTF-8");
      const std::filesystem::path p = dir / n;
      struct stat es {};
      if (::lstat(p.c_str(), &es) != 0) return io_error("cannot stat", p, errno);
      if (S_ISDIR(es.st_mode)) {
        if (depth + 1 > opt.limits.max_dir_depth)
          return make_error(ErrorCode::kLimitExceeded,
                            "model: directories nested deeper than " + std::to_string(opt.limits.max_dir_depth));
        stack.emplace_back(rel, depth + 1);
        continue;
      }
      if (out.size() >= opt.limits.max_files)
        return make_error(ErrorCode::kLimitExceeded,
                          "model: more than " + std::to_string(opt.limits.max_files) + " files");
      Entry e{rel, p, static_cast<std::uint64_t>(es.st_size), es.st_dev, es.st_ino, false};
      if (S_ISLNK(es.st_mode)) {
        if (!opt.allow_symlinks)
          return make_error(ErrorCode::kUnsupported, "symlink " + rel + " in the model (symlinks are not allowed)");
        SAFECKPT_CHECK(resolve_link(root_canon, p, e));
      } else if (!S_ISREG(es.st_mode)) {
        return make_error(ErrorCode::kUnsupported, rel + " is not a regular file, directory or symlink");
      }
      out.push_back(std::move(e));
    }
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return out;
}

// Hashes [start, end) of an entry; checks the file is the one walked and did
// not change while read.
Result<std::string> hash_range(const Entry& e, std::uint64_t start, std::uint64_t end, const std::string& hash_type,
                               std::uint8_t* buf) {
  int fd = ::open(e.open_path.c_str(), O_RDONLY | O_CLOEXEC | (e.via_symlink ? 0 : O_NOFOLLOW));
  if (fd < 0) return io_error("cannot open", e.open_path, errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat before {};
  if (::fstat(fd, &before) != 0) return io_error("fstat", e.open_path, errno);
  if (before.st_ino != e.ino || before.st_dev != e.dev || static_cast<std::uint64_t>(before.st_size) != e.size)
    return make_error(ErrorCode::kIo, "model file " + e.name + " changed while hashing (replaced or resized)");
  Hasher h(hash_type);
  if (!h.ok()) return make_error(ErrorCode::kUnsupported, "hash_type " + hash_type + " is not supported here");
  std::uint64_t off = start;
  while (off < end) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kReadBytes, end - off));
    ssize_t n = ::pread(fd, buf, want, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("read", e.open_path, errno);
    if (n == 0)
      return make_error(ErrorCode::kIo, "model file " + e.name + " changed while hashing (shorter than its size)");
    h.update(buf, static_cast<std::size_t>(n));
    off += static_cast<std::uint64_t>(n);
  }
  struct stat after {};
  if (::fstat(fd, &after) != 0) return io_error("fstat", e.open_path, errno);
  if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != before.st_mtim.tv_nsec)
    return make_error(ErrorCode::kIo, "model file " + e.name + " changed while hashing (modified)");
  return h.finish_hex();
}

unsigned thread_count(unsigned requested, std::size_t tasks) {
  unsigned t = requested != 0 ? requested : std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::min<std::size_t>(t, std::max<std::size_t>(tasks, 1)));
}

std::vector<Task> make_tasks(const std::vector<std::uint64_t>& sizes, Method method, std::uint64_t shard) {
  std::vector<Task> tasks;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (method == Method::kFiles) {
      tasks.push_back({i, 0, sizes[i]});
      continue;
    }
    for (std::uint64_t s = 0; s < sizes[i]; s += std::min(shard, sizes[i] - s))
      tasks.push_back({i, s, std::min(sizes[i], s + shard)});  // empty files: no shard (OMS §2.4)
  }
  return tasks;
}

std::string resource_name(const std::string& path, const Task& t, Method method) {
  if (method == Method::kFiles) return path;
  return path + ":" + std::to_string(t.start) + ":" + std::to_string(t.end);
}

std::string algorithm_name(const HashOptions& opt) {
  return opt.method == Method::kFiles ? opt.hash_type : opt.hash_type + "-sharded-" + std::to_string(opt.shard_size);
}

// Runs `work(task_index, buffer)` on a pool; the first error wins.
Status run_pool(std::size_t n_tasks, unsigned threads, bool need_buffer,
                const std::function<Status(std::size_t, std::uint8_t*)>& work) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;
  auto worker = [&] {
    std::unique_ptr<std::uint8_t, decltype(&std::free)> buf(
        need_buffer ? static_cast<std::uint8_t*>(std::aligned_alloc(4096, kReadBytes)) : nullptr, &std::free);
    if (need_buffer && !buf) {
      std::lock_guard<std::mutex> g(mu);
      if (first) first = make_error(ErrorCode::kLimitExceeded, "out of memory for read buffers");
      failed = true;
      return;
    }
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      std::size_t i = next.fetch_add(1);
      if (i >= n_tasks) return;
      Status s = work(i, buf.get());
      if (!s) {
        std::lock_guard<std::mutex> g(mu);
        if (first) first = std::move(s);
        failed = true;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  return first;
}

}  // namespace

Result<std::vector<Resource>> hash_model(const std::filesystem::path& model, const HashOptions& opt) {
  if (opt.hash_type != "sha256" && opt.hash_type != "blake2b")
    return make_error(ErrorCode::kUnsupported,
                      "hash_type " + opt.hash_type + ": only sha256 and blake2b are supported");
  if (opt.method == Method::kShards && opt.shard_size == 0)
    return make_error(ErrorCode::kInvalidArgument, "shard size 0");
  SAFECKPT_TRY(std::vector<Entry> entries, walk(model, opt));
  if (opt.only) {
    std::set<std::string> keep(opt.only->begin(), opt.only->end());
    std::erase_if(entries, [&](const Entry& e) { return keep.count(e.name) == 0; });
  }
  std::vector<std::uint64_t> sizes;
  sizes.reserve(entries.size());
  for (const Entry& e : entries) sizes.push_back(e.size);
  std::vector<Task> tasks = make_tasks(sizes, opt.method, opt.shard_size);
  // Largest first, so one huge file does not start last.
  std::vector<std::size_t> order(tasks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return tasks[a].end - tasks[a].start > tasks[b].end - tasks[b].start;
  });
  std::vector<std::string> digests(tasks.size());
  SAFECKPT_CHECK(run_pool(
      tasks.size(), thread_count(opt.threads, tasks.size()), true, [&](std::size_t k, std::uint8_t* buf) -> Status {
        const Task& t = tasks[order[k]];
        SAFECKPT_TRY(digests[order[k]], hash_range(entries[t.entry], t.start, t.end, opt.hash_type, buf));
        return {};
      }));
  std::vector<Resource> out;
  out.reserve(tasks.size());
  const std::string alg = algorithm_name(opt);
  for (std::size_t i = 0; i < tasks.size(); ++i)
    out.push_back({resource_name(entries[tasks[i].entry].name, tasks[i], opt.method), alg, std::move(digests[i])});
  return out;
}

std::vector<Resource> hash_bytes(Bytes data, const std::string& name, const HashOptions& opt) {
  std::vector<Task> tasks =
      make_tasks({data.size()}, opt.method, opt.shard_size == 0 ? data.size() + 1 : opt.shard_size);
  std::vector<std::string> digests(tasks.size());
  Status s = run_pool(tasks.size(), thread_count(opt.threads, tasks.size()), false,
                      [&](std::size_t k, std::uint8_t*) -> Status {
                        Hasher h(opt.hash_type);
                        if (!h.ok()) return make_error(ErrorCode::kUnsupported, "hash_type " + opt.hash_type);
                        h.update(data.data() + tasks[k].start, static_cast<std::size_t>(tasks[k].end - tasks[k].start));
                        digests[k] = h.finish_hex();
                        return {};
                      });
  std::vector<Resource> out;
  if (!s) return out;
  out.reserve(tasks.size());
  const std::string alg = algorithm_name(opt);
  for (std::size_t i = 0; i < tasks.size(); ++i)
    out.push_back({resource_name(name, tasks[i], opt.method), alg, digests[i]});
  return out;
}

}  // namespace safeckpt::sign
