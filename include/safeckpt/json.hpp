// safeckpt/json.hpp — a checkpoint's value tree rendered for people and
// programs: as JSON in the schema of the conformance corpus
// (tests/data/corpus/README.md), so values can be compared with what real
// PyTorch recorded, and as the text view of `safeckpt inspect`.
// docs/inspect-json.md documents the JSON as `safeckpt inspect --format json`
// prints it.
//
// Storages are numbered 0, 1, ... in order of first appearance in a
// depth-first, in-order walk (dict items in order, then an OrderedDict's
// `_metadata`). Tensor hashes: `sha256` of the elements in row-major order as
// little-endian bytes, `storage_sha256` of the whole storage; sparse tensors
// give `dense_sha256`. Extensions beyond the corpus schema: generic objects
// are {"$object": name, "args": ..., "state": ...}, globals used as values
// {"$global": name}, layouts/qschemes {"$layout"/"$qscheme": name}, and a
// container met again inside itself (a cycle) is {"$ref": node_id}.
//
// Hostile trees (issue 11): both renderers are iterative (explicit stacks;
// a tree a million lists deep is fine) and their output is bounded by a
// multiple of the checkpoint's own size. Shared (memoized) containers are
// written out at each use in JSON, as Python's json would, so a pickle of 1 KB
// whose memo makes a DAG of 2^40 paths would expand without end: JSON refuses
// it (kLimitExceeded) past max_output_nodes or past its shared-output budget;
// the text view expands each container once and caps depth and lines.
#pragma once

#include <string>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/limits.hpp"

namespace safeckpt {

// Version of the JSON `safeckpt inspect --format json` prints (the
// "$schema_version" member; docs/inspect-json.md). Bumped on any change a
// consumer could notice.
inline constexpr int kInspectJsonSchemaVersion = 1;

struct JsonOptions {
  bool hashes = true;  // compute sha256 fields (reads every storage byte)
  int indent = 1;      // spaces per level (at most 32 levels of indentation); -1 = compact, one line
  // Add "$schema_version": kInspectJsonSchemaVersion to the top-level object
  // (a root that is not a container is then wrapped: {"$schema_version": N,
  // "$value": ...}). Off = exactly the corpus schema.
  bool schema_version = false;
  // Values (containers and leaves) written, counting each use of a shared
  // one. Default: Limits::max_output_nodes.
  std::uint64_t max_output_nodes = Limits{}.max_output_nodes;
  // Bytes written while writing a value a second or later time (a memo-shared
  // sub-graph expanded again) may be at most 4 x the bytes of every value's
  // first writing plus this. A tree without sharing never hits it; tied
  // weights (one tensor under several names) cost a few hundred bytes a use.
  std::uint64_t max_shared_output_bytes = 64u << 20;
};

// The value tree of `ckpt` as JSON text (ends with a newline).
// Errors: kLimitExceeded (an output cap above; out of memory), and what
// Checkpoint::contiguous_bytes / dense_bytes return when hashing tensors.
Result<std::string> to_json(const Checkpoint& ckpt, const JsonOptions& options = {});

struct TextOptions {
  std::string title;                  // first word of the header line (the file name)
  std::size_t max_depth = 12;         // containers nested deeper are summarized ("[…]"), not expanded
  std::size_t max_value_lines = 200;  // non-tensor value lines shown; the rest are counted
  std::size_t max_name_bytes = 200;   // longer paths are cut and end in "…"
  std::size_t max_repr_bytes = 80;    // longer value reprs are cut and end in "…"
};

// The text view of `safeckpt inspect`: a header "TITLE: FORMAT (N tensors, M
// storages)" where N is the number of tensor rows that follow; one row per
// tensor reachable by a path (name, dtype, shape, bytes, storage key); a
// totals line; then the non-tensor values by path ("epoch = 5",
// "optimizer.param_groups.0.lr = 0.001"), each container expanded once, at
// most max_depth deep and max_value_lines lines. Paths go through every dict
// key (a key that is not str/int is its repr in brackets: "state.[(1, 2)]")
// and into objects of allowlisted classes (a whole module saved with
// torch.save(model): "<root> = <torch.nn.modules.linear.Linear object>",
// "__dict__._parameters.weight"; non-empty constructor args as "(args)"). Never fails on a loaded
// checkpoint except kLimitExceeded for out of memory. Output is at most
// ~(max_name_bytes + 150) bytes per tensor plus ~(max_name_bytes +
// max_repr_bytes + 8) per value line plus a header.
Result<std::string> to_text(const Checkpoint& ckpt, const TextOptions& options = {});

// Python repr() of a float ("0.1", "1e-05", "inf", "nan", "-0.0").
std::string python_float_repr(double v);

}  // namespace safeckpt
