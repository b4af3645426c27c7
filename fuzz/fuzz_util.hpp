// fuzz/fuzz_util.hpp — shared helpers for the libFuzzer harnesses.
//
// The harnesses abort (so libFuzzer records a crash) on broken invariants,
// not only on memory errors (the wuffs habit): an ErrorCode::kInternal, an
// error code the entry point does not document, a view handed out beyond its
// storage, a node id that points nowhere, memory use far above the input size.
//
// Input layout used by every harness: byte 0 selects options (continue mode,
// verify_crc, hook behaviour, ...; each harness documents its bits), the rest
// is the file. fuzz/make_seeds.sh prepends that byte to real checkpoints.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define SAFECKPT_FUZZ_HAVE_MALLINFO2 1
#endif
#include <string>
#include <string_view>

#include "safeckpt/error.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt::fuzz {

// Prints what broke and aborts: the fuzzer (or the replay main under ctest)
// reports the input as a crash.
[[noreturn]] inline void invariant_failed(const char* expr, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "\n*** fuzz invariant failed: %s\n    at %s:%d\n    %s\n", expr, file, line, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_REQUIRE(cond, detail)                                                        \
  do {                                                                                    \
    if (!(cond)) ::safeckpt::fuzz::invariant_failed(#cond, __FILE__, __LINE__, (detail)); \
  } while (0)

// SAFECKPT_FUZZ_VERBOSE=1 in the environment: harnesses print what each
// input did (for triage with the replay programs).
inline bool verbose() {
  static const bool v = std::getenv("SAFECKPT_FUZZ_VERBOSE") != nullptr;
  return v;
}

// The option byte and the payload.
struct Input {
  std::uint8_t flags = 0;
  Bytes data;
  bool bit(int n) const noexcept { return (flags >> n) & 1u; }
};

inline Input split_input(const std::uint8_t* data, std::size_t size) {
  Input in;
  if (size == 0) return in;
  in.flags = data[0];
  in.data = Bytes(data + 1, size - 1);
  return in;
}

// An error returned for untrusted input must carry a documented code (one of
// `allowed`), never kInternal, and a message a user can act on.
inline void check_error(const Error& e, std::initializer_list<ErrorCode> allowed, std::string_view where) {
  const std::string text = std::string(where) + ": " + e.to_string();
  FUZZ_REQUIRE(e.code() != ErrorCode::kInternal, "internal error (a bug in safeckpt) — " + text);
  FUZZ_REQUIRE(e.code() != ErrorCode::kOk, "failed Result carries kOk — " + text);
  bool ok = false;
  for (ErrorCode c : allowed) ok = ok || c == e.code();
  FUZZ_REQUIRE(ok, "undocumented error code for this entry point — " + text);
  FUZZ_REQUIRE(!e.message().empty(), "error without a message — " + text);
}

// Every id stored in the arena points into it; `root` too (or is kNoNode
// when `root_may_be_none`). Returns the bytes the tree holds (nodes, text,
// item lists), for the memory-amplification check.
inline std::uint64_t check_arena(const ValueArena& arena, NodeId root, bool root_may_be_none) {
  const std::size_t n = arena.size();
  if (!(root_may_be_none && root == kNoNode)) {
    FUZZ_REQUIRE(root < n, "root node " + std::to_string(root) + " outside the arena of " + std::to_string(n));
  }
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = arena[static_cast<NodeId>(i)];
    FUZZ_REQUIRE(static_cast<unsigned>(node.kind) <= static_cast<unsigned>(Kind::kObject),
                 "node " + std::to_string(i) + " has an invalid kind");
    for (NodeId c : node.items) {
      // kObject items [args, state] may be kNoNode (value.hpp).
      FUZZ_REQUIRE(c < n || (c == kNoNode && node.kind == Kind::kObject),
                   "node " + std::to_string(i) + " (" + std::string(kind_name(node.kind)) + ") refers to node " +
                       std::to_string(c) + " outside the arena of " + std::to_string(n));
    }
    FUZZ_REQUIRE(node.attrs == kNoNode || node.attrs < n,
                 "node " + std::to_string(i) + " attrs " + std::to_string(node.attrs) + " outside the arena");
    if (node.kind == Kind::kDict || node.kind == Kind::kOrderedDict || node.kind == Kind::kCounter) {
      FUZZ_REQUIRE(node.items.size() % 2 == 0, "dict node " + std::to_string(i) + " with an odd item count");
    }
    bytes += sizeof(Node) + node.text.size() + node.items.size() * sizeof(NodeId);
  }
  return bytes;
}

// Memory-amplification budget: what a parse may hold per input byte. One
// opcode byte (EMPTY_DICT, NONE, ...) legitimately makes one Node, so the
// factor is a small multiple of sizeof(Node); the slack covers fixed costs.
// A parse that exceeds it means some construct copies attacker data
// super-linearly (e.g. a call that duplicates a shared container per REDUCE).
inline constexpr std::uint64_t kBytesPerInputByte = 4 * sizeof(Node);
inline constexpr std::uint64_t kMemorySlack = 1u << 20;

inline void check_memory(std::uint64_t held, std::size_t input_size, std::string_view what) {
  const std::uint64_t budget = kBytesPerInputByte * input_size + kMemorySlack;
  FUZZ_REQUIRE(held <= budget, std::string(what) + " holds " + std::to_string(held) + " bytes for an input of " +
                                   std::to_string(input_size) + " bytes (budget " + std::to_string(budget) + ")");
}

// Peak heap use during one harness run, for memory held where the harness
// cannot count it (the pickle machine's dict-key index, hooks' scratch
// copies). Under ASan (clang or gcc) malloc/free hooks track live bytes and
// their peak exactly; without a sanitizer, glibc's mallinfo2 at the end of
// the run is used (current use only: a weaker check). Budget:
// kHeapBytesPerInputByte per input byte + kHeapSlack.
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*)(const volatile void*, std::size_t),
                                                         void (*)(const volatile void*)) __attribute__((weak));
extern "C" std::size_t __sanitizer_get_allocated_size(const volatile void*) __attribute__((weak));

// Atomic: the hooks run on whichever thread allocates. Signed: memory
// allocated before the hooks were installed may be freed later.
struct HeapCounter {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
  bool hooked = false;
};
inline HeapCounter& heap_counter() {
  static HeapCounter c;
  return c;
}
inline void heap_malloc_hook(const volatile void*, std::size_t n) {
  HeapCounter& c = heap_counter();
  const auto add = static_cast<std::int64_t>(n);
  const std::int64_t now = c.live.fetch_add(add, std::memory_order_relaxed) + add;
  std::int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
inline void heap_free_hook(const volatile void* p) {
  if (p != nullptr)
    heap_counter().live.fetch_sub(static_cast<std::int64_t>(__sanitizer_get_allocated_size(p)),
                                  std::memory_order_relaxed);
}
inline HeapCounter& heap_hooks() {
  HeapCounter& c = heap_counter();
  if (!c.hooked && __sanitizer_install_malloc_and_free_hooks && __sanitizer_get_allocated_size) {
    c.hooked = __sanitizer_install_malloc_and_free_hooks(heap_malloc_hook, heap_free_hook) != 0;
  }
  return c;
}

inline constexpr std::uint64_t kHeapBytesPerInputByte = 256;
inline constexpr std::uint64_t kHeapSlack = 64u << 20;

class HeapProbe {
 public:
  HeapProbe() {
    HeapCounter& c = heap_hooks();
    if (c.hooked) {
      start_ = c.live.load();
      c.peak.store(start_);
    } else {
      start_ = static_cast<std::int64_t>(mallinfo_bytes());
    }
  }
  void check(std::size_t input_size, std::string_view what) const {
    const HeapCounter& c = heap_counter();
    const std::int64_t top = c.hooked ? c.peak.load() : static_cast<std::int64_t>(mallinfo_bytes());
    const std::uint64_t grown = top > start_ ? static_cast<std::uint64_t>(top - start_) : 0;
    const std::uint64_t budget = kHeapBytesPerInputByte * input_size + kHeapSlack;
    if (verbose())
      std::fprintf(stderr, "%.*s: heap peak +%llu bytes (%s)\n", static_cast<int>(what.size()), what.data(),
                   static_cast<unsigned long long>(grown), c.hooked ? "sanitizer hooks" : "mallinfo2");
    FUZZ_REQUIRE(grown <= budget, std::string(what) + ": heap use peaked " + std::to_string(grown >> 20) +
                                      " MiB above its start for an input of " + std::to_string(input_size) +
                                      " bytes (budget " + std::to_string(budget >> 20) + " MiB)");
  }

 private:
  static std::uint64_t mallinfo_bytes() {
#ifdef SAFECKPT_FUZZ_HAVE_MALLINFO2
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#else
    return 0;  // no portable measure: only the sanitizer hooks check
#endif
  }
  std::int64_t start_ = 0;
};

}  // namespace safeckpt::fuzz
