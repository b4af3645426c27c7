// fuzz/fuzz_safetensors.cpp — the safetensors reader (safeckpt/safetensors.hpp)
// and what is built on it: load_safetensors_bytes, the writer, and the
// safetensors <-> torch.save conversions.
//
// Option byte: bit 0 tiny limits (4 tensors, rank 3, 256-byte header cap);
// bit 1 serialize the parsed tensors again and re-parse (writer round trip);
// bit 2 load as a Checkpoint, save it as a torch.save zip, load that and
// compare (safetensors -> PyTorch); bit 3 checkpoint_to_safetensors of the
// loaded checkpoint and compare tensor bytes (PyTorch -> safetensors);
// bit 4 also parse_buffer (owned copy) and compare.
//
// Invariants: documented error codes only; an accepted file satisfies the
// grammar the header states (tensors tile the data section exactly, sizes
// from shape x dtype bits, views point at data_offsets inside the input,
// names unique, caps respected); every derived checkpoint passes
// check_tables; serialize(parse(x)) re-parses to the same tensors and is a
// fixpoint; conversions keep every tensor's bytes.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "check_tables.hpp"
#include "fuzz_util.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"
#include "tree_equal.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

namespace {

using u128 = unsigned __int128;

void check_file(const sc::SafetensorsFile& f, sc::Bytes input, const sc::SafetensorsOptions& opt, bool borrowed) {
  const sc::Bytes all = f.bytes();
  if (borrowed) FUZZ_REQUIRE(all.data() == input.data() && all.size() == input.size(), "bytes() is not the input");
  FUZZ_REQUIRE(all.size() == input.size(), "bytes() has another size");
  FUZZ_REQUIRE(f.header_bytes() >= 2 && f.header_bytes() <= opt.max_header_bytes, "header length outside [2, cap]");
  FUZZ_REQUIRE(f.header_bytes() <= all.size() - std::min<std::uint64_t>(all.size(), 8) && all.size() >= 8,
               "header runs past the file");
  const std::uint64_t data_start = 8 + f.header_bytes();
  const std::uint64_t data_size = all.size() - data_start;
  const auto& ts = f.tensors();
  FUZZ_REQUIRE(ts.size() <= opt.limits.max_tensors, "more tensors than max_tensors");
  std::set<std::string> names;
  std::uint64_t expect_begin = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    const std::string tag = "tensor '" + t.name.substr(0, 40) + "'";
    FUZZ_REQUIRE(!t.name.empty() && t.name != "__metadata__", tag + ": bad name");
    FUZZ_REQUIRE(names.insert(t.name).second, tag + ": duplicate name");
    FUZZ_REQUIRE(f.find(t.name) == &t, tag + ": find() does not return it");
    FUZZ_REQUIRE(t.shape.size() <= opt.limits.max_tensor_rank, tag + ": rank above max_tensor_rank");
    const std::uint32_t bits = sc::safetensors_dtype_bits(t.dtype);
    FUZZ_REQUIRE(bits > 0, tag + ": unknown dtype '" + t.dtype + "' accepted");
    u128 total_bits = bits;
    for (std::uint64_t d : t.shape) {
      total_bits *= d;
      if (total_bits > (u128{1} << 80)) total_bits = u128{1} << 80;
    }
    FUZZ_REQUIRE(total_bits % 8 == 0, tag + ": size in bits not a multiple of 8");
    FUZZ_REQUIRE(t.begin <= t.end && u128{t.end - t.begin} == total_bits / 8,
                 tag + ": data_offsets disagree with shape x dtype");
    // Grammar 6: data order, tiling exactly.
    FUZZ_REQUIRE(t.begin == expect_begin, tag + ": gap or overlap before it (begin " + std::to_string(t.begin) +
                                              ", previous end " + std::to_string(expect_begin) + ")");
    expect_begin = t.end;
    FUZZ_REQUIRE(t.end <= data_size, tag + ": ends past the data section");
    FUZZ_REQUIRE(t.file_offset == data_start + t.begin, tag + ": file_offset != 8 + header + begin");
    FUZZ_REQUIRE(t.data.data() == all.data() + t.file_offset && t.data.size() == t.end - t.begin,
                 tag + ": data is not the file's bytes at data_offsets");
  }
  FUZZ_REQUIRE(expect_begin == data_size || (ts.empty() && data_size == 0),
               "tensors do not cover the data section exactly (end " + std::to_string(expect_begin) + " of " +
                   std::to_string(data_size) + ")");
  std::set<std::string> meta_keys;
  for (const auto& [k, v] : f.metadata()) FUZZ_REQUIRE(meta_keys.insert(k).second, "duplicate __metadata__ key");
  if (!f.has_metadata()) FUZZ_REQUIRE(f.metadata().empty(), "metadata without __metadata__");
}

std::vector<sc::SafetensorsEntry> entries_of(const sc::SafetensorsFile& f) {
  std::vector<sc::SafetensorsEntry> e;
  for (const auto& t : f.tensors()) e.push_back({t.name, t.dtype, t.shape, t.data});
  return e;
}

// Same tensors (by name): dtype, shape, bytes.
void require_same_tensors(const sc::SafetensorsFile& a, const sc::SafetensorsFile& b, const std::string& what,
                          bool compare_metadata = true) {
  FUZZ_REQUIRE(a.tensors().size() == b.tensors().size(), what + ": tensor counts differ");
  for (const auto& t : a.tensors()) {
    const auto* u = b.find(t.name);
    FUZZ_REQUIRE(u != nullptr, what + ": tensor '" + t.name.substr(0, 40) + "' missing");
    FUZZ_REQUIRE(u->dtype == t.dtype && u->shape == t.shape,
                 what + ": dtype/shape of '" + t.name.substr(0, 40) + "' differ");
    FUZZ_REQUIRE(u->data.size() == t.data.size() &&
                     (t.data.empty() || std::memcmp(u->data.data(), t.data.data(), t.data.size()) == 0),
                 what + ": bytes of '" + t.name.substr(0, 40) + "' differ");
  }
  if (compare_metadata) {
    // The writer sorts __metadata__ keys (deterministic output): compare as sets.
    auto ma = a.metadata(), mb = b.metadata();
    std::sort(ma.begin(), ma.end());
    std::sort(mb.begin(), mb.end());
    FUZZ_REQUIRE(ma == mb, what + ": metadata differs");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  sc::SafetensorsOptions opt;
  opt.limits = sc::fuzz_limits();
  opt.max_header_bytes = 1u << 16;
  if (in.bit(0)) {
    opt.limits.max_tensors = 4;
    opt.limits.max_tensor_rank = 3;
    opt.max_header_bytes = 256;
  }
  const std::initializer_list<sc::ErrorCode> read_errors = {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded};

  auto parsed = sc::SafetensorsFile::parse(in.data, opt);
  if (in.bit(4)) {
    auto owned = sc::SafetensorsFile::parse_buffer(std::vector<std::uint8_t>(in.data.begin(), in.data.end()), opt);
    FUZZ_REQUIRE(owned.has_value() == parsed.has_value(), "parse and parse_buffer disagree");
    if (owned) {
      check_file(*owned, owned->bytes(), opt, false);
      require_same_tensors(*parsed, *owned, "parse_buffer");
    } else {
      FUZZ_REQUIRE(owned.error().code() == parsed.error().code(), "parse and parse_buffer fail differently");
    }
  }
  auto loaded = sc::load_safetensors_bytes(in.data, opt);
  if (!parsed) {
    fz::check_error(parsed.error(), read_errors, "SafetensorsFile::parse");
    FUZZ_REQUIRE(!loaded.has_value(), "load_safetensors_bytes accepted what parse refused");
    return 0;
  }
  check_file(*parsed, in.data, opt, true);

  // The Checkpoint view of the same bytes.
  if (!loaded) {
    // Documented: F6 dtypes and odd F4 last dimensions have no PyTorch layout.
    fz::check_error(loaded.error(), {sc::ErrorCode::kUnsupported}, "load_safetensors_bytes");
  } else {
    const sc::Checkpoint& ck = *loaded;
    FUZZ_REQUIRE(ck.format() == sc::FileFormat::kSafetensors, "load_safetensors_bytes: format is not safetensors");
    fz::check_arena(ck.values(), ck.root(), false);
    fz::check_tables(ck.values(), ck.tensors(), ck.storages(), in.data, opt.limits, true);
    FUZZ_REQUIRE(ck.tensors().size() == parsed->tensors().size(), "checkpoint and file have different tensor counts");
    const auto sd = ck.state_dict();
    FUZZ_REQUIRE(sd.size() == ck.tensors().size(), "state_dict does not name every tensor");
  }

  if (in.bit(1)) {  // writer round trip
    auto out = sc::serialize_safetensors(entries_of(*parsed), parsed->metadata(), parsed->has_metadata());
    FUZZ_REQUIRE(out.has_value(), "serialize_safetensors refused a parsed file: " + out.error().to_string());
    auto back = sc::SafetensorsFile::parse(sc::Bytes(out->data(), out->size()), opt);
    if (!back) {
      // Our own output may exceed a tiny header cap (padding, reordering).
      FUZZ_REQUIRE(back.error().code() == sc::ErrorCode::kLimitExceeded,
                   "serialized file does not parse: " + back.error().to_string());
    } else {
      require_same_tensors(*parsed, *back, "serialize -> parse");
      auto out2 = sc::serialize_safetensors(entries_of(*back), back->metadata(), back->has_metadata());
      FUZZ_REQUIRE(out2.has_value() && *out2 == *out, "serialize(parse(serialize(x))) != serialize(x)");
    }
  }

  if (loaded && in.bit(2)) {  // safetensors -> torch.save -> load
    sc::SaveOptions so;
    so.fsync = false;
    auto zip = sc::save_to_bytes(*loaded, so);
    FUZZ_REQUIRE(zip.has_value(), "save_to_bytes of a safetensors checkpoint failed: " + zip.error().to_string());
    sc::LoadOptions lo;
    auto back = sc::load_bytes(sc::Bytes(zip->data(), zip->size()), lo);
    FUZZ_REQUIRE(back.has_value(),
                 "the torch.save file made from safetensors does not load: " + back.error().to_string());
    fz::TreeCompare cmp(*loaded, *back);
    const std::string diff = cmp.compare(loaded->root(), back->root());
    FUZZ_REQUIRE(diff.empty(), "safetensors -> torch.save -> load changed the value: " + diff);
  }

  if (loaded && in.bit(3)) {  // torch -> safetensors
    sc::ToSafetensorsOptions to;
    to.metadata = {};
    auto st = sc::checkpoint_to_safetensors(*loaded, to);
    if (!st) {
      fz::check_error(st.error(), {sc::ErrorCode::kUnsupported}, "checkpoint_to_safetensors");
    } else {
      sc::SafetensorsOptions big = opt;
      big.max_header_bytes = 1u << 20;
      auto again = sc::SafetensorsFile::parse(sc::Bytes(st->data(), st->size()), big);
      FUZZ_REQUIRE(again.has_value(), "checkpoint_to_safetensors output does not parse: " + again.error().to_string());
      require_same_tensors(*parsed, *again, "load -> checkpoint_to_safetensors", false);
    }
  }
  return 0;
}
