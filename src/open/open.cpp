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
  switch (sniff_format(file.bytes())) {
    case FileFormat::kSafetensors: return load_safetensors_file(std::move(file), so);
    case FileFormat::kSafetensorsIndex: return load_safetensors_index_file(std::move(file), so);
    default: return load_file(std::move(file), options);  // zip (PT2/TorchScript refused there), legacy, pickle
  }
}

}  // namespace safeckpt
