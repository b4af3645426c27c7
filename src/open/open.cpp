// safeckpt::open — the format dispatcher (include/safeckpt/open.hpp).
// It sits above the checkpoint and safetensors layers (it calls both), so it
// is a layer of its own; the sniffing itself is src/container/detect.cpp.
#include "safeckpt/open.hpp"

#include <system_error>

#include "safeckpt/dcp.hpp"
#include "safeckpt/safetensors_reader.hpp"

namespace safeckpt {

Result<Checkpoint> open(const std::filesystem::path& path, const LoadOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // A torch.distributed.checkpoint directory (safeckpt/dcp.hpp), consolidated.
    if (!std::filesystem::exists(path / ".metadata", ec))
      return make_error(
          ErrorCode::kUnsupported,
          path.string() + " is a directory without a .metadata file (not a torch.distributed.checkpoint)");
    DcpOptions d;
    d.limits = options.limits;
    d.verify_storage_crc = options.verify_storage_crc;
    d.allowlist = options.allowlist;
    SAFECKPT_TRY(DcpCheckpoint c, DcpCheckpoint::open(path, d));
    return dcp_to_checkpoint(c, std::filesystem::temp_directory_path(ec));
  }
  SAFECKPT_TRY(MappedFile f, MappedFile::open(path));
  return open_file(std::move(f), options);
}

Result<Checkpoint> open_file(MappedFile file, const LoadOptions& options) {
  SafetensorsOptions so;
  so.limits = options.limits;
  const FileFormat f = sniff_format(file.bytes());
  if (options.verify_bytes && (f == FileFormat::kSafetensors || f == FileFormat::kSafetensorsIndex)) {
    if (f == FileFormat::kSafetensorsIndex)
      return make_error(ErrorCode::kUnsupported,
                        "verify-then-load of a sharded safetensors index: load and verify each shard file instead");
    // Verify-then-load: the mapping hashed here is the one parsed below.
    auto v = options.verify_bytes(file.bytes(), file.path());
    if (!v) return unexpected(std::move(v).error().at_record(file.path().string()));
  }
  switch (f) {
    case FileFormat::kSafetensors: return load_safetensors_file(std::move(file), so);
    case FileFormat::kSafetensorsIndex: return load_safetensors_index_file(std::move(file), so);
    default: return load_file(std::move(file), options);  // zip (PT2/TorchScript refused there), legacy, pickle
  }
}

}  // namespace safeckpt
