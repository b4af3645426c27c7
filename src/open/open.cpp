// safeckpt::open — the format dispatcher (include/safeckpt/open.hpp).
// It sits above the checkpoint and safetensors layers (it calls both), so it
// is a layer of its own; the sniffing itself is src/container/detect.cpp.
#include "safeckpt/open.hpp"

#include "safeckpt/safetensors_reader.hpp"

namespace safeckpt {

Result<Checkpoint> open(const std::filesystem::path& path, const LoadOptions& options) {
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
