// safeckpt/json.hpp — a checkpoint's value tree as JSON, in the schema of the
// conformance corpus (tests/data/corpus/README.md), so values can be compared
// with what real PyTorch recorded.
//
// Storages are numbered 0, 1, ... in order of first appearance in a
// depth-first, in-order walk (dict items in order, then an OrderedDict's
// `_metadata`). Tensor hashes: `sha256` of the elements in row-major order as
// little-endian bytes, `storage_sha256` of the whole storage; sparse tensors
// give `dense_sha256`. Extensions beyond the corpus schema: generic objects
// are {"$object": name, "args": ..., "state": ...}, globals used as values
// {"$global": name}, layouts/qschemes {"$layout"/"$qscheme": name}, and a
// container met again inside itself (a cycle) is {"$ref": node_id}. Shared
// (memoized) containers are written out at each use, as Python's JSON would;
// the total is capped by JsonOptions::max_output_nodes (kLimitExceeded), so
// the output of a hostile shared graph stays bounded.
#pragma once

#include <string>

#include "safeckpt/checkpoint.hpp"

namespace safeckpt {

struct JsonOptions {
  bool hashes = true;  // compute sha256 fields (reads every storage byte)
  int indent = 1;      // -1 = compact
  std::uint64_t max_output_nodes = 64u << 20;
};

// The value tree of `ckpt` as JSON text. Errors: kLimitExceeded.
Result<std::string> to_json(const Checkpoint& ckpt, const JsonOptions& options = {});

// Python repr() of a float ("0.1", "1e-05", "inf", "nan", "-0.0").
std::string python_float_repr(double v);

}  // namespace safeckpt
