// fuzz/fuzz_pickle_torch.cpp — the pickle machine driven by the real torch
// hooks (src/torch/object_model.hpp): allowlist lookups, every rebuild
// function, persistent ids, view checks. Storages come from a test provider
// that accepts any key (up to 64 KiB each), so the fuzzer reaches the object
// model without having to build a valid zip around the pickle.
//
// Option byte: bit 0 extended allowlist (default + user entries), bit 1
// legacy 6-field persistent ids, bit 2 tiny limits, bit 3 no storage provider
// (a bare pickle), bit 4 continue_after_policy_error.
//
// Invariants: documented error codes only; every tensor view inside its
// storage and every index valid (fuzz/check_tables.hpp); memory within a
// multiple of the input size.
#include <array>
#include <cstdint>
#include <string>

#include "check_tables.hpp"
#include "fuzz_allowlists.hpp"
#include "fuzz_util.hpp"
#include "generic_hooks.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/pickle.hpp"
#include "torch/object_model.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

namespace {

constexpr std::uint64_t kMaxPatternStorage = 64 * 1024;

// Storage bytes: a fixed pattern, so views have something to read.
const std::array<std::uint8_t, kMaxPatternStorage>& pattern() {
  static const auto p = [] {
    std::array<std::uint8_t, kMaxPatternStorage> a{};
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(i * 131 + 7);
    return a;
  }();
  return p;
}

class PatternStorages final : public sc::StorageProvider {
 public:
  explicit PatternStorages(sc::TorchTables& t) : t_(t) {}
  sc::Result<std::uint32_t> storage(std::string_view key, sc::DType dtype, std::uint64_t nbytes,
                                    std::string_view location, const sc::OpContext& ctx) override {
    FUZZ_REQUIRE(!ctx.opcode.empty(), "storage() called without an opcode");
    FUZZ_REQUIRE(dtype < sc::DType::kCount_, "storage() called with an invalid dtype");
    FUZZ_REQUIRE(nbytes % sc::dtype_size(dtype) == 0, "storage() nbytes not a multiple of the element size");
    for (std::uint32_t i = 0; i < t_.storages.size(); ++i) {
      if (t_.storages[i].key != key) continue;
      if (t_.storages[i].dtype != dtype || t_.storages[i].nbytes != nbytes)
        return sc::make_error(sc::ErrorCode::kMalformed, "storage referenced with different dtypes or sizes");
      return i;
    }
    if (nbytes > kMaxPatternStorage) return sc::make_error(sc::ErrorCode::kLimitExceeded, "pattern storage too large");
    sc::StorageInfo s;
    s.key = std::string(key);
    s.location = std::string(location);
    s.dtype = dtype;
    s.nbytes = nbytes;
    s.record = "pattern/" + s.key;
    s.bytes = sc::Bytes(pattern().data(), nbytes);
    t_.storages.push_back(std::move(s));
    return static_cast<std::uint32_t>(t_.storages.size() - 1);
  }

 private:
  sc::TorchTables& t_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  sc::Limits lim = sc::fuzz_limits();
  if (in.bit(2)) {
    lim.max_nodes = 512;
    lim.max_tensors = 4;
    lim.max_tensor_rank = 3;
    lim.max_total_storage_bytes = 4096;
    lim.max_container_items = 64;
  }
  const sc::Allowlist& allow = fz::pick_allowlist(in.bit(0));
  const fz::HeapProbe heap;
  sc::ValueArena arena;
  sc::TorchTables tables;
  PatternStorages storages(tables);
  sc::TorchHooks hooks(arena, tables, allow, in.bit(3) ? nullptr : &storages, lim,
                       in.bit(1) ? sc::PidForm::kLegacy : sc::PidForm::kZip);
  fz::CheckingObserver obs;
  sc::PickleOptions po;
  po.limits = lim;
  po.record = "fuzz/data.pkl";
  po.continue_after_policy_error = in.bit(4);
  auto r = sc::run_pickle(in.data, arena, hooks, &obs, po);
  if (!r) {
    fz::check_error(r.error(),
                    {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported,
                     sc::ErrorCode::kDisallowedGlobal, sc::ErrorCode::kDisallowedOperation},
                    "run_pickle(torch hooks)");
  }
  // Tables must be consistent even after a failed run (nothing dangles).
  const std::uint64_t held = fz::check_arena(arena, r ? r->root : sc::kNoNode, !r) +
                             fz::check_tables(arena, tables.tensors, tables.storages, in.data, lim, false);
  fz::check_memory(held, in.data.size(), "torch object model");
  heap.check(in.data.size(), "run_pickle(torch hooks)");
  // Read every element of every view (ASan checks the spans).
  for (const auto& t : tables.tensors) {
    if (t.storage == sc::kNoStorage || t.numel() == 0) continue;
    if (t.numel() > kMaxPatternStorage) continue;  // stride-0 broadcasts: large numel over a small storage
    auto bytes = fz::reference_contiguous(t, tables.storages[t.storage]);
    (void)bytes;
  }
  return 0;
}
