// safeckpt/open.hpp — one entry point for every checkpoint format we read.
//
// safeckpt::open() opens and maps the file ONCE, decides what it is by
// content (safeckpt/detect.hpp, sniff_format: never by name) and hands that
// same open file to the matching reader:
//   torch.save zip, legacy sequential pickles, bare pickle -> load_file()
//       (safeckpt/checkpoint.hpp; every rule of safeckpt::load applies);
//   safetensors file          -> load_safetensors_file() (a flat state_dict,
//       OrderedDict name -> tensor in data order; LoadOptions::limits apply);
//   sharded safetensors index -> load_safetensors_index_file() (JSON
//       {"metadata": ..., "weight_map": {name: shard}}: shards are plain
//       file names in the index's directory, each opened once, tensor names
//       unique across shards and equal to the weight_map;
//       safeckpt/safetensors_reader.hpp);
//   torch.distributed.checkpoint directory (a directory with `.metadata`)
//       -> DcpCheckpoint::open + dcp_to_checkpoint (safeckpt/dcp.hpp): the
//       consolidated nested state dict (dcp_to_torch_save's layout), tensor
//       bytes in an unlinked scratch file in the temporary directory; the
//       options' allowlist is used for the chunk and non-tensor item
//       payloads (DcpOptions::allowlist), never for `.metadata` (its own
//       fixed set);
//   PT2 program (torch.export / AOTInductor zip) -> kUnsupported: a program,
//       not a checkpoint; read it with graph::Pt2Archive (safeckpt/graph.hpp;
//       `safeckpt inspect` routes it there); TorchScript, tar, compressed wrappers and
//       everything else -> kUnsupported naming what was detected, as load().
// The returned Checkpoint owns that open file (Checkpoint::file()): later
// stages (views, save/convert, cuda::load_to_device's transfer engine) read
// its descriptor and mapping, so a path replaced after open() never feeds
// them other bytes than those validated (safeckpt/mapped_file.hpp states
// the limits: in-place writes to the same inode are not prevented).
// `inspect`, `convert`, `bench` and the GPU path use it; integrators should
// too instead of sniffing files themselves.
#pragma once

#include <filesystem>

#include "safeckpt/checkpoint.hpp"

namespace safeckpt {

// Errors: kIo (open/stat/mmap, a shard that cannot be opened), kUnsupported
// (a directory without .metadata), the errors of DcpCheckpoint::open and
// dcp_to_checkpoint for a DCP directory, and every
// error of the reader chosen (load(), load_safetensors(),
// load_safetensors_index()), located at `path`.
Result<Checkpoint> open(const std::filesystem::path& path, const LoadOptions& options = {});
// Same over a file the caller already opened (MappedFile::open/adopt).
Result<Checkpoint> open_file(MappedFile file, const LoadOptions& options = {});

}  // namespace safeckpt
