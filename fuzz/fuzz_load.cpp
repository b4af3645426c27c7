// fuzz/fuzz_load.cpp — the entry point users call: safeckpt::load_bytes with
// fuzz_limits(), then everything a user does with the result (state_dict,
// contiguous_bytes, dense_bytes, to_json).
//
// Option byte: bit 0 verify_storage_crc; bit 1 extended allowlist (default +
// user entries); bit 2 tiny limits (4 tensors, 4 KiB of storage, 16 zip
// entries); bit 3 also load_buffer (owned copy) and compare; bit 4 to_json
// with hashes (bit 5 indented, bit 6 with the schema member). to_text (the
// inspect text view) runs on every input that loads.
//
// Invariants: documented error codes only (never kInternal, never kIo for
// bytes in memory); a successful load describes only views inside their
// storages, valid indices and node ids (fuzz/check_tables.hpp), storages of
// stored records borrow the input; contiguous_bytes equals an independent
// row-major gather; memory within a multiple of the input size; load_bytes
// and load_buffer agree; to_json / to_text output within a multiple of the
// input size (or kLimitExceeded), whatever the depth or memo sharing.
#include <cstdint>
#include <string>
#include <vector>

#include "check_tables.hpp"
#include "fuzz_allowlists.hpp"
#include "fuzz_util.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"
#include "safeckpt/limits.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

namespace {

constexpr std::uint64_t kMaxCopyBytes = 1u << 20;  // per harness run, for contiguous/dense copies

void check_loaded(const sc::Checkpoint& ck, sc::Bytes input, const sc::LoadOptions& opt, bool from_input, bool json,
                  const fz::Input& in) {
  FUZZ_REQUIRE(ck.format() == sc::FileFormat::kTorchZip || ck.format() == sc::FileFormat::kLegacyPickle ||
                   ck.format() == sc::FileFormat::kBarePickle,
               "loaded a checkpoint of format " + std::string(sc::file_format_name(ck.format())));
  std::uint64_t held = fz::check_arena(ck.values(), ck.root(), false);
  held += fz::check_tables(ck.values(), ck.tensors(), ck.storages(), input, opt.limits, from_input);
  fz::check_memory(held, input.size(), "loaded checkpoint");

  const auto sd = ck.state_dict();
  std::vector<bool> seen(ck.tensors().size(), false);
  for (const auto& nt : sd) {
    FUZZ_REQUIRE(nt.tensor < ck.tensors().size(), "state_dict names tensor " + std::to_string(nt.tensor));
    FUZZ_REQUIRE(!seen[nt.tensor], "state_dict lists tensor " + std::to_string(nt.tensor) + " twice");
    seen[nt.tensor] = true;
  }

  std::uint64_t budget = kMaxCopyBytes;
  for (std::uint32_t i = 0; i < ck.tensors().size(); ++i) {
    const sc::TensorInfo& t = ck.tensors()[i];
    const std::uint64_t want = t.numel() * sc::dtype_size(t.dtype);  // numel checked by check_tables
    if (want > budget) continue;
    budget -= want;
    if (t.layout == sc::Layout::kStrided) {
      auto cb = ck.contiguous_bytes(i);
      if (t.storage == sc::kNoStorage) {
        if (!cb)
          fz::check_error(cb.error(), {sc::ErrorCode::kInvalidArgument, sc::ErrorCode::kLimitExceeded},
                          "contiguous_bytes");
        continue;
      }
      if (!cb) {
        fz::check_error(cb.error(), {sc::ErrorCode::kLimitExceeded}, "contiguous_bytes");
        continue;
      }
      FUZZ_REQUIRE(cb->size() == want, "contiguous_bytes of tensor " + std::to_string(i) + " has " +
                                           std::to_string(cb->size()) + " bytes, expected " + std::to_string(want));
      if (!t.conj && !t.neg) {
        FUZZ_REQUIRE(*cb == fz::reference_contiguous(t, ck.storages()[t.storage]),
                     "contiguous_bytes of tensor " + std::to_string(i) + " differs from a row-major gather");
      }
    } else {
      auto db = ck.dense_bytes(i);
      if (!db) {
        fz::check_error(db.error(),
                        {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kInvalidArgument,
                         sc::ErrorCode::kUnsupported},
                        "dense_bytes");
      } else {
        FUZZ_REQUIRE(db->size() == want, "dense_bytes of tensor " + std::to_string(i) + " has the wrong size");
      }
    }
  }

  // What `safeckpt inspect` prints (issue 11: a deep tree crashed --json and
  // made the text view grow without bound): both renderers run on every input
  // that loads, and their output is bounded by a multiple of the input size.
  if (json) {
    sc::JsonOptions jo;
    jo.hashes = true;
    jo.indent = in.bit(5) ? 1 : -1;
    jo.schema_version = in.bit(6);
    jo.max_output_nodes = 1u << 14;
    jo.max_shared_output_bytes = 1u << 16;
    auto j = sc::to_json(ck, jo);
    if (!j) {
      fz::check_error(j.error(), {sc::ErrorCode::kLimitExceeded}, "to_json");
    } else {
      FUZZ_REQUIRE(!j->empty(), "to_json returned empty text");
      // First writings cost at most ~(indentation + separators + escaped text)
      // per input byte plus a tensor object per tensor; re-writings at most 4x
      // that plus max_shared_output_bytes.
      const std::uint64_t first = 128 * input.size() + 2048 * ck.tensors().size() + 4096;
      FUZZ_REQUIRE(
          j->size() <= 5 * first + jo.max_shared_output_bytes,
          "to_json wrote " + std::to_string(j->size()) + " bytes for " + std::to_string(input.size()) + " input bytes");
    }
  }
  sc::TextOptions to;
  to.title = "fuzz";
  auto t = sc::to_text(ck, to);
  if (!t) {
    fz::check_error(t.error(), {sc::ErrorCode::kLimitExceeded}, "to_text");
  } else {
    const std::uint64_t per_line = 3 * (to.max_name_bytes + to.max_repr_bytes) + 400;
    FUZZ_REQUIRE(t->size() <= per_line * (ck.tensors().size() + to.max_value_lines + 8),
                 "to_text wrote " + std::to_string(t->size()) + " bytes for " + std::to_string(ck.tensors().size()) +
                     " tensors");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  sc::LoadOptions opt;
  opt.limits = sc::fuzz_limits();
  opt.verify_storage_crc = in.bit(0);
  opt.allowlist = &fz::pick_allowlist(in.bit(1));
  if (in.bit(2)) {
    opt.limits.max_tensors = 4;
    opt.limits.max_total_storage_bytes = 4096;
    opt.limits.max_zip_entries = 16;
    opt.limits.max_nodes = 1024;
  }
  const fz::HeapProbe heap;
  auto r = sc::load_bytes(in.data, opt);
  heap.check(in.data.size(), "load_bytes");
  const std::initializer_list<sc::ErrorCode> allowed = {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded,
                                                        sc::ErrorCode::kUnsupported, sc::ErrorCode::kDisallowedGlobal,
                                                        sc::ErrorCode::kDisallowedOperation};
  if (!r)
    fz::check_error(r.error(), allowed, "load_bytes");
  else
    check_loaded(*r, in.data, opt, true, in.bit(4), in);

  if (in.bit(3)) {
    auto b = sc::load_buffer(std::vector<std::uint8_t>(in.data.begin(), in.data.end()), opt);
    FUZZ_REQUIRE(b.has_value() == r.has_value(), "load_buffer and load_bytes disagree on success");
    if (!b) {
      FUZZ_REQUIRE(b.error().code() == r.error().code(), "load_buffer and load_bytes fail differently: " +
                                                             b.error().to_string() + " / " + r.error().to_string());
    } else {
      FUZZ_REQUIRE(b->tensors().size() == r->tensors().size() && b->storages().size() == r->storages().size() &&
                       b->values().size() == r->values().size(),
                   "load_buffer and load_bytes built different checkpoints");
      check_loaded(*b, b->file().bytes(), opt, true, false, in);
    }
  }
  return 0;
}
