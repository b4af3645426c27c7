// safeckpt/limits.hpp — caps on everything an untrusted file can make us do.
//
// Every entry point takes a Limits. A cap that is hit yields
// ErrorCode::kLimitExceeded naming the cap and the value; it never crashes.
// All caps are inclusive maxima ("at most N"). Defaults are chosen to be far
// above what real checkpoints need (survey below) and small enough that a
// 2-core / 24 GiB CI machine survives a hostile file.
//
// Survey the defaults were checked against (every data.pkl in
// tests/data/corpus/torch-2.11 and torch-1.13, measured with Python's
// pickletools on 2026-11-29):
//   largest data.pkl 309,142 bytes with 96,017 opcodes, 24,006 memo puts and
//   3,000 persistent ids (many_tensors.pt: 3000 fp16 tensors); longest
//   string 70,000 bytes (python_values.pt); deepest MARK nesting 6
//   (torch-1.13/optimizer_states.pt); most zip entries 3,006.
// A state_dict pickle costs ~32 opcodes and ~100 bytes per tensor, so even a
// 100,000-tensor checkpoint stays 20x under max_pickle_ops and the memo cap;
// the byte, node and storage caps bound memory on a 24 GiB machine.
#pragma once

#include <cstdint>

namespace safeckpt {

struct Limits {
  // Pickle opcodes executed per stream (each opcode counts 1). 64 Mi ops is
  // ~1000x the largest real state_dict pickle seen; bounds CPU time.
  std::uint64_t max_pickle_ops = 64ull << 20;
  // Bytes of one pickle stream (data.pkl or a legacy stream). 1 GiB.
  std::uint64_t max_pickle_bytes = 1ull << 30;
  // Objects on the pickle stack plus MARK frames at any moment.
  std::uint64_t max_stack_depth = 1u << 20;
  // MARK frames open at once (nesting of MARK ... TUPLE/LIST/DICT).
  std::uint64_t max_mark_depth = 1u << 16;
  // Memo entries (PUT/BINPUT/MEMOIZE). The memo is a hash map, so a huge
  // index (LONG_BINPUT 0xFFFFFFFF) costs one entry, never a table of that size.
  std::uint64_t max_memo_entries = 1u << 22;
  // Value nodes created in total (strings, containers, tensors, ...). Bounds
  // memory: each node is ~100 bytes, so 16 Mi nodes ~ 1.6 GiB worst case.
  std::uint64_t max_nodes = 16u << 20;
  // Bytes of one str/bytes/bytearray/LONG literal (bytes, not characters).
  std::uint64_t max_string_bytes = 256ull << 20;
  // Items in one list/tuple/dict/set (dict: key-value pairs).
  std::uint64_t max_container_items = 16u << 20;
  // Digits in an arbitrary-precision int (LONG1/LONG4/LONG text), in bytes of
  // two's complement. 1 KiB = 2466 decimal digits; avoids quadratic printing.
  std::uint64_t max_long_bytes = 1024;
  // Tensors rebuilt per file.
  std::uint64_t max_tensors = 1u << 20;
  // Dimensions of one tensor. PyTorch's own cap is 64 (c10 MAX_DIMS-ish);
  // we accept up to 64.
  std::uint64_t max_tensor_rank = 64;
  // Sum of storage bytes referenced by one checkpoint. 4 TiB: no real model
  // is larger; bounds arithmetic and GPU allocation requests.
  std::uint64_t max_total_storage_bytes = 4ull << 40;
  // Zip: entries in the central directory. Real torch.save files have
  // N storages + ~6 records; 1 Mi leaves room for 1 Mi tensors.
  std::uint64_t max_zip_entries = 1u << 20;
  // Zip: bytes one deflated record may inflate to (deflate bomb guard).
  // Storage records are never compressed by PyTorch; data.pkl is small.
  std::uint64_t max_inflated_bytes = 8ull << 30;
  // Zip: length of one entry name.
  std::uint64_t max_zip_name_bytes = 4096;
  // Legacy sequential-pickle format: storages in the file.
  std::uint64_t max_legacy_storages = 1u << 20;
  // Values written by to_json (safeckpt/json.hpp; `safeckpt inspect --format
  // json`), counting every use of a memo-shared value: a 1 KB pickle can be a
  // DAG of 2^40 paths. 16 Mi = max_nodes: a tree without sharing never hits
  // it. (Writers are iterative; depth is not capped.)
  std::uint64_t max_output_nodes = 16u << 20;
};

// Small limits for fuzzers and tests (fast runs, small memory); most corpus
// files still load under them, many_tensors.pt (24,006 memo puts) does not.
Limits fuzz_limits() noexcept;

}  // namespace safeckpt
