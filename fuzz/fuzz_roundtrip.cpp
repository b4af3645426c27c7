// fuzz/fuzz_roundtrip.cpp — save -> load round trips (safeckpt/save.hpp).
//
// Two modes (option byte bit 0):
//  0. Structure-aware: the rest of the input is a small program that builds
//     a value tree with CheckpointBuilder (scalars, strings, containers with shared
//     references, dtypes/devices/sizes, storages with tensors viewing them at
//     offsets/strides, parameters, meta and quantized tensors). Everything
//     built is something torch.load(weights_only=True) can read, so save must
//     succeed.
//  1. File: load_bytes(input); if it loads, save that.
// Then in both: load the saved bytes (must succeed), compare with the
// original (equal values, same sharing, same storage bytes; tree_equal.hpp),
// save the loaded checkpoint again and require byte-identical output, and
// saving the original twice must give the same bytes (determinism).
// Option byte bit 1: compute_crc32 off; bits 2-3: storage_alignment 64 / 1 /
// 4096 / 64 with root "model"; bit 4: extended allowlist (file mode: values
// outside torch's default set may then be refused with kUnsupported); bit 5:
// legacy (pre-1.6) format, which refuses storages without one typed class.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check_tables.hpp"
#include "fuzz_allowlists.hpp"
#include "fuzz_util.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/save.hpp"
#include "tree_equal.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;

namespace {

class Reader {
 public:
  explicit Reader(sc::Bytes d) : d_(d) {}
  bool empty() const { return p_ >= d_.size(); }
  std::uint8_t u8() { return p_ < d_.size() ? d_[p_++] : 0; }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{u8()} << (8 * i);
    return v;
  }
  std::vector<std::uint8_t> take(std::size_t n) {
    std::vector<std::uint8_t> out(n, 0);
    for (auto& b : out) b = u8();
    return out;
  }

 private:
  sc::Bytes d_;
  std::size_t p_ = 0;
};

// Latin-1 bytes -> UTF-8 text (always valid, exercises multi-byte strings).
std::string utf8_of(const std::vector<std::uint8_t>& raw) {
  std::string s;
  for (std::uint8_t b : raw) {
    if (b < 0x80) {
      s.push_back(static_cast<char>(b));
    } else {
      s.push_back(static_cast<char>(0xC0 | (b >> 6)));
      s.push_back(static_cast<char>(0x80 | (b & 0x3F)));
    }
  }
  return s;
}

// Builds a checkpoint from the program in `r`. Returns false if nothing
// sensible could be built (the input is then skipped, not an error).
bool build_tree(Reader& r, sc::CheckpointBuilder& b) {
  constexpr std::size_t kMaxOps = 256;
  std::vector<sc::NodeId> stack;
  std::vector<sc::DType> storage_dtypes;  // dtype each storage was made with
  std::vector<bool> storage_quantized_only;
  std::uint64_t key_counter = 0;
  auto pop_n = [&](std::size_t n) {
    n = std::min(n, stack.size());
    std::vector<sc::NodeId> items(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end());
    stack.resize(stack.size() - n);
    return items;
  };
  auto dict_items = [&](std::size_t n) {
    std::vector<sc::NodeId> vals = pop_n(n), kv;
    for (sc::NodeId v : vals) {
      kv.push_back(b.str("k" + std::to_string(key_counter++)));
      kv.push_back(v);
    }
    return kv;
  };
  for (std::size_t ops = 0; ops < kMaxOps && !r.empty(); ++ops) {
    switch (r.u8() % 24) {
      case 0: stack.push_back(b.none()); break;
      case 1: stack.push_back(b.boolean(r.u8() & 1)); break;
      case 2: stack.push_back(b.integer(static_cast<std::int8_t>(r.u8()))); break;
      case 3: stack.push_back(b.integer(static_cast<std::int64_t>(r.u64()))); break;
      case 4: {
        std::uint64_t bits = r.u64();
        double d;
        std::memcpy(&d, &bits, 8);
        stack.push_back(b.floating(d));
        break;
      }
      case 5: stack.push_back(b.str(utf8_of(r.take(r.u8() % 24)))); break;
      case 6: {
        auto raw = r.take(r.u8() % 24);
        stack.push_back(b.bytes(sc::Bytes(raw.data(), raw.size())));
        break;
      }
      case 7: {
        sc::Node n;
        n.kind = sc::Kind::kByteArray;
        auto raw = r.take(r.u8() % 16);
        n.text.assign(raw.begin(), raw.end());
        stack.push_back(b.add(std::move(n)));
        break;
      }
      case 8: {
        sc::Node n;
        n.kind = sc::Kind::kComplex;
        std::uint64_t re = r.u64(), im = r.u64();
        std::memcpy(&n.re, &re, 8);
        std::memcpy(&n.im, &im, 8);
        stack.push_back(b.add(std::move(n)));
        break;
      }
      case 9: {  // an int beyond int64: 20..40 decimal digits, no leading zero
        sc::Node n;
        n.kind = sc::Kind::kBigInt;
        const std::size_t len = 20 + r.u8() % 21;
        if (r.u8() & 1) n.text.push_back('-');
        n.text.push_back(static_cast<char>('1' + r.u8() % 9));
        for (std::size_t i = 1; i < len; ++i) n.text.push_back(static_cast<char>('0' + r.u8() % 10));
        stack.push_back(b.add(std::move(n)));
        break;
      }
      case 10: stack.push_back(b.container(sc::Kind::kList, pop_n(r.u8() % 6))); break;
      case 11: stack.push_back(b.container(sc::Kind::kTuple, pop_n(r.u8() % 6))); break;
      case 12: stack.push_back(b.container(sc::Kind::kDict, dict_items(r.u8() % 6))); break;
      case 13: {
        const std::uint8_t f = r.u8();
        sc::NodeId od = b.container(sc::Kind::kOrderedDict, dict_items(f % 6));
        if ((f & 0x80) && !stack.empty()) {
          // `_metadata`-style attribute: a dict of str -> value.
          b.values()[od].attrs = b.container(sc::Kind::kDict, dict_items(1));
        }
        stack.push_back(od);
        break;
      }
      case 14: {  // set of distinct ints
        std::vector<sc::NodeId> items;
        const std::size_t n = r.u8() % 5;
        const std::int64_t base = static_cast<std::int8_t>(r.u8());
        for (std::size_t i = 0; i < n; ++i) items.push_back(b.integer(base + static_cast<std::int64_t>(i)));
        stack.push_back(b.container(sc::Kind::kSet, std::move(items)));
        break;
      }
      case 15: {  // torch.Size
        std::vector<sc::NodeId> items;
        const std::size_t n = r.u8() % 4;
        for (std::size_t i = 0; i < n; ++i) items.push_back(b.integer(r.u8()));
        stack.push_back(b.container(sc::Kind::kSize, std::move(items)));
        break;
      }
      case 16: {
        static constexpr const char* kDevices[] = {"cpu", "cuda", "cuda:1", "meta", "xpu:3"};
        stack.push_back(b.device(kDevices[r.u8() % 5]));
        break;
      }
      case 17:
        stack.push_back(b.dtype(static_cast<sc::DType>(r.u8() % static_cast<unsigned>(sc::DType::kCount_))));
        break;
      case 18: {  // a storage
        const auto dt = static_cast<sc::DType>(r.u8() % static_cast<unsigned>(sc::DType::kCount_));
        const std::size_t n = r.u8() % 24;
        auto bytes = r.take(n * sc::dtype_size(dt));
        auto idx = b.add_storage(dt, std::move(bytes), (r.u8() & 1) ? "cpu" : "cuda:0");
        FUZZ_REQUIRE(idx.has_value(),
                     "CheckpointBuilder::add_storage refused a valid storage: " + idx.error().to_string());
        storage_dtypes.push_back(dt);
        storage_quantized_only.push_back(sc::dtype_is_quantized(dt));
        break;
      }
      case 19: {  // a strided tensor viewing a storage
        if (storage_dtypes.empty()) break;
        const std::uint8_t f = r.u8();
        const auto s = static_cast<std::uint32_t>(r.u8() % storage_dtypes.size());
        sc::TensorInfo t;
        t.storage = s;
        t.dtype = storage_dtypes[s];
        // Another dtype over the same bytes (the saver writes the storage
        // untyped then); never for quantized storages (documented refusal).
        if ((f & 1) && !storage_quantized_only[s]) {
          const auto other = static_cast<sc::DType>(r.u8() % static_cast<unsigned>(sc::DType::kCount_));
          if (!sc::dtype_is_quantized(other)) t.dtype = other;
        }
        const std::size_t rank = r.u8() % 4;
        for (std::size_t i = 0; i < rank; ++i) {
          t.shape.push_back(r.u8() % 5);
          t.stride.push_back((f & 2) ? r.u8() % 5 : 0);
        }
        if (!(f & 2)) t.stride = sc::contiguous_strides(t.shape);
        t.storage_offset = r.u8() % 8;
        t.requires_grad = f & 4;
        t.is_parameter = f & 8;
        if (sc::dtype_is_quantized(t.dtype)) {
          t.qscheme = sc::QScheme::kPerTensorAffine;
          t.q_scale = 0.5 + r.u8();
          t.q_zero_point = static_cast<std::int8_t>(r.u8());
        }
        auto node = b.add_tensor(std::move(t));
        if (node)
          stack.push_back(*node);  // views outside the storage are refused: fine
        else
          FUZZ_REQUIRE(node.error().code() == sc::ErrorCode::kInvalidArgument,
                       "add_tensor: " + node.error().to_string());
        break;
      }
      case 20: {  // a meta tensor
        sc::TensorInfo t;
        t.is_meta = true;
        t.device = "meta";
        t.dtype = static_cast<sc::DType>(r.u8() % static_cast<unsigned>(sc::DType::kCount_));
        if (sc::dtype_is_quantized(t.dtype)) t.dtype = sc::DType::kFloat32;
        const std::size_t rank = r.u8() % 3;
        for (std::size_t i = 0; i < rank; ++i) t.shape.push_back(r.u8() % 7);
        t.stride = sc::contiguous_strides(t.shape);
        auto node = b.add_tensor(std::move(t));
        if (node) stack.push_back(*node);
        break;
      }
      case 21:  // share: push an existing value again
        if (!stack.empty()) stack.push_back(stack[r.u8() % stack.size()]);
        break;
      case 22: {  // bool/float special values
        static constexpr double kSpecial[] = {0.0, -0.0, 1e308, -1e-308, 5e-324, 0.1};
        stack.push_back(b.floating(kSpecial[r.u8() % 6]));
        break;
      }
      default:
        if (!stack.empty()) stack.pop_back();
        break;
    }
  }
  if (stack.empty()) return false;
  if (stack.size() == 1) {
    b.set_root(stack.back());
  } else {
    std::vector<sc::NodeId> kv;
    for (std::size_t i = 0; i < stack.size(); ++i) {
      kv.push_back(b.str("v" + std::to_string(i)));
      kv.push_back(stack[i]);
    }
    b.set_root(b.container(sc::Kind::kDict, std::move(kv)));
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  const bool file_mode = in.bit(0);
  sc::SaveOptions so;
  so.fsync = false;
  so.compute_crc32 = !in.bit(1);
  switch ((in.flags >> 2) & 3) {
    case 1: so.storage_alignment = 1; break;
    case 2: so.storage_alignment = 4096; break;
    case 3: so.root_name = "model"; break;
    default: break;
  }
  so.legacy_format = in.bit(5);
  sc::LoadOptions lo;
  lo.limits = sc::fuzz_limits();
  lo.allowlist = &fz::pick_allowlist(in.bit(4));

  sc::Checkpoint original;
  if (file_mode) {
    auto r = sc::load_bytes(in.data, lo);
    if (!r) return 0;
    original = std::move(*r);
  } else {
    sc::CheckpointBuilder b;
    b.set_limits(lo.limits);
    Reader rd(in.data);
    if (!build_tree(rd, b)) return 0;
    auto r = std::move(b).finish();
    FUZZ_REQUIRE(r.has_value(),
                 "CheckpointBuilder::finish refused a tree built through its API: " + r.error().to_string());
    original = std::move(*r);
    fz::check_arena(original.values(), original.root(), false);
    fz::check_tables(original.values(), original.tensors(), original.storages(), {}, lo.limits, false);
  }

  auto saved = sc::save_to_bytes(original, so);
  if (!saved) {
    // Documented refusals: values outside torch's default allowlist (only
    // reachable with the extended allowlist), cycles through tuples, and
    // quantized tensors over mixed-dtype storages — all kUnsupported.
    // Legacy format: a storage viewed as several dtypes or as a dtype
    // without a legacy storage class (torch's _legacy_save refuses them too).
    const bool legacy_refusal = so.legacy_format && saved.error().code() == sc::ErrorCode::kUnsupported &&
                                saved.error().message().find("legacy format") != std::string::npos;
    FUZZ_REQUIRE(legacy_refusal || (file_mode && saved.error().code() == sc::ErrorCode::kUnsupported),
                 "save_to_bytes failed: " + saved.error().to_string());
    return 0;
  }
  auto again = sc::save_to_bytes(original, so);
  FUZZ_REQUIRE(again.has_value() && *again == *saved, "saving the same checkpoint twice gave different bytes");

  sc::LoadOptions lo2 = lo;
  lo2.allowlist = &sc::Allowlist::default_policy();  // a saved file needs nothing beyond torch's default set
  lo2.limits = sc::Limits{};                         // saving may legitimately grow a fuzz-sized input a little
  auto reloaded = sc::load_bytes(sc::Bytes(saved->data(), saved->size()), lo2);
  FUZZ_REQUIRE(reloaded.has_value(), "the saved file does not load: " + reloaded.error().to_string());
  fz::check_tables(reloaded->values(), reloaded->tensors(), reloaded->storages(),
                   sc::Bytes(saved->data(), saved->size()), lo2.limits, true);

  fz::TreeCompare cmp(original, *reloaded);
  const std::string diff = cmp.compare(original.root(), reloaded->root());
  FUZZ_REQUIRE(diff.empty(), "save -> load changed the value: " + diff);

  if (fz::verbose())
    std::fprintf(stderr, "roundtrip: %s, %zu nodes, %zu tensors, %zu storages -> %zu bytes saved, reloaded equal\n",
                 file_mode ? "file" : "built", original.values().size(), original.tensors().size(),
                 original.storages().size(), saved->size());
  auto resaved = sc::save_to_bytes(*reloaded, so);
  FUZZ_REQUIRE(resaved.has_value(), "re-saving the loaded checkpoint failed: " + resaved.error().to_string());
  if (const char* dump = std::getenv("SAFECKPT_FUZZ_DUMP")) {  // triage: write both files
    for (int i = 0; i < 2; ++i) {
      const auto& bytes = i == 0 ? *saved : *resaved;
      if (std::FILE* f = std::fopen((std::string(dump) + (i == 0 ? ".saved.pt" : ".resaved.pt")).c_str(), "wb")) {
        std::fwrite(bytes.data(), 1, bytes.size(), f);
        std::fclose(f);
      }
    }
  }
  if (*resaved != *saved) {
    // Allowed once: saving canonicalizes some representations, e.g. a
    // storage written untyped (_rebuild_tensor_v3 + UntypedStorage) because
    // its only view had another dtype loads back as a uint8 storage, which
    // the next save writes typed (ByteStorage + _rebuild_tensor_v2). The
    // result must then be a fixpoint and still equal the original.
    auto third = sc::load_bytes(sc::Bytes(resaved->data(), resaved->size()), lo2);
    FUZZ_REQUIRE(third.has_value(), "the re-saved file does not load: " + third.error().to_string());
    fz::TreeCompare cmp3(original, *third);
    const std::string diff3 = cmp3.compare(original.root(), third->root());
    FUZZ_REQUIRE(diff3.empty(), "save -> load -> save -> load changed the value: " + diff3);
    auto fourth = sc::save_to_bytes(*third, so);
    FUZZ_REQUIRE(fourth.has_value() && *fourth == *resaved,
                 "saving does not reach a fixpoint: save(load(s)) != s for s = save(load(save(x))) (" +
                     std::to_string(resaved->size()) + " vs " + std::to_string(saved->size()) + " bytes first)");
  }
  return 0;
}
