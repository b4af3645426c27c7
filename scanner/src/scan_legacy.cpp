// Legacy sequential-pickle checkpoints and tar checkpoints (see scan.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "catalogue.hpp"
#include "pickle_scan.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/zip.hpp"
#include "scanner.hpp"
#include "util/bytes.hpp"

namespace safeckpt::scan {

std::optional<std::uint32_t> storage_element_size(std::string_view cls) {
  Builtin b;
  DType dt;
  if (cls == "torch.storage.UntypedStorage") return 1;
  if (lookup_known_global(cls, b, dt) && b == Builtin::kStorageClass) return dtype_size(dt);
  if (auto d2 = dtype_from_storage_class(cls.substr(cls.rfind('.') + 1))) return dtype_size(*d2);
  return std::nullopt;
}

// ---- legacy sequential pickles ------------------------------------------------

void Scanner::scan_legacy(Bytes data, const std::string& member, int depth) {
  // torch/serialization.py _legacy_save: magic, protocol, sys_info, object, storage keys, storages.
  std::uint64_t pos = 0;
  std::vector<PidInfo> pids;
  RootInfo key_list;
  std::vector<std::string>& keys = key_list.strs;
  bool keys_ok = false;
  for (int i = 0; i < 5; ++i) {
    if (pos >= data.size()) {
      add(Rule::kMalformed, Severity::kHigh, member,
          "legacy checkpoint ends after " + std::to_string(i) + " of its 5 pickle streams", kIncompleteWhy, pos, i);
      return;
    }
    std::vector<PidInfo> p;
    StreamOutcome o = run_stream(data.subspan(static_cast<std::size_t>(pos)), pos, member, i, depth, &p,
                                 i == 4 ? &key_list : nullptr);
    if (o.status == StreamOutcome::kFailed) {
      add_error(o.error, member, i, pos, kIncompleteWhy);
      return;
    }
    if (i == 4) keys_ok = o.status == StreamOutcome::kDone;
    pids.insert(pids.end(), p.begin(), p.end());
    pos += o.end;
  }
  if (!keys_ok) {
    add(Rule::kMalformed, Severity::kHigh, member,
        "legacy storage-key list (stream 4) is not a list of strings: the storage data cannot be located",
        kIncompleteWhy, pos, 4);
    return;
  }
  std::unordered_map<std::string, std::uint32_t> elem;
  for (const PidInfo& p : pids) {
    if (!p.well_formed) continue;
    if (auto size = storage_element_size(p.storage_type)) elem.emplace(p.key, *size);
  }
  if (keys.size() > opt_.limits.max_legacy_storages) {
    add(Rule::kLimit, Severity::kHigh, member, "more than max_legacy_storages storages", kIncompleteWhy, pos);
    return;
  }
  for (const std::string& k : keys) {
    auto it = elem.find(k);
    if (it == elem.end()) {
      add(Rule::kMalformed, Severity::kHigh, member,
          "legacy storage key '" + k.substr(0, 64) + "' has no persistent id with a known storage type", kIncompleteWhy,
          pos);
      return;
    }
    if (data.size() - pos < 8) {
      add(Rule::kMalformed, Severity::kHigh, member, "legacy storage '" + k.substr(0, 64) + "' is truncated",
          kIncompleteWhy, pos);
      return;
    }
    const std::uint64_t count = util::load_le<std::uint64_t>(data.data() + pos);
    pos += 8;
    if (count > (data.size() - pos) / it->second) {
      add(Rule::kMalformed, Severity::kHigh, member,
          "legacy storage '" + k.substr(0, 64) + "' declares " + std::to_string(count) + " elements of " +
              std::to_string(it->second) + " bytes but only " + std::to_string(data.size() - pos) + " bytes remain",
          kIncompleteWhy, pos - 8);
      return;
    }
    pos += count * it->second;
  }
  if (pos < data.size()) {
    add(Rule::kTrailingData, Severity::kMedium, member,
        std::to_string(data.size() - pos) + " bytes follow the storage data of the legacy checkpoint",
        "torch.load ignores them, other readers may not; they are scanned as further pickle streams", pos);
    scan_streams(data, member, depth, pos, 5, true);
  }
}

// ---- tar ---------------------------------------------------------------------

namespace {

std::uint64_t tar_octal(Bytes h, std::size_t off, std::size_t len, bool& ok) {
  std::uint64_t v = 0;
  std::size_t i = off;
  while (i < off + len && (h[i] == ' ' || h[i] == 0)) ++i;
  bool any = false;
  for (; i < off + len && h[i] >= '0' && h[i] <= '7'; ++i) {
    if (v > (~std::uint64_t{0} >> 3)) {
      ok = false;
      return 0;
    }
    v = v * 8 + (h[i] - '0');
    any = true;
  }
  for (; i < off + len; ++i)
    if (h[i] != ' ' && h[i] != 0) ok = false;
  if (!any) v = 0;
  return v;
}

}  // namespace

void Scanner::scan_tar(Bytes data, const std::string& member, int depth) {
  const std::string prefix = member.empty() ? std::string() : member + "!";
  add(Rule::kUnsupported, Severity::kMedium, member,
      "legacy tar checkpoint (PyTorch < 0.1.10): the loader does not read this format",
      "its pickles are scanned below; convert it with a trusted PyTorch before use");
  std::uint64_t pos = 0;
  std::uint64_t count = 0;
  while (pos + 512 <= data.size()) {
    Bytes h = data.subspan(static_cast<std::size_t>(pos), 512);
    bool zero = std::all_of(h.begin(), h.end(), [](std::uint8_t b) { return b == 0; });
    if (zero) return;  // end-of-archive marker
    if (++count > opt_.limits.max_zip_entries) {
      add(Rule::kLimit, Severity::kHigh, member, "tar with more than max_zip_entries members", kIncompleteWhy, pos);
      return;
    }
    bool ok = true;
    std::uint64_t size = tar_octal(h, 124, 12, ok);
    std::size_t nlen = 0;
    while (nlen < 100 && h[nlen] != 0) ++nlen;
    std::string name(reinterpret_cast<const char*>(h.data()), nlen);
    char type = static_cast<char>(h[156]);
    if (!ok || size > data.size() - pos - 512) {
      add(Rule::kMalformed, Severity::kHigh, prefix + name, "tar header with a bad size field", kIncompleteWhy, pos);
      return;
    }
    Bytes body = data.subspan(static_cast<std::size_t>(pos + 512), static_cast<std::size_t>(size));
    pos += 512 + (size + 511) / 512 * 512;
    if (type != '0' && type != 0) continue;  // pax headers, directories, links: no payload to run
    ++sink_.report().members;
    const std::string m = prefix + name;
    if (name == "pickle" || name == "sys_info") {
      scan_streams(body, m, depth, 0, 0, true);
    } else if (name == "storages" || name == "tensors") {
      // storages: pickle(count); per storage pickle((key, location, type)),
      // i64 count, raw bytes; then pickle(views). tensors: pickle(count);
      // per tensor pickle((key, storage_id, type)), i32 ndim, 4 bytes,
      // ndim*i64 sizes, ndim*i64 strides, i64 offset.
      std::uint64_t p = 0;
      int idx = 0;
      auto one = [&](RootInfo* info) -> StreamOutcome {
        StreamOutcome o = run_stream(body.subspan(static_cast<std::size_t>(p)), p, m, idx, depth, nullptr, info);
        if (o.status == StreamOutcome::kFailed) add_error(o.error, m, idx, p, kIncompleteWhy);
        ++idx;
        p += o.end;
        return o;
      };
      RootInfo head;
      StreamOutcome first = one(&head);
      if (first.status == StreamOutcome::kFailed) continue;
      if (!head.int_value || *head.int_value < 0 ||
          static_cast<std::uint64_t>(*head.int_value) > opt_.limits.max_legacy_storages) {
        add(Rule::kMalformed, Severity::kHigh, m, "tar '" + name + "' does not start with a storage/tensor count",
            kIncompleteWhy, 0, 0);
        continue;
      }
      std::int64_t n = *head.int_value;
      bool bad = false;
      for (std::int64_t k = 0; k < n && !bad; ++k) {
        if (p >= body.size()) {
          bad = true;
          break;
        }
        std::uint64_t rec_start = p;
        RootInfo rec;
        StreamOutcome o = one(&rec);
        if (o.status == StreamOutcome::kFailed) {
          bad = true;
          break;
        }
        if (name == "storages") {
          // Element size from the storage type in the tuple (third item).
          std::uint32_t esz = 0;
          if (!rec.third_global.empty()) {
            std::string_view cls = rec.third_global;
            if (auto d = dtype_from_storage_class(cls.substr(cls.rfind('.') + 1))) esz = dtype_size(*d);
          }
          if (esz == 0 || body.size() - p < 8) {
            add(Rule::kMalformed, Severity::kHigh, m, "tar storage record without a known storage type or size",
                kIncompleteWhy, rec_start);
            bad = true;
            break;
          }
          const std::uint64_t cnt = util::load_le<std::uint64_t>(body.data() + p);
          p += 8;
          if (cnt > (body.size() - p) / esz) {
            add(Rule::kMalformed, Severity::kHigh, m, "tar storage declares more bytes than remain", kIncompleteWhy,
                p - 8);
            bad = true;
            break;
          }
          p += cnt * esz;
        } else {
          if (body.size() - p < 8) {
            bad = true;
            break;
          }
          const std::uint32_t ndim = util::load_le<std::uint32_t>(body.data() + p);
          p += 8;
          if (ndim > opt_.limits.max_tensor_rank || (2ull * ndim + 1) * 8 > body.size() - p) {
            add(Rule::kMalformed, Severity::kHigh, m, "tar tensor record with a bad rank", kIncompleteWhy, p - 8);
            bad = true;
            break;
          }
          p += (2ull * ndim + 1) * 8;
        }
      }
      if (bad) continue;
      if (name == "storages" && p < body.size()) {
        StreamOutcome o = one(nullptr);  // the views list
        if (o.status == StreamOutcome::kFailed) continue;
      }
      if (p < body.size()) scan_streams(body, m, depth, p, idx, true);
    } else {
      Bytes b = body;
      if (sniff_format(b) != FileFormat::kUnknown) dispatch(b, m, depth + 1, false);
    }
  }
  add(Rule::kMalformed, Severity::kHigh, member, "tar archive is truncated (no end-of-archive marker)", kIncompleteWhy,
      pos);
}

}  // namespace safeckpt::scan
