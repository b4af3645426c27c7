// torch.distributed.checkpoint directories in `inspect` and `convert`
// (safeckpt/dcp.hpp; safeckpt::is_dcp_directory says which paths are one).
// `scan` reports them through the scanner (scan::scan_dcp_dir).
#include "safeckpt/dcp.hpp"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
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
std::string item_text(const Checkpoint& v) {
  TextOptions to;
  auto t = to_text(v, to);
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

int inspect_dcp(const std::string& dir, bool json) {
  auto r = DcpCheckpoint::open(dir);
  if (!r) return refused(dir, r.error());
  const DcpCheckpoint& c = *r;
  // Every payload through the reader (one tensor of the metadata's dtype and
  // the chunk's shape; items through the weights-only loader), as `scan` and
  // `convert` read them: the listing is never shown as a checkpoint that
  // does not load.
  std::size_t checked = 0;
  for (const auto& t : c.tensors())
    for (const auto& ch : t.chunks) {
      if (auto p = c.load_chunk(t, ch); !p) return refused(dir, p.error());
      ++checked;
    }
  std::vector<Checkpoint> items;  // read once: checked here, shown below
  items.reserve(c.bytes_items().size());
  for (const auto& b : c.bytes_items()) {
    auto p = c.load_bytes_item(b);
    if (!p) return refused(dir, p.error());
    items.push_back(std::move(*p));
  }
  if (json) {
    nlohmann::json j;
    j["format"] = "dcp";
    j["version"] = c.version();
    j["payloads_checked"] = checked + items.size();
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
    for (std::size_t i = 0; i < items.size(); ++i) {
      const DcpBytesItem& b = c.bytes_items()[i];
      j["items"].push_back({{"fqn", b.fqn}, {"file", c.files()[b.file].name}, {"value", item_text(items[i])}});
    }
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
  for (std::size_t i = 0; i < items.size(); ++i) {
    const DcpBytesItem& b = c.bytes_items()[i];
    std::printf("  %s = %s  (%s)\n", b.fqn.c_str(), item_text(items[i]).c_str(), c.files()[b.file].name.c_str());
  }
  std::printf("payloads: %zu chunks and %zu items read and checked against the metadata\n", checked, items.size());
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
