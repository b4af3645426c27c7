// fuzz/fuzz_dcp_metadata.cpp — the DCP metadata reader (safeckpt/dcp.hpp):
// the restricted pickle machine with the DCP hooks, the typed field checks
// and the layout checks (DcpCheckpoint::parse_metadata).
//
// Option byte: bit 0 tiny limits (max_ndim 4, 64 items, 256 chunks, 4 files,
// 1 MiB pickle memory).
//
// Invariants: documented error codes only; an accepted metadata satisfies
// what the header promises, re-checked here independently: every chunk has
// the tensor's rank and lies inside it, the non-empty chunks' element counts
// add up to the tensor's (tiling), every chunk and item names a file of
// files() with a plain name, and the caps hold.
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "safeckpt/dcp.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  sc::DcpOptions o;
  if (in.bit(0)) {
    o.dcp.max_ndim = 4;
    o.dcp.max_items = 64;
    o.dcp.max_chunks = 256;
    o.dcp.max_files = 4;
    o.limits.max_memory_bytes = 1u << 20;
  }
  auto r = sc::DcpCheckpoint::parse_metadata(in.data, o);
  if (!r) {
    fz::check_error(r.error(),
                    {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported,
                     sc::ErrorCode::kDisallowedGlobal, sc::ErrorCode::kDisallowedOperation},
                    "parse_metadata");
    return 0;
  }
  FUZZ_REQUIRE(r->files().size() <= o.dcp.max_files, "more files than max_files");
  for (const auto& f : r->files())
    FUZZ_REQUIRE(!f.name.empty() && f.name.find('/') == std::string::npos && f.name != ".." && f.name != ".",
                 "accepted file name '" + f.name + "'");
  std::uint64_t chunks = 0;
  for (const auto& t : r->tensors()) {
    FUZZ_REQUIRE(t.shape.size() <= o.dcp.max_ndim, "rank above max_ndim");
    unsigned __int128 total = 1, sum = 0;
    for (auto d : t.shape) {
      FUZZ_REQUIRE(d >= 0, "negative dim");
      total *= static_cast<std::uint64_t>(d);
      if (total > (static_cast<unsigned __int128>(1) << 64)) total = static_cast<unsigned __int128>(1) << 64;
    }
    for (const auto& c : t.chunks) {
      ++chunks;
      FUZZ_REQUIRE(c.offsets.size() == t.shape.size() && c.sizes.size() == t.shape.size(), "chunk rank");
      FUZZ_REQUIRE(c.file < r->files().size(), "chunk file index");
      unsigned __int128 n = 1;
      for (std::size_t d = 0; d < t.shape.size(); ++d) {
        FUZZ_REQUIRE(c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] + c.sizes[d] <= t.shape[d],
                     "chunk outside '" + t.fqn + "'");
        n *= static_cast<std::uint64_t>(c.sizes[d]);
      }
      sum += n;
    }
    FUZZ_REQUIRE(sum == total, "chunks of '" + t.fqn + "' do not tile it");
  }
  FUZZ_REQUIRE(chunks <= o.dcp.max_chunks, "more chunks than max_chunks");
  for (const auto& b : r->bytes_items()) FUZZ_REQUIRE(b.file < r->files().size(), "item file index");
  return 0;
}
