// save(): a Checkpoint as a torch.save zip. Layout and rules: save.hpp.
#include "safeckpt/save.hpp"

#include "save/pickler.hpp"
#include "save/zip_writer.hpp"

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
  return write_zip(write, ckpt, options, options.root_name.empty() ? "archive" : options.root_name);
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
  return write_file_atomically(path, options, [&](const std::function<Status(Bytes)>& write) {
    return write_zip(write, ckpt, options, root);
  });
}

}  // namespace safeckpt
