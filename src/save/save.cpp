// save(): a Checkpoint as a torch.save zip. Layout and rules: save.hpp.
#include "safeckpt/save.hpp"

#include <algorithm>
#include <iterator>
#include <string>

#include "save/pickler.hpp"
#include "save/zip_writer.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

Status check_options(const SaveOptions& o) {
  const auto a = o.storage_alignment;
  if (a == 0 || a > 65536 || (a & (a - 1)) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "save: storage_alignment must be a power of two in [1, 65536], got " + std::to_string(a));
  if (o.root_name.find('/') != std::string::npos || o.root_name.find('\\') != std::string::npos)
    return make_error(ErrorCode::kInvalidArgument, "save: root_name must not contain '/' or '\\'");
  return {};
}

Status write_zip(const std::function<Status(Bytes)>& write, const Checkpoint& ckpt, const SaveOptions& o,
                 const std::string& root) {
  SAFECKPT_CHECK(check_options(o));
  PickleWriteOptions po;
  po.weights_only_compatible = o.weights_only_compatible;
  po.force_location = o.force_location;
  SAFECKPT_TRY(TorchPickle pk, write_torch_pickle(ckpt, po));
  ZipWriter zip(write, root, o.storage_alignment, o.compute_crc32);
  auto text = [](std::string_view s) { return Bytes(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()); };
  SAFECKPT_CHECK(zip.add("data.pkl", Bytes(pk.bytes.data(), pk.bytes.size())));
  // torch >= 2.7 order (serialization.py _save): format version 1 promises
  // storages data/0..N-1 back to back in miniz's layout, which we write.
  SAFECKPT_CHECK(zip.add(".format_version", text("1")));
  const std::string align = std::to_string(o.storage_alignment);
  SAFECKPT_CHECK(zip.add(".storage_alignment", text(align)));
  SAFECKPT_CHECK(zip.add("byteorder", text("little")));
  const auto& storages = ckpt.storages();
  for (std::size_t k = 0; k < pk.storages.size(); ++k) {
    const StorageInfo& s = storages[pk.storages[k]];
    if (s.bytes.size() != s.nbytes)
      return make_error(ErrorCode::kInternal, "save: storage " + s.key + " has " + std::to_string(s.bytes.size()) +
                                                  " bytes, expected " + std::to_string(s.nbytes));
    SAFECKPT_CHECK(zip.add("data/" + std::to_string(k), s.bytes));
  }
  SAFECKPT_CHECK(zip.add("version", text("3\n")));
  return zip.finish();
}

// ---- legacy format (torch/serialization.py _legacy_save) ----

// The three header pickles exactly as Python's pickle writes them with
// protocol 2: MAGIC_NUMBER (LONG1), PROTOCOL_VERSION 1001, and sys_info
// {'protocol_version': 1001, 'little_endian': True, 'type_sizes':
// {'short': 2, 'int': 4, 'long': 4}} (serialization.py's constants).
// tests/save/test_save_legacy.cpp compares them with files PyTorch wrote.
void legacy_header(std::vector<std::uint8_t>& out) {
  static constexpr std::uint8_t kMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                            0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
  static constexpr std::uint8_t kProtocol[] = {0x80, 0x02, 'M', 0xe9, 0x03, '.'};
  out.insert(out.end(), std::begin(kMagic), std::end(kMagic));
  out.insert(out.end(), std::begin(kProtocol), std::end(kProtocol));
  std::uint8_t memo = 0;
  auto put = [&] {
    out.push_back('q');
    out.push_back(memo++);
  };
  auto str = [&](std::string_view t) {
    out.push_back('X');
    util::append_le(out, static_cast<std::uint32_t>(t.size()));
    out.insert(out.end(), t.begin(), t.end());
    put();
  };
  auto small_int = [&](std::uint8_t v) {
    out.push_back('K');
    out.push_back(v);
  };
  out.insert(out.end(), {0x80, 0x02, '}'});
  put();
  out.push_back('(');
  str("protocol_version");
  out.insert(out.end(), {'M', 0xe9, 0x03});
  str("little_endian");
  out.push_back(0x88);  // NEWTRUE: we write little-endian storages on every host
  str("type_sizes");
  out.push_back('}');
  put();
  out.push_back('(');
  str("short");
  small_int(2);
  str("int");
  small_int(4);
  str("long");
  small_int(4);
  out.insert(out.end(), {'u', 'u', '.'});
}

// The storage-keys pickle: a list of str as CPython's C pickler writes it
// (batch_list_exact: APPEND only for a one-item list, else MARK ... APPENDS
// in batches of 1000).
std::vector<std::uint8_t> legacy_key_list(const std::vector<std::string>& keys) {
  std::vector<std::uint8_t> out = {0x80, 0x02, ']'};
  std::uint32_t memo = 0;
  auto put = [&] {
    if (memo < 256) {
      out.push_back('q');
      out.push_back(static_cast<std::uint8_t>(memo));
    } else {
      out.push_back('r');
      util::append_le(out, memo);
    }
    ++memo;
  };
  put();
  for (std::size_t b = 0; b < keys.size(); b += 1000) {
    const std::size_t n = std::min<std::size_t>(1000, keys.size() - b);
    const bool single = keys.size() == 1;
    if (!single) out.push_back('(');
    for (std::size_t i = b; i < b + n; ++i) {
      out.push_back('X');
      util::append_le(out, static_cast<std::uint32_t>(keys[i].size()));
      out.insert(out.end(), keys[i].begin(), keys[i].end());
      put();
    }
    out.push_back(single ? 'a' : 'e');
  }
  out.push_back('.');
  return out;
}

// Legacy layout (docs/torch-format.md §3.1): header pickles, the object
// pickle, the sorted storage keys, then per key the u64 element count and
// the storage bytes. Keys are "0".."N-1" in first-use order (torch uses
// addresses; any distinct strings load) and, as in torch, the data follows
// the keys in string order.
Status write_legacy(const std::function<Status(Bytes)>& write, const Checkpoint& ckpt, const SaveOptions& o) {
  SAFECKPT_CHECK(check_options(o));
  PickleWriteOptions po;
  po.weights_only_compatible = o.weights_only_compatible;
  po.force_location = o.force_location;
  po.legacy_format = true;
  SAFECKPT_TRY(TorchPickle pk, write_torch_pickle(ckpt, po));
  const auto& storages = ckpt.storages();
  for (std::uint32_t idx : pk.storages)  // before writing anything
    if (storages[idx].bytes.size() != storages[idx].nbytes)
      return make_error(ErrorCode::kInternal, "save: storage " + storages[idx].key + " has " +
                                                  std::to_string(storages[idx].bytes.size()) + " bytes, expected " +
                                                  std::to_string(storages[idx].nbytes));
  std::vector<std::uint8_t> head;
  legacy_header(head);
  head.insert(head.end(), pk.bytes.begin(), pk.bytes.end());
  std::vector<std::string> keys;
  for (std::size_t k = 0; k < pk.storages.size(); ++k) keys.push_back(std::to_string(k));
  std::sort(keys.begin(), keys.end());
  const auto list = legacy_key_list(keys);
  head.insert(head.end(), list.begin(), list.end());
  SAFECKPT_CHECK(write(Bytes(head.data(), head.size())));
  for (const std::string& key : keys) {
    const std::size_t k = std::stoul(key);
    const StorageInfo& s = storages[pk.storages[k]];
    // THPStorage_writeFileRaw: int64 numel in the storage's dtype, then the bytes.
    const std::uint64_t numel = pk.numels[k];
    std::uint8_t count[8];
    util::store_le(count, numel);
    SAFECKPT_CHECK(write(Bytes(count, 8)));
    SAFECKPT_CHECK(write(s.bytes));
  }
  return {};
}

Status write_any(const std::function<Status(Bytes)>& write, const Checkpoint& ckpt, const SaveOptions& o,
                 const std::string& root) {
  return o.legacy_format ? write_legacy(write, ckpt, o) : write_zip(write, ckpt, o, root);
}

}  // namespace

std::string torch_archive_root(const std::filesystem::path& path) {
  // caffe2/serialize/inline_container.cc basename(): text after the last
  // '/' or '\\', without its last extension.
  const std::string name = path.string();
  std::size_t start = 0;
  for (std::size_t i = 0; i < name.size(); ++i)
    if (name[i] == '/' || name[i] == '\\') start = i + 1;
  std::size_t end = name.size();
  for (std::size_t i = end; i > start; --i)
    if (name[i - 1] == '.') {
      end = i - 1;
      break;
    }
  std::string base = name.substr(start, end - start);
  bool ascii = true;
  for (unsigned char c : name)
    if (c >= 0x80) ascii = false;
  // Python writes non-ASCII paths through a stream writer: root "archive".
  if (base.empty() || !ascii) return "archive";
  return base;
}

Status save_to_writer(const std::function<Status(Bytes)>& write, const Checkpoint& ckpt, const SaveOptions& options) {
  return write_any(write, ckpt, options, options.root_name.empty() ? "archive" : options.root_name);
}

Result<std::vector<std::uint8_t>> save_to_bytes(const Checkpoint& ckpt, const SaveOptions& options) {
  std::vector<std::uint8_t> out;
  SAFECKPT_CHECK(save_to_writer(
      [&out](Bytes b) -> Status {
        out.insert(out.end(), b.begin(), b.end());
        return {};
      },
      ckpt, options));
  return out;
}

Status save(const std::filesystem::path& path, const Checkpoint& ckpt, const SaveOptions& options) {
  SAFECKPT_CHECK(check_options(options));
  const std::string root = options.root_name.empty() ? torch_archive_root(path) : options.root_name;
  return write_file_atomically(
      path, options, [&](const std::function<Status(Bytes)>& write) { return write_any(write, ckpt, options, root); });
}

}  // namespace safeckpt
