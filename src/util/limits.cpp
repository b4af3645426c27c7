#include "safeckpt/limits.hpp"

#include <string>

namespace safeckpt {

Status MemoryBudget::charge(std::uint64_t bytes, std::string_view what) {
  if (bytes > cap_ - used_) {
    return make_error(ErrorCode::kLimitExceeded, "memory budget exceeded: " + std::string(what) + " needs " +
                                                     std::to_string(bytes) + " more bytes, " + std::to_string(used_) +
                                                     " of max_memory_bytes = " + std::to_string(cap_) +
                                                     " already charged");
  }
  used_ += bytes;
  return {};
}

Limits fuzz_limits() noexcept {
  Limits l;
  l.max_pickle_ops = 1u << 16;
  l.max_pickle_bytes = 1u << 20;
  l.max_stack_depth = 1u << 12;
  l.max_mark_depth = 1u << 10;
  l.max_memo_entries = 1u << 12;
  l.max_nodes = 1u << 16;
  l.max_string_bytes = 1u << 16;
  l.max_container_items = 1u << 14;
  l.max_long_bytes = 64;
  l.max_tensors = 1u << 12;
  l.max_tensor_rank = 16;
  l.max_total_storage_bytes = 1u << 26;
  l.max_zip_entries = 1u << 12;
  l.max_inflated_bytes = 1u << 24;
  l.max_pickle_record_bytes = 1u << 20;
  l.max_memory_bytes = 64u << 20;
  l.max_zip_name_bytes = 1024;
  l.max_legacy_storages = 1u << 12;
  return l;
}

}  // namespace safeckpt
