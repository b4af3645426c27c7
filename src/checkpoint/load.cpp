// safeckpt::load — format dispatch and the torch.save zip path.
//
// Zip checkpoints (torch/serialization.py `_load`, caffe2 inline_container.cc):
//  1. The archive must have no anomaly (zip.hpp), a root folder, and
//     `version` or `.data/version` with a value in [1, 10]
//     (kMaxSupportedFileFormatVersion).
//  2. `constants.pkl` -> TorchScript: refused (CVE-2025-32434 lesson);
//     PT2/AOTInductor packages refused; no `data.pkl` -> not a checkpoint.
//  3. `byteorder` absent -> little; present -> exactly "little" or "big".
//  4. data.pkl is unpickled with 5-tuple storage pids; storage `key` is the
//     record `data/<key>`, which must exist and be exactly nbytes long.
// Memory (limits.hpp): one MemoryBudget per load is charged for the inflated
// data.pkl (declared size, before inflating), deflated storage records (kept
// in memory), and everything the pickle run allocates. Records other than
// storages are inflated at most max_pickle_record_bytes at a time (transient).
#include <cstring>
#include <optional>
#include <unordered_map>

#include "checkpoint/builder.hpp"
#include "pickle/run_detail.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/zip.hpp"
#include "torch/object_model.hpp"

namespace safeckpt {
namespace {

// The budget's per-storage charge must stay an upper bound of the real cost.
static_assert(2 * sizeof(StorageInfo) <= MemoryBudget::kStorageBytes);

class ZipStorages final : public StorageProvider {
 public:
  ZipStorages(const ZipArchive& zip, TorchTables& tables, LoadBuilder& b, bool big_endian, bool verify_crc,
              const Limits& limits, MemoryBudget& budget)
      : zip_(zip), t_(tables), b_(b), big_(big_endian), verify_(verify_crc), lim_(limits), budget_(budget) {}

  Result<std::uint32_t> storage(std::string_view key, DType dtype, std::uint64_t nbytes, std::string_view location,
                                const OpContext& ctx) override {
    if (auto it = by_key_.find(std::string(key)); it != by_key_.end()) {
      const StorageInfo& s = t_.storages[it->second];
      if (s.dtype != dtype || s.nbytes != nbytes)
        return make_error(ErrorCode::kMalformed,
                          "storage '" + std::string(key) + "' is referenced with different dtypes or sizes");
      return it->second;
    }
    std::string name = "data/" + std::string(key);
    const ZipEntry* e = zip_.find(name);
    if (e == nullptr)
      return make_error(ErrorCode::kMalformed, "storage record '" + zip_.root() + "/" + name + "' is missing");
    if (e->uncompressed_size != nbytes)
      return make_error(ErrorCode::kMalformed, "storage record '" + e->name + "' has " +
                                                   std::to_string(e->uncompressed_size) +
                                                   " bytes but the tensor's persistent id declares " +
                                                   std::to_string(nbytes) + " (numel x element size; CVE-2026-24747)");
    if (nbytes > lim_.max_total_storage_bytes - total_)
      return make_error(ErrorCode::kLimitExceeded, "storages exceed max_total_storage_bytes");
    if (ctx.budget != nullptr)
      SAFECKPT_CHECK(ctx.budget->charge(MemoryBudget::kStorageBytes + 3 * key.size(), "storage metadata"));
    total_ += nbytes;
    // A deflated record (torch.save never writes one) is held in memory:
    // charged before it is inflated (deflate amplifies up to 1032:1).
    if (e->method != 0) SAFECKPT_CHECK(budget_.charge(nbytes, "deflated storage record"));
    // A deflated record is inflated into memory anyway, so its CRC is
    // checked whatever verify_storage_crc says (nothing to save by skipping).
    SAFECKPT_TRY(RecordBytes rb, zip_.read(*e, verify_ || e->method != 0));
    StorageInfo s;
    s.key = std::string(key);
    s.location = std::string(location);
    s.dtype = dtype;
    s.nbytes = nbytes;
    s.record = e->name;
    s.crc32 = e->crc32;
    if (e->method == 0) s.file_offset = e->data_offset;
    if (rb.owned) b_.keep(rb.owned);
    s.bytes = rb.bytes;
    if (big_ && dtype_swap_unit(dtype) > 1) {
      s.swap_unit = dtype_swap_unit(dtype);
      s.bytes = b_.swapped_copy(rb.bytes, s.swap_unit);
    }
    t_.storages.push_back(std::move(s));
    auto idx = static_cast<std::uint32_t>(t_.storages.size() - 1);
    by_key_.emplace(t_.storages.back().key, idx);
    return idx;
  }

 private:
  std::unordered_map<std::string, std::uint32_t> by_key_;  // storages are shared per key
  const ZipArchive& zip_;
  TorchTables& t_;
  LoadBuilder& b_;
  bool big_;
  bool verify_;
  const Limits& lim_;
  MemoryBudget& budget_;
  std::uint64_t total_ = 0;
};

// The load's one machine run (issue 12: a refused stream is not parsed a
// second time to name what was refused). The run is in continue mode, so a
// refused stream is parsed to its end and the message names every refused
// global, not only the first (PyTorch's get_unsafe_globals_in_checkpoint
// lists them all); the error returned is the one a stop-at-first run gives:
// the first policy error when one came before anything else went wrong,
// else that other error. Without a policy error it is exactly a normal run.
class RefusedGlobals final : public PickleObserver {
 public:
  explicit RefusedGlobals(const Allowlist& a) : allow_(a) {}
  void on_event(const PickleEvent& e) override {
    if (e.type != PickleEvent::Type::kImport) return;
    if (!e.dynamic && !e.dotted && allow_.find(e.name) != nullptr && !Allowlist::is_blocked(e.name)) return;
    for (const auto& n : names)
      if (n == e.name) return;
    names.push_back(e.name);
  }
  std::vector<std::string> names;

 private:
  const Allowlist& allow_;
};

Error with_every_name(Error e, const std::vector<std::string>& names) {
  if (names.size() <= 1) return e;
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  return Error(e.code(), e.message() + "\nEvery global this file imports that is not allowlisted: " + all, e.where());
}

Result<PickleResult> run_once(Bytes pickle, ValueArena& arena, PickleHooks& hooks, PickleOptions po,
                              const Allowlist& allow) {
  RefusedGlobals seen(allow);
  po.continue_after_policy_error = true;
  std::optional<Error> refused_first;
  auto run = detail::run_pickle_keeping_policy_error(pickle, arena, hooks, &seen, po, &refused_first);
  if (run && !run->policy_error) return run;
  if (run) return unexpected(with_every_name(std::move(*run->policy_error), seen.names));
  if (!refused_first) return run;  // failed before any policy error
  return unexpected(with_every_name(std::move(*refused_first), seen.names));
}

Result<std::string> small_record(const ZipArchive& zip, const ZipEntry& e, std::size_t max) {
  if (e.uncompressed_size > max)
    return make_error(ErrorCode::kMalformed, "record '" + e.name + "' is unexpectedly large (" +
                                                 std::to_string(e.uncompressed_size) + " bytes)");
  SAFECKPT_TRY(RecordBytes rb, zip.read(e, true));
  return std::string(reinterpret_cast<const char*>(rb.bytes.data()), rb.bytes.size());
}

Result<Checkpoint> load_zip(LoadBuilder& b, Bytes file, const LoadOptions& opt, const Allowlist& allow) {
  SAFECKPT_TRY(ZipArchive zip, ZipArchive::open(file, opt.limits));
  SAFECKPT_CHECK(zip.require_no_anomalies());
  FileFormat kind = classify_zip(zip);
  if (kind == FileFormat::kTorchScriptZip)
    return make_error(ErrorCode::kUnsupported,
                      "TorchScript archive (has constants.pkl and code): it holds executable code; refused. "
                      "torch.load(weights_only=True) refuses it too since 2.6 (CVE-2025-32434)",
                      Location{zip.root() + "/constants.pkl"});
  if (kind == FileFormat::kPt2Archive)
    return make_error(ErrorCode::kUnsupported,
                      "PT2 program (torch.export / AOTInductor package, may hold native code): not a torch.save "
                      "checkpoint; read it as a program with safeckpt::graph::Pt2Archive (safeckpt/graph.hpp) "
                      "or `safeckpt inspect` / `safeckpt run`");
  const ZipEntry* pkl = zip.find("data.pkl");
  if (pkl == nullptr)
    return make_error(ErrorCode::kUnsupported,
                      "zip archive without " + zip.root() + "/data.pkl: not a torch.save checkpoint");

  // version / .data/version (caffe2/serialize/versions.h: 1 <= v <= 10)
  const ZipEntry* ver = zip.find(".data/version");
  if (ver == nullptr) ver = zip.find("version");
  if (ver == nullptr)
    return make_error(ErrorCode::kMalformed, "archive has no 'version' record (PyTorch requires it)",
                      Location{zip.root()});
  SAFECKPT_TRY(std::string vtext, small_record(zip, *ver, 64));
  {
    std::uint64_t v = 0;
    std::size_t i = 0;
    while (i < vtext.size() && vtext[i] >= '0' && vtext[i] <= '9' && v < 1000)
      v = v * 10 + static_cast<std::uint64_t>(vtext[i++] - '0');
    if (i == 0 || v < 1 || v > 10)
      return make_error(ErrorCode::kUnsupported,
                        "archive format version '" + vtext.substr(0, 16) + "' is outside the supported range 1..10",
                        Location{ver->name});
  }
  bool big = false;
  if (const ZipEntry* bo = zip.find("byteorder")) {
    SAFECKPT_TRY(std::string order, small_record(zip, *bo, 16));
    if (order == "big")
      big = true;
    else if (order != "little")
      return make_error(ErrorCode::kMalformed, "byteorder record must be 'little' or 'big'", Location{bo->name});
  }
  // Every record that is not a storage is CRC-checked even when the loader has
  // no use for it (.format_version, .storage_alignment, serialization_id, ...):
  // a damaged archive is refused whole, so the loader and the scanner agree.
  const std::string data_prefix = zip.root() + "/data/";
  // Those records are small metadata; a deflated one is inflated (then
  // freed) under max_pickle_record_bytes, so none can be a deflate bomb.
  // data.pkl itself is read (CRC-checked) below, once, after its budget charge.
  for (const ZipEntry& e : zip.entries()) {
    if (e.name.rfind(data_prefix, 0) == 0 || &e == pkl) continue;
    SAFECKPT_CHECK(zip.read(e, true, opt.limits.max_pickle_record_bytes, "max_pickle_record_bytes"));
  }
  if (pkl->uncompressed_size > opt.limits.max_pickle_bytes)
    return make_error(ErrorCode::kLimitExceeded, "data.pkl larger than max_pickle_bytes", Location{pkl->name});
  MemoryBudget budget(opt.limits.max_memory_bytes);
  if (pkl->method != 0) {
    Status st = budget.charge(pkl->uncompressed_size, "inflated data.pkl");
    if (!st) return unexpected(std::move(st).error().at_record(pkl->name));
  }
  SAFECKPT_TRY(RecordBytes pbytes, zip.read(*pkl, true, opt.limits.max_pickle_record_bytes, "max_pickle_record_bytes"));

  TorchTables tables;
  ZipStorages storages(zip, tables, b, big, opt.verify_storage_crc, opt.limits, budget);
  TorchHooks hooks(b.arena(), tables, allow, &storages, opt.limits, PidForm::kZip);
  PickleOptions po;
  po.limits = opt.limits;
  po.record = pkl->name;
  po.budget = &budget;
  SAFECKPT_TRY(PickleResult pr, run_once(pbytes.bytes, b.arena(), hooks, po, allow));
  if (pr.end_offset != pbytes.bytes.size())
    return make_error(ErrorCode::kMalformed, "bytes after STOP in data.pkl", Location{pkl->name, pr.end_offset});
  return b.finish(FileFormat::kTorchZip, pr.root, std::move(tables));
}

Result<Checkpoint> load_bare_pickle(LoadBuilder& b, Bytes file, const LoadOptions& opt, const Allowlist& allow) {
  TorchTables tables;
  TorchHooks hooks(b.arena(), tables, allow, nullptr, opt.limits, PidForm::kZip);
  MemoryBudget budget(opt.limits.max_memory_bytes);
  PickleOptions po;
  po.limits = opt.limits;
  po.record = "<pickle>";
  po.budget = &budget;
  SAFECKPT_TRY(PickleResult pr, run_once(file, b.arena(), hooks, po, allow));
  if (pr.end_offset != file.size())
    return make_error(ErrorCode::kMalformed, "bytes after the pickle's STOP (several concatenated pickles?)",
                      Location{"<pickle>", pr.end_offset});
  return b.finish(FileFormat::kBarePickle, pr.root, std::move(tables));
}

Result<Checkpoint> load_impl(LoadBuilder& b, const LoadOptions& opt) {
  const Allowlist& allow = opt.allowlist != nullptr ? *opt.allowlist : Allowlist::default_policy();
  Bytes file = b.file_bytes();
  FileFormat f = sniff_format(file);
  switch (f) {
    case FileFormat::kTorchZip:
    case FileFormat::kTorchScriptZip:
    case FileFormat::kPt2Archive:
    case FileFormat::kOtherZip: return load_zip(b, file, opt, allow);
    case FileFormat::kLegacyPickle: return load_legacy(b, file, opt, allow);
    case FileFormat::kBarePickle: return load_bare_pickle(b, file, opt, allow);
    case FileFormat::kEmpty: return make_error(ErrorCode::kMalformed, "empty file");
    default:
      return make_error(ErrorCode::kUnsupported, std::string("not a PyTorch checkpoint: detected ") +
                                                     std::string(file_format_name(f)) +
                                                     " (torch.load cannot read it either)");
  }
}

Result<Checkpoint> run_load(LoadBuilder& b, const LoadOptions& opt, const std::filesystem::path& path = {}) {
  try {
    // Verify-then-load: the digest is taken from the mapping parsed below.
    if (opt.verify_bytes) SAFECKPT_CHECK(opt.verify_bytes(b.file_bytes(), path));
    return load_impl(b, opt);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory while loading");
  }
}

}  // namespace

Result<Checkpoint> load(const std::filesystem::path& path, const LoadOptions& options) {
  SAFECKPT_TRY(MappedFile f, MappedFile::open(path));
  return load_file(std::move(f), options);
}

Result<Checkpoint> load_file(MappedFile file, const LoadOptions& options) {
  const std::filesystem::path path = file.path();
  const std::string name = path.string();
  LoadBuilder b(std::move(file));
  auto r = run_load(b, options, path);
  if (!r && !name.empty()) r.error().at_record(name);
  return r;
}

Result<Checkpoint> load_bytes(Bytes data, const LoadOptions& options) {
  LoadBuilder b(data);
  return run_load(b, options);
}

Result<Checkpoint> load_reader(const std::function<std::int64_t(std::uint8_t*, std::size_t)>& read,
                               std::uint64_t max_bytes, const LoadOptions& options) {
  SAFECKPT_TRY(MappedFile f, MappedFile::from_reader(read, max_bytes));
  LoadBuilder b(std::move(f));
  return run_load(b, options);
}

Result<Checkpoint> load_buffer(std::vector<std::uint8_t> data, const LoadOptions& options) {
  LoadBuilder b(MappedFile::from_buffer(std::move(data)));
  return run_load(b, options);
}

}  // namespace safeckpt
