// Internal to the dcp layer: the metadata as read, before layout checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "safeckpt/builder.hpp"
#include "safeckpt/dcp.hpp"

namespace safeckpt {

// One storage_data entry: MetadataIndex (fqn, offset) -> _StorageInfo.
struct DcpStorageEntry {
  std::string fqn;
  bool has_offset = false;
  std::vector<std::int64_t> offsets;
  std::string relative_path;
  std::uint64_t offset = 0, length = 0;
};

struct DcpParsed {
  std::vector<DcpTensor> tensors;         // chunks without file/offset/length yet
  std::vector<DcpBytesItem> bytes_items;  // without file/offset/length yet
  std::vector<DcpStorageEntry> storage;
  std::vector<DcpItemRef> items;  // state_dict_metadata order
  std::string version, checkpoint_id;
};

// src/dcp/metadata.cpp: runs the pickle with the DCP hooks and reads the typed fields.
Status parse_dcp_metadata(Bytes data, const DcpOptions& options, DcpParsed& out);

// src/dcp/dcp.cpp: copies the value tree at `root` of `src` into `b`
// (iteratively; shared nodes stay shared). A tensor or storage in it is
// kUnsupported naming `fqn` (a non-tensor item holds no tensors).
Result<NodeId> dcp_copy_value(const ValueArena& src, NodeId root, CheckpointBuilder& b, const std::string& fqn);

// src/dcp/dcp.cpp: row-major copy of the intersection of `box` and `chunk`
// from the chunk's contiguous bytes `src` into the box's buffer `dst`
// (element size `es`). Both must have the tensor's rank.
void dcp_copy_intersection(const DcpBox& box, const DcpChunk& chunk, const std::uint8_t* src, std::uint8_t* dst,
                           std::uint32_t es);

}  // namespace safeckpt
