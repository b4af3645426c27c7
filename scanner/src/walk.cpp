// Expanding command-line paths into files. Every file is examined whatever
// its extension (routing by extension is how CVE-2025-10155 won); globs are
// the user's explicit choice. No recursion on the directory tree: an explicit
// stack. Symlinks inside directories are skipped unless follow_symlinks; when
// followed, directories already visited (device, inode) are not entered again
// (no loops). A directory holding `.metadata` (safeckpt::is_dcp_directory)
// is also listed as a DCP checkpoint; scan_walk scans it as one report and
// the files it covers not again.
#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <system_error>
#include <utility>

#include "safeckpt/dcp.hpp"
#include "safeckpt/scan.hpp"

namespace safeckpt::scan {
namespace {

bool glob_match(const std::vector<std::string>& globs, const std::string& rel, const std::string& base) {
  for (const auto& g : globs) {
    if (fnmatch(g.c_str(), rel.c_str(), 0) == 0 || fnmatch(g.c_str(), base.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

WalkResult expand_paths(const std::vector<std::filesystem::path>& paths, const WalkOptions& options) {
  namespace fs = std::filesystem;
  WalkResult out;
  std::set<std::pair<dev_t, ino_t>> visited;
  for (const fs::path& root : paths) {
    struct stat st {};
    if (::stat(root.c_str(), &st) != 0) {
      std::error_code ec(errno, std::generic_category());
      out.errors.push_back({root.string(), ec.message()});
      continue;
    }
    if (S_ISREG(st.st_mode)) {
      out.files.push_back(root);
      out.named_files.push_back(root);
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      out.errors.push_back({root.string(), "not a regular file or directory"});
      continue;
    }
    visited.insert({st.st_dev, st.st_ino});
    if (is_dcp_directory(root)) out.dcp_dirs.push_back(root);
    std::vector<fs::path> stack{root};
    std::vector<fs::path> found;
    // The globs, on the path relative to `root` and on the name.
    auto selected = [&](const fs::path& p) {
      const std::string rel = p.lexically_relative(root).generic_string();
      const std::string base = p.filename().string();
      if (!options.include.empty() && !glob_match(options.include, rel, base)) return false;
      return !glob_match(options.exclude, rel, base);
    };
    while (!stack.empty()) {
      fs::path dir = std::move(stack.back());
      stack.pop_back();
      std::error_code ec;
      fs::directory_iterator it(dir, ec), end;
      if (ec) {
        out.errors.push_back({dir.string(), ec.message()});
        continue;
      }
      std::vector<fs::path> entries;
      for (; it != end; it.increment(ec)) {
        if (ec) break;
        entries.push_back(it->path());
      }
      if (ec) out.errors.push_back({dir.string(), ec.message()});
      std::sort(entries.begin(), entries.end());
      std::vector<fs::path> subdirs;
      for (const fs::path& p : entries) {
        struct stat ls {};
        if (::lstat(p.c_str(), &ls) != 0) {
          std::error_code e2(errno, std::generic_category());
          out.errors.push_back({p.string(), e2.message()});
          continue;
        }
        struct stat ts = ls;
        if (S_ISLNK(ls.st_mode)) {
          if (!options.follow_symlinks) {
            out.skipped.push_back({p.string(), "symlink not followed (use --follow-symlinks)"});
            continue;
          }
          if (::stat(p.c_str(), &ts) != 0) {
            std::error_code e2(errno, std::generic_category());
            out.errors.push_back({p.string(), e2.message()});
            continue;
          }
        }
        if (S_ISDIR(ts.st_mode)) {
          if (!visited.insert({ts.st_dev, ts.st_ino}).second) {
            out.skipped.push_back({p.string(), "directory already visited (symlink loop)"});
            continue;
          }
          subdirs.push_back(p);
          if (is_dcp_directory(p) && selected(p)) out.dcp_dirs.push_back(p);
        } else if (S_ISREG(ts.st_mode)) {
          if (selected(p)) found.push_back(p);
        } else {
          out.skipped.push_back({p.string(), "not a regular file"});
        }
      }
      // Depth-first in sorted order: push subdirectories reversed.
      for (auto r = subdirs.rbegin(); r != subdirs.rend(); ++r) stack.push_back(*r);
    }
    std::sort(found.begin(), found.end());
    out.files.insert(out.files.end(), found.begin(), found.end());
  }
  return out;
}

std::vector<FileReport> scan_walk(const WalkResult& walk, const ScanOptions& options, const ScanProgress& progress) {
  namespace fs = std::filesystem;
  std::vector<FileReport> reports;
  reports.reserve(walk.dcp_dirs.size() + walk.files.size() + walk.errors.size());
  std::set<fs::path> covered;
  std::size_t done = 0;
  std::set<std::pair<dev_t, ino_t>> scanned;
  for (const fs::path& dir : walk.dcp_dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && !scanned.insert({st.st_dev, st.st_ino}).second)
      continue;  // named and found: once
    if (progress) progress(++done, walk.dcp_dirs.size() + walk.files.size(), dir.string());
    std::vector<fs::path> mine;
    reports.push_back(scan_dcp_dir(dir, options, &mine));
    for (const fs::path& p : mine) covered.insert(p.lexically_normal());
  }
  std::vector<const fs::path*> rest;
  // A file named on the command line always gets its own report; one path
  // spelled twice (`x` and `./x`, or named and found again under a named
  // directory) gets one. Distinct names of one inode (hard links, followed
  // symlinks) each keep theirs: the report names the path.
  std::set<fs::path> named, seen;
  for (const fs::path& f : walk.named_files) named.insert(f.lexically_normal());
  for (const fs::path& f : walk.files) {
    const fs::path normal = f.lexically_normal();
    if (!seen.insert(normal).second) continue;
    if (covered.count(normal) == 0 || named.count(normal) != 0) rest.push_back(&f);
  }
  for (const fs::path* f : rest) {
    if (progress) progress(++done, walk.dcp_dirs.size() + rest.size(), f->string());
    reports.push_back(scan_file(*f, options));
  }
  for (const auto& e : walk.errors) reports.push_back(unscanned_report(e.path, e.reason));
  return reports;
}

}  // namespace safeckpt::scan
