// torch.distributed.checkpoint directories in `inspect`, `scan` and `convert`
// (safeckpt/dcp.hpp). A path is a DCP directory when it is a directory
// holding a `.metadata` file.
#include "safeckpt/dcp.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "safeckpt/json.hpp"

namespace safeckpt::cli {
namespace {

std::string dims(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// One line of a non-tensor item's value (the loader's text view, first line).
std::string item_text(const DcpCheckpoint& c, const DcpBytesItem& b) {
  auto v = c.load_bytes_item(b);
  if (!v) return "<refused: " + v.error().to_string() + ">";
  TextOptions to;
  auto t = to_text(*v, to);
  if (!t) return "<" + t.error().to_string() + ">";
  // The value section of the text view: its last non-empty line.
  std::string s = *t;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const auto nl = s.rfind('\n');
  std::string line = nl == std::string::npos ? s : s.substr(nl + 1);
  line.erase(0, line.find_first_not_of(' '));
  constexpr std::string_view kRoot = "<root> = ";
  if (line.rfind(kRoot, 0) == 0) line.erase(0, kRoot.size());
  return line;
}

int refused(const std::string& what, const Error& e) {
  std::fprintf(stderr, "safeckpt: %s: %s\n  %s\n", what.c_str(), failure_word(e.code()), e.to_string().c_str());
  return is_policy_error(e.code()) ? 1 : 2;
}

}  // namespace

bool is_dcp_dir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::is_regular_file(std::filesystem::path(path) / ".metadata", ec);
}

int inspect_dcp(const std::string& dir, bool json) {
  auto r = DcpCheckpoint::open(dir);
  if (!r) return refused(dir, r.error());
  const DcpCheckpoint& c = *r;
  if (json) {
    nlohmann::json j;
    j["format"] = "dcp";
    j["version"] = c.version();
    j["files"] = nlohmann::json::array();
    for (const auto& f : c.files()) j["files"].push_back({{"name", f.name}, {"bytes", f.size}});
    j["tensors"] = nlohmann::json::array();
    for (const auto& t : c.tensors()) {
      nlohmann::json chunks = nlohmann::json::array();
      for (const auto& ch : t.chunks)
        chunks.push_back({{"offsets", ch.offsets},
                          {"sizes", ch.sizes},
                          {"file", c.files()[ch.file].name},
                          {"offset", ch.offset},
                          {"length", ch.length}});
      j["tensors"].push_back(
          {{"fqn", t.fqn}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"chunks", chunks}});
    }
    j["items"] = nlohmann::json::array();
    for (const auto& b : c.bytes_items())
      j["items"].push_back({{"fqn", b.fqn}, {"file", c.files()[b.file].name}, {"value", item_text(c, b)}});
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf(
      "%s: torch.distributed.checkpoint directory (metadata version %s), %zu tensors, %zu other items, %zu "
      "data files\n",
      dir.c_str(), c.version().empty() ? "none" : c.version().c_str(), c.tensors().size(), c.bytes_items().size(),
      c.files().size());
  for (const auto& f : c.files())
    std::printf("  file %s (%llu bytes)\n", f.name.c_str(), static_cast<unsigned long long>(f.size));
  std::printf("tensors:\n");
  for (const auto& t : c.tensors()) {
    std::printf("  %s  %s %s  %zu chunk%s\n", t.fqn.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                dims(t.shape).c_str(), t.chunks.size(), t.chunks.size() == 1 ? "" : "s");
    for (const auto& ch : t.chunks)
      std::printf("    at %s size %s  %s @%llu +%llu\n", dims(ch.offsets).c_str(), dims(ch.sizes).c_str(),
                  c.files()[ch.file].name.c_str(), static_cast<unsigned long long>(ch.offset),
                  static_cast<unsigned long long>(ch.length));
  }
  if (!c.bytes_items().empty()) std::printf("other items:\n");
  for (const auto& b : c.bytes_items())
    std::printf("  %s = %s  (%s)\n", b.fqn.c_str(), item_text(c, b).c_str(), c.files()[b.file].name.c_str());
  return 0;
}

namespace {
// The entries of `dir` that the DCP verdict does not cover (commands.hpp);
// `c` is the opened checkpoint, null when it did not open.
std::vector<std::string> other_entries(const std::string& dir, const DcpCheckpoint* c) {
  std::set<std::string> covered{".metadata"};
  if (c != nullptr)
    for (const auto& f : c->files()) covered.insert(f.name);
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (covered.count(name) != 0) continue;
    if (c == nullptr && name.size() > 7 && name.compare(name.size() - 7, 7, ".distcp") == 0) continue;
    out.push_back(it->path().string());
  }
  if (ec) out.push_back(dir);  // unlistable: the file scan reports it (fail closed)
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

int scan_dcp(const std::string& dir, bool quiet, std::vector<std::string>& others) {
  // Clean exactly when the loader accepts: the metadata, the layout, every
  // chunk payload and every byte item through the weights-only loader.
  auto r = DcpCheckpoint::open(dir);
  others = other_entries(dir, r ? &*r : nullptr);
  Status st;
  if (!r) st = unexpected(r.error());
  std::size_t chunks = 0;
  if (r) {
    for (const auto& t : r->tensors()) {
      for (const auto& ch : t.chunks) {
        auto ck = r->load_chunk(t, ch);
        if (!ck) {
          st = unexpected(std::move(ck).error());
          break;
        }
        ++chunks;
      }
      if (!st) break;
    }
    if (st)
      for (const auto& b : r->bytes_items()) {
        auto ck = r->load_bytes_item(b);
        if (!ck) {
          st = unexpected(std::move(ck).error());
          break;
        }
      }
  }
  if (!st) {
    if (st.error().code() == ErrorCode::kIo) {
      std::fprintf(stderr, "safeckpt scan: %s: not scanned: %s\n", dir.c_str(), st.error().to_string().c_str());
      return 2;
    }
    if (!quiet)
      std::printf("%s: DCP directory: FINDING (%s): %s\n", dir.c_str(),
                  std::string(error_code_name(st.error().code())).c_str(), st.error().to_string().c_str());
    return 1;
  }
  if (!quiet)
    std::printf("%s: DCP directory: clean (%zu tensors in %zu chunks, %zu other items, %zu files)\n", dir.c_str(),
                r->tensors().size(), chunks, r->bytes_items().size(), r->files().size());
  return 0;
}

int convert_dcp(const std::string& in, const std::string& out, bool force, bool fsync) {
  auto ends = [&](std::string_view e) {
    return out.size() >= e.size() && out.compare(out.size() - e.size(), e.size(), e) == 0;
  };
  const bool to_safetensors = ends(".safetensors");
  if (!to_safetensors && !ends(".pt") && !ends(".pth") && !ends(".bin") && !ends(".ckpt")) {
    std::fprintf(stderr,
                 "safeckpt convert: cannot tell the output format from %s (use .safetensors, or .pt/.pth/.bin/.ckpt "
                 "for a PyTorch checkpoint)\n",
                 out.c_str());
    return 2;
  }
  auto r = DcpCheckpoint::open(in);
  if (!r) return refused(in, r.error());
  DcpConvertOptions o;
  o.overwrite = force;
  o.fsync = fsync;
  std::vector<std::string> skipped;
  auto st = to_safetensors ? dcp_to_safetensors(*r, out, o, &skipped) : dcp_to_torch_save(*r, out, o);
  if (!st) {
    if (st.error().code() == ErrorCode::kExists) {
      std::fprintf(stderr, "safeckpt convert: %s exists; pass --force to replace it\n", out.c_str());
      return 2;
    }
    return refused(in, st.error());
  }
  for (const auto& s : skipped)
    std::fprintf(stderr, "note: non-tensor item '%s' is not written to safetensors\n", s.c_str());
  std::fprintf(stderr, "wrote %s (%zu tensors)\n", out.c_str(), r->tensors().size());
  return 0;
}

}  // namespace safeckpt::cli
