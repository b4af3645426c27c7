// safetensors writer: the reference layout (huggingface/safetensors
// tensor.rs `prepare`), deterministic. See safetensors_writer.hpp.
#include <algorithm>
#include <limits>
#include <set>

#include "safeckpt/safetensors_writer.hpp"
#include "safetensors/internal.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

Unexpected invalid(std::string msg) {
  return make_error(ErrorCode::kInvalidArgument, "safetensors: " + std::move(msg));
}

// serde_json's string escaping: \" \\ \b \f \n \r \t, other controls as
// \u00xx (lower-case hex); everything else, non-ASCII included, verbatim.
void json_string(std::string& out, std::string_view s) {
  util::append_json_string(out, s, util::JsonControls::kSerde);
}

}  // namespace

Result<std::vector<std::uint8_t>> safetensors_header(std::vector<SafetensorsEntry>& entries,
                                                     const std::vector<std::pair<std::string, std::string>>& metadata,
                                                     bool with_metadata) {
  std::set<std::string> names;
  for (const auto& e : entries) {
    if (e.name.empty() || e.name == "__metadata__") return invalid("invalid tensor name \"" + e.name + "\"");
    if (!util::valid_utf8(e.name)) return invalid("tensor name is not valid UTF-8");
    if (!names.insert(e.name).second) return invalid("duplicate tensor name \"" + e.name + "\"");
    const std::uint32_t bits = safetensors_dtype_bits(e.dtype);
    if (bits == 0) return invalid("unknown dtype \"" + e.dtype + "\" for \"" + e.name + "\"");
    std::uint64_t numel = 1;
    bool zero = false;
    for (auto d : e.shape) {
      if (d == 0)
        zero = true;
      else if (numel > std::numeric_limits<std::uint64_t>::max() / d)
        return invalid("shape of \"" + e.name + "\" overflows");
      else
        numel *= d;
    }
    if (zero) numel = 0;
    if (numel > std::numeric_limits<std::uint64_t>::max() / bits || (numel * bits) % 8 != 0 ||
        numel * bits / 8 != e.data.size())
      return invalid("\"" + e.name + "\": " + std::to_string(e.data.size()) + " bytes do not match dtype " + e.dtype +
                     " and its shape");
  }
  // Reference order: dtype (enum order) descending, then name ascending.
  std::stable_sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    int ra = safetensors_dtype_rank(a.dtype), rb = safetensors_dtype_rank(b.dtype);
    if (ra != rb) return ra > rb;
    return a.name < b.name;
  });
  std::string h = "{";
  bool first = true;
  if (with_metadata) {
    // Caller's order (deterministic; parse -> serialize keeps a file's bytes).
    const auto& md = metadata;
    std::set<std::string> keys;
    for (const auto& kv : md)
      if (!keys.insert(kv.first).second) return invalid("duplicate __metadata__ key \"" + kv.first + "\"");
    h += "\"__metadata__\":{";
    for (std::size_t i = 0; i < md.size(); ++i) {
      if (!util::valid_utf8(md[i].first) || !util::valid_utf8(md[i].second))
        return invalid("metadata is not valid UTF-8");
      if (i) h.push_back(',');
      json_string(h, md[i].first);
      h.push_back(':');
      json_string(h, md[i].second);
    }
    h += "}";
    first = false;
  }
  std::uint64_t offset = 0;
  for (const auto& e : entries) {
    if (!first) h.push_back(',');
    first = false;
    json_string(h, e.name);
    h += ":{\"dtype\":";
    json_string(h, e.dtype);
    h += ",\"shape\":[";
    for (std::size_t i = 0; i < e.shape.size(); ++i) {
      if (i) h.push_back(',');
      h += std::to_string(e.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.data.size()) + "]}";
    offset += e.data.size();
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> out(8 + h.size());
  const std::uint64_t n = h.size();
  util::store_le(out.data(), n);
  std::copy(h.begin(), h.end(), out.begin() + 8);
  return out;
}

namespace {
Status stream(const std::function<Status(Bytes)>& write, std::vector<SafetensorsEntry>& entries,
              const std::vector<std::pair<std::string, std::string>>& metadata, bool with_metadata) {
  SAFECKPT_TRY(std::vector<std::uint8_t> header, safetensors_header(entries, metadata, with_metadata));
  SAFECKPT_CHECK(write(Bytes(header.data(), header.size())));
  for (const auto& e : entries)
    if (!e.data.empty()) SAFECKPT_CHECK(write(e.data));
  return {};
}
}  // namespace

Result<std::vector<std::uint8_t>> serialize_safetensors(
    std::vector<SafetensorsEntry> entries, const std::vector<std::pair<std::string, std::string>>& metadata,
    bool with_metadata) {
  std::vector<std::uint8_t> out;
  SAFECKPT_CHECK(stream(
      [&out](Bytes b) -> Status {
        out.insert(out.end(), b.begin(), b.end());
        return {};
      },
      entries, metadata, with_metadata));
  return out;
}

Status save_safetensors(const std::filesystem::path& path, std::vector<SafetensorsEntry> entries,
                        const std::vector<std::pair<std::string, std::string>>& metadata, bool with_metadata,
                        const SaveOptions& options) {
  return write_file_atomically(path, options, [&](const std::function<Status(Bytes)>& write) {
    return stream(write, entries, metadata, with_metadata);
  });
}

}  // namespace safeckpt
