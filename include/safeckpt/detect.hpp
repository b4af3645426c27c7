// safeckpt/detect.hpp — what kind of file is this? By content, never by name.
//
// Order follows torch.load (torch/serialization.py): zip magic `PK\3\4` at
// offset 0; otherwise the legacy formats (tar, then sequential pickles);
// otherwise a bare pickle. Formats PyTorch cannot read but attackers use to
// hide payloads (7z, gzip, bzip2, xz, zstd) are recognised so that tools can
// say "unscannable container" instead of "not a checkpoint".
#pragma once

#include <string_view>

#include "safeckpt/mapped_file.hpp"
#include "safeckpt/zip.hpp"

namespace safeckpt {

enum class FileFormat : std::uint8_t {
  kTorchZip,          // torch.save (>= 1.6) zip: <root>/data.pkl
  kTorchScriptZip,    // zip with <root>/constants.pkl (torch.jit.save): code
  kPt2Archive,        // torch.export / AOTInductor package (.pt2): code
  kOtherZip,          // zip without data.pkl (numpy .npz, random zip)
  kLegacyPickle,      // pre-1.6 sequential pickles, first is the magic number
  kLegacyTar,         // very old tar checkpoint (sys_info, pickle, tensors, storages)
  kBarePickle,        // a pickle stream that is not the legacy magic
  kSafetensors,       // u64 header length + '{' JSON header
  kSafetensorsIndex,  // sharded safetensors: JSON object with "weight_map" (*.safetensors.index.json)
  kNumpyNpy,          // \x93NUMPY
  kPreviewPytorch1,   // "PYTORCH1" pre-1.0 preview container
  kGzip,
  kBzip2,
  kXz,
  kZstd,
  k7z,
  kRar,
  kEmpty,
  kUnknown,
};

std::string_view file_format_name(FileFormat f) noexcept;

// Looks at magic bytes only (cheap; a sharded index is recognised by a
// leading '{' (after JSON whitespace) and the text "weight_map" in it). Every file starting `PK\3\4` is
// reported as kTorchZip (the zip path of torch.load); use classify_zip() to
// split torch.save / TorchScript / PT2 / other. The order of the checks is
// listed at the top of src/container/detect.cpp.
FileFormat sniff_format(Bytes file) noexcept;

// Splits a parsed zip the way PyTorch would: constants.pkl under the root ->
// TorchScript; a PT2 archive layout (archive_format / .so / cubin /
// `data/aotinductor`) -> PT2; data.pkl under the root -> torch.save; else other.
FileFormat classify_zip(const ZipArchive& zip) noexcept;

// Full detection: sniff, and for zips parse and classify. A file that starts
// `PK\3\4` but does not open (ZipArchive::open error) is kUnknown; call
// ZipArchive::open for the reason.
FileFormat detect_format(Bytes file, const Limits& limits);

}  // namespace safeckpt
