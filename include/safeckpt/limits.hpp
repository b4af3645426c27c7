// safeckpt/limits.hpp — caps on everything an untrusted file can make us do.
//
// Every entry point takes a Limits. A cap that is hit yields
// ErrorCode::kLimitExceeded naming the cap and the value; it never crashes.
// All caps are inclusive maxima ("at most N"). Defaults are chosen to be far
// above what real checkpoints need (survey below) and small enough that a
// 2-core / 24 GiB CI machine survives a hostile file.
//
// What real files need, which the defaults were checked against (every
// data.pkl in tests/data/corpus/torch-2.11 and torch-1.13 and
// ../shared/corpus; how and when it was surveyed: bench/RESULTS.md):
//   largest data.pkl 309,142 bytes with 96,017 opcodes, 24,006 memo puts and
//   3,000 persistent ids (many_tensors.pt: 3000 fp16 tensors); longest
//   string 70,000 bytes (python_values.pt); deepest MARK nesting 6
//   (torch-1.13/optimizer_states.pt); most zip entries 3,006.
// Big realistic files written with Debian's PyTorch 1.13 (32 and 56 MB):
//   sd_100k.pt, a 100,000-tensor state_dict with transformer-style names:
//     data.pkl 12,477,346 bytes, 3,000,211 opcodes, 800,006 memo puts;
//   adam_50k.pt, 50,000 parameters + their Adam state_dict:
//     data.pkl 17,677,368 bytes, 6,450,382 opcodes, 1,550,033 memo puts.
// max_memory_bytes needed to load them (SAFECKPT_MEMBUDGET_PROBE in
// tests/checkpoint/test_membudget.cpp): sd_100k.pt 481 MiB (fits, 6% spare), adam_50k.pt
// 998 MiB (250,000 tensors: raise max_memory_bytes); many_tensors.pt 16 MiB.
//
// Worst-case peak memory of one load() under the default Limits:
//   max_memory_bytes (512 MiB: everything the parse allocates, charged
//     before it is allocated; the unit costs in MemoryBudget are upper bounds
//     of sizeof plus std::vector doubling and malloc headers)
//   + the file mapping (its pages count in RSS as they are read; a deflate
//     bomb is only as large as the file)
//   + transient, not charged: one non-storage record other than data.pkl
//     being CRC-checked (<= max_pickle_record_bytes = 64 MiB, freed at
//     once); pop_mark's copy of the stack top (<= the charged stack); a
//     dict key being built (<= max_string_bytes + 64, freed at once); while
//     the arena vector grows, its old buffer (<= 1/2 of the node charge,
//     virtual more than resident); zlib's ~44 KiB inflate state
//   + fixed: the binary, its libraries and stacks (~60 MB for the CLI).
// So about 512 + 64 + 256 (arena growth) + 60 MiB ~ 0.9 GiB plus the mapped
// file: a 1.5 GiB RLIMIT_AS holds it (test_membudget.cpp). Big-endian
// checkpoints add a byte-swapped copy of their storages (1:1 with the file,
// not amplified, not charged). scan: each pickle stream parse gets its own
// budget (the machine's default); at most two are alive at once (a stream
// and its STOP probe), and the loader's verdict has one more.
#pragma once

#include <cstdint>
#include <string_view>

#include "safeckpt/error.hpp"

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
  // Value nodes created in total (strings, containers, tensors, ...). A
  // count; their memory is charged to max_memory_bytes (kNodeBytes each).
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
  // Zip: bytes one inflated *pickle* record (data.pkl) may have. Refused
  // from the declared size before anything is inflated, and the inflater
  // never writes past the declared size (a lying header stops there). 64 MiB
  // is 3.6x the largest data.pkl of the survey above (adam_50k.pt, 17.7 MB),
  // ~200x the largest in the corpora.
  std::uint64_t max_pickle_record_bytes = 64ull << 20;
  // Total bytes the parse of one file may allocate, charged to one
  // MemoryBudget *before* each allocation: the inflated data.pkl, value
  // nodes (MemoryBudget::kNodeBytes each), their strings and item vectors,
  // memo entries, the pickle stack and MARK stack, dict/set key indexes,
  // tensor metadata, and the safetensors header's JSON. 512 MiB holds a
  // 100,000-tensor state_dict (481 MiB charged, 345 MB real peak RSS) and
  // keeps the worst case (above) under a 1.5 GiB rlimit; raise it for more.
  std::uint64_t max_memory_bytes = 512ull << 20;
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

// The running total of bytes charged against Limits::max_memory_bytes for one
// load or scan. Every allocation whose size a file controls calls charge()
// first; nothing is ever released before the parse ends (the charge is a
// high-water mark), so the sum of charges bounds the peak. Not thread-safe
// (one parse = one thread).
class MemoryBudget {
 public:
  // Upper bounds of what one unit costs, including std::vector doubling
  // (x2) and malloc headers; static_asserts in src/pickle/machine.cpp and
  // src/torch/object_model.cpp keep them above the real sizeof.
  static constexpr std::uint64_t kNodeBytes = 2 * 104;     // one value Node in the arena
  static constexpr std::uint64_t kItemBytes = 2 * 4;       // one NodeId in a container / the stack
  static constexpr std::uint64_t kMarkBytes = 2 * 8;       // one open MARK
  static constexpr std::uint64_t kMemoEntryBytes = 64;     // one unordered_map<u64, NodeId> node + bucket
  static constexpr std::uint64_t kKeyEntryBytes = 96;      // one dict-key index entry, plus its text
  static constexpr std::uint64_t kStringBytes = 32;        // heap header of one string, plus its size
  static constexpr std::uint64_t kTensorBytes = 2 * 256;   // one TensorInfo, plus 16 bytes per dim
  static constexpr std::uint64_t kStorageBytes = 2 * 256;  // one StorageInfo + index entry, plus 3x its key
  static constexpr std::uint64_t kJsonBytesPerByte = 32;   // nlohmann::json tree per header byte

  explicit MemoryBudget(std::uint64_t cap) noexcept : cap_(cap) {}
  // Adds `bytes` for `what`. Errors: kLimitExceeded "memory budget exceeded:
  // <what> needs N more bytes, U of max_memory_bytes = C already charged"
  // (the total is left unchanged).
  Status charge(std::uint64_t bytes, std::string_view what);
  std::uint64_t used() const noexcept { return used_; }
  std::uint64_t cap() const noexcept { return cap_; }

 private:
  std::uint64_t cap_;
  std::uint64_t used_ = 0;
};

// Small limits for fuzzers and tests (fast runs, small memory); most corpus
// files still load under them, many_tensors.pt (24,006 memo puts) does not.
Limits fuzz_limits() noexcept;

}  // namespace safeckpt
