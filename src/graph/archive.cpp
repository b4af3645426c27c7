// PT2 archive reader (torch 2.11 torch/export/pt2_archive/_package.py
// `load_pt2`, `_load_state_dict`, `_load_constants`, `_build_file_map`;
// pt2-format.md §1). The accepted grammar is listed in safeckpt/graph.hpp.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "graph/internal.hpp"
#include "safeckpt/zip.hpp"

namespace safeckpt::graph {
namespace {

using nlohmann::json;

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

Result<std::string> read_text(const ZipArchive& zip, std::string_view name, std::uint64_t cap) {
  const ZipEntry* e = zip.find(name);
  if (e == nullptr)
    return make_error(ErrorCode::kMalformed, "record '" + zip.root() + "/" + std::string(name) + "' is missing");
  if (e->uncompressed_size > cap)
    return make_error(ErrorCode::kLimitExceeded, "record '" + e->name + "' is larger than GraphLimits::max_json_bytes");
  SAFECKPT_TRY(RecordBytes rb, zip.read(*e, true));
  return std::string(reinterpret_cast<const char*>(rb.bytes.data()), rb.bytes.size());
}

// Dense row-major copy of a strided view (sizes/strides/offset in elements)
// of `storage`, after checking the view lies inside it (like checkpoint views,
// safeckpt/checkpoint.hpp).
Result<HostTensor> dense_view(Bytes storage, const TensorMeta& m, std::string_view where, const GraphLimits& limits) {
  std::uint64_t item = dtype_size(m.dtype);
  std::vector<std::int64_t> shape;
  std::uint64_t numel = 1, last = 0;
  for (std::size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d].is_symbolic() || m.strides[d].is_symbolic())
      return make_error(ErrorCode::kMalformed, std::string(where) + ": weight with a symbolic size or stride");
    auto sz = static_cast<std::uint64_t>(m.sizes[d].value);
    shape.push_back(m.sizes[d].value);
    if (__builtin_mul_overflow(numel, sz, &numel) || numel > limits.max_tensor_elements)
      return make_error(ErrorCode::kLimitExceeded,
                        std::string(where) + ": more elements than GraphLimits::max_tensor_elements");
  }
  if (m.storage_offset.is_symbolic())
    return make_error(ErrorCode::kMalformed, std::string(where) + ": symbolic storage_offset");
  if (numel != 0) {
    last = static_cast<std::uint64_t>(m.storage_offset.value);
    for (std::size_t d = 0; d < m.sizes.size(); ++d) {
      std::uint64_t span = 0;
      if (__builtin_mul_overflow(static_cast<std::uint64_t>(m.sizes[d].value - 1),
                                 static_cast<std::uint64_t>(m.strides[d].value), &span) ||
          __builtin_add_overflow(last, span, &last))
        return make_error(ErrorCode::kMalformed, std::string(where) + ": view extent overflows");
    }
    std::uint64_t need = 0;
    if (__builtin_add_overflow(last, 1, &need) || __builtin_mul_overflow(need, item, &need) || need > storage.size())
      return make_error(ErrorCode::kMalformed,
                        std::string(where) + ": view (storage_offset " + std::to_string(m.storage_offset.value) +
                            ", sizes and strides) reaches past its " + std::to_string(storage.size()) + "-byte record");
  }
  HostTensor t;
  t.dtype = m.dtype;
  t.shape = shape;
  t.data = std::make_shared<std::vector<std::uint8_t>>();
  if (numel == 0) return t;
  t.data->reserve(numel * item);  // filled by appends: no zero-fill pass first
  // The innermost dims that are row-major in the record form one run of
  // `run` elements copied at once (the whole tensor for a contiguous weight,
  // the usual case: one memcpy instead of one per element, which made reading
  // GPT-2 124M's archive take seconds). Outer dims: an index counter.
  std::size_t k = shape.size();
  std::uint64_t run = 1;
  while (k > 0 && (shape[k - 1] == 1 || static_cast<std::uint64_t>(m.strides[k - 1].value) == run)) {
    run *= static_cast<std::uint64_t>(shape[k - 1]);
    --k;
  }
  const std::uint64_t run_bytes = run * item;
  std::vector<std::int64_t> idx(k, 0);
  for (std::uint64_t i = 0; i < numel / run; ++i) {
    std::uint64_t off = static_cast<std::uint64_t>(m.storage_offset.value);
    for (std::size_t d = 0; d < k; ++d) off += static_cast<std::uint64_t>(idx[d] * m.strides[d].value);
    const std::uint8_t* from = storage.data() + off * item;
    t.data->insert(t.data->end(), from, from + run_bytes);
    for (std::size_t d = k; d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return t;
}

// Reads one weights/constants config and its records.
Status read_config(const ZipArchive& zip, std::string_view dir, std::string_view config_name, std::string_view prefix,
                   bool constants, std::vector<ArchiveTensor>& out, const GraphLimits& limits) {
  std::string cfg_path = std::string(dir) + std::string(config_name);
  if (zip.find(cfg_path) == nullptr) return {};  // absent: no weights (torch writes it always; tolerate)
  SAFECKPT_TRY(std::string text, read_text(zip, cfg_path, limits.max_json_bytes));
  SAFECKPT_TRY(json j, detail::parse_json(text, cfg_path, limits));
  auto bad = [&](std::string what) {
    return make_error(ErrorCode::kMalformed, cfg_path + ": " + what, Location{zip.root() + "/" + cfg_path});
  };
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) return bad("expected {\"config\": {...}}");
  const json& cfg = j["config"];
  if (cfg.size() > limits.max_inputs)
    return make_error(ErrorCode::kLimitExceeded, cfg_path + ": more entries than GraphLimits::max_inputs");
  std::unordered_map<std::string, std::int32_t> storages;  // record -> first tensor index owning it
  // Plain records are read (CRC-32 checked) and copied out after the
  // entries are checked, in parallel when there is much to copy: the bytes
  // of a real-size model (GPT-2 124M: 475 MiB) are most of a PT2 archive's
  // read time.
  struct Job {
    std::size_t out_index;
    const ZipEntry* entry;
    std::string where;
  };
  std::vector<Job> jobs;
  std::uint64_t job_bytes = 0;
  std::uint64_t record_bytes = 0, dense_bytes = 0;  // distinct records read; their dense copies
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    const json& e = it.value();
    std::string w = cfg_path + " entry '" + it.key() + "'";
    if (!e.is_object() || !e.contains("path_name") || !e["path_name"].is_string() || !e.contains("use_pickle") ||
        !e["use_pickle"].is_boolean())
      return bad("entry '" + it.key() + "' needs path_name (string) and use_pickle (bool)");
    std::string path = e["path_name"].get<std::string>();
    if (path.substr(0, prefix.size()) != prefix || path.size() == prefix.size() ||
        path.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      return bad("entry '" + it.key() + "': path_name '" + path + "' is not " + std::string(prefix) + "<n>");
    ArchiveTensor t;
    t.fqn = it.key();
    t.is_constant = constants;
    if (auto p = e.find("is_param"); p != e.end() && p->is_boolean()) t.is_param = p->get<bool>();
    std::string rec = std::string(dir) + path;
    const ZipEntry* ze = zip.find(rec);
    if (ze == nullptr) return bad("entry '" + it.key() + "': record '" + rec + "' is missing");
    t.record = ze->name;
    if (e["use_pickle"].get<bool>()) {
      SAFECKPT_TRY(RecordBytes rb, zip.read(*ze, true));
      t.pickled = true;
      // Pickled tensor (tensor subclass): only our restricted loader reads it.
      LoadOptions lo;
      lo.limits = limits.container;
      SAFECKPT_TRY(Checkpoint ck, load_bytes(rb.bytes, lo));
      auto sd = ck.state_dict();
      if (sd.size() != 1 || !sd[0].name.empty())
        return bad("entry '" + it.key() + "': pickled payload is not a single tensor");
      const TensorInfo& ti = ck.tensors()[sd[0].tensor];
      if (ti.layout != Layout::kStrided || ti.is_meta || ti.storage == kNoStorage || dtype_is_quantized(ti.dtype))
        return make_error(ErrorCode::kUnsupported, w + ": pickled payload is not a dense tensor");
      SAFECKPT_TRY(auto bytes, ck.contiguous_bytes(sd[0].tensor));
      t.meta.dtype = ti.dtype;
      for (auto s : ti.shape) t.meta.sizes.push_back(SymInt{s, -1});
      SAFECKPT_TRY(t.tensor, make_host_tensor(ti.dtype, ti.shape, bytes));
      t.storage = static_cast<std::int32_t>(out.size());
      out.push_back(std::move(t));
      continue;
    }
    if (!e.contains("tensor_meta") || e["tensor_meta"].is_null())
      return bad("entry '" + it.key() + "': no tensor_meta");
    SAFECKPT_TRY(t.meta, detail::parse_tensor_meta(e["tensor_meta"], w + ".tensor_meta", nullptr, nullptr, limits));
    auto [sit, fresh] = storages.try_emplace(rec, static_cast<std::int32_t>(out.size()));
    t.storage = sit->second;
    if (fresh) record_bytes += ze->uncompressed_size;
    std::uint64_t dense = dtype_size(t.meta.dtype);
    for (const auto& sz : t.meta.sizes)
      if (!sz.is_symbolic() && __builtin_mul_overflow(dense, static_cast<std::uint64_t>(sz.value), &dense))
        dense = std::numeric_limits<std::uint64_t>::max();
    if (__builtin_add_overflow(dense_bytes, dense, &dense_bytes))
      dense_bytes = std::numeric_limits<std::uint64_t>::max();
    jobs.push_back(Job{out.size(), ze, w});
    job_bytes += ze->uncompressed_size;
    out.push_back(std::move(t));
  }
  // The dense copies against the bytes they come from (GraphLimits::
  // max_view_slack_bytes), before any is made.
  std::uint64_t allowed = 0;
  if (__builtin_mul_overflow(record_bytes, GraphLimits::kViewAmplification, &allowed) ||
      __builtin_add_overflow(allowed, limits.max_view_slack_bytes, &allowed))
    allowed = std::numeric_limits<std::uint64_t>::max();
  if (dense_bytes > allowed)
    return make_error(ErrorCode::kLimitExceeded,
                      cfg_path + ": its entries' views would copy out " + std::to_string(dense_bytes) + " bytes from " +
                          std::to_string(record_bytes) + " bytes of records (more than " +
                          std::to_string(GraphLimits::kViewAmplification) +
                          "x + GraphLimits::max_view_slack_bytes): stride-0 or overlapping views",
                      Location{zip.root() + "/" + cfg_path});
  // One job: the record's bytes (CRC-32), the element-size check, the copy.
  const auto run = [&](const Job& job) -> Status {
    ArchiveTensor& t = out[job.out_index];
    SAFECKPT_TRY(RecordBytes rb, zip.read(*job.entry, true));
    const std::uint64_t item = dtype_size(t.meta.dtype);
    if (item == 0 || rb.bytes.size() % item != 0)
      return bad("entry '" + t.fqn + "': record '" + t.record + "' has " + std::to_string(rb.bytes.size()) +
                 " bytes, not a multiple of the element size " + std::to_string(item));
    SAFECKPT_TRY(t.tensor, dense_view(rb.bytes, t.meta, job.where, limits));
    return {};
  };
  constexpr std::uint64_t kParallelBytes = 64ull << 20;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned nthreads =
      job_bytes >= kParallelBytes ? static_cast<unsigned>(std::min<std::size_t>({hw, 16, jobs.size()})) : 1;
  std::vector<std::optional<Error>> errors(jobs.size());
  std::atomic<std::size_t> next{0};
  const auto worker = [&] {
    for (std::size_t k = next.fetch_add(1); k < jobs.size(); k = next.fetch_add(1)) {
      try {
        Status st = run(jobs[k]);
        if (!st) errors[k] = std::move(st).error();
      } catch (const std::bad_alloc&) {
        errors[k] = Error(ErrorCode::kLimitExceeded, "out of memory reading the PT2 archive's weights");
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < nthreads; ++i) {
    try {
      threads.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // fewer threads: the rest is done here
    }
  }
  worker();
  for (auto& th : threads) th.join();
  for (auto& e : errors)  // the first failing entry in file order, as a sequential read reports it
    if (e) return unexpected(std::move(*e));
  return {};
}

}  // namespace

bool is_pt2_archive(Bytes file, const GraphLimits& limits) {
  if (file.size() < 4 || std::memcmp(file.data(), "PK\3\4", 4) != 0) return false;
  auto zip = ZipArchive::open(file, limits.container);
  return zip && (zip->find("archive_format") != nullptr ||
                 (zip->root().empty() && zip->find_full("serialized_exported_program.json") != nullptr));
}

namespace {

// The torch 2.6/2.7 flat layout (torch/export/__init__.py save() of those
// releases): records at the top level of the zip (no root folder),
// `serialized_exported_program.json` (the ExportedProgram JSON),
// `serialized_state_dict.pt` and `serialized_constants.pt` (torch.save of
// dicts FQN -> tensor), `serialized_example_inputs.pt` (ignored), `version`
// ("<major>.<minor>" of the schema; the major must be 8, as 2.11's load()
// requires it to equal SCHEMA_VERSION[0]), `extra_files/*` (ignored). The
// .pt members are read only by the restricted loader (safeckpt::load_bytes,
// default allowlist); every tensor must be dense and strided.
Status read_flat_tensors(const ZipArchive& zip, const char* record, bool constants, std::vector<ArchiveTensor>& out,
                         const GraphLimits& limits) {
  const ZipEntry* e = zip.find_full(record);
  if (e == nullptr) {
    if (constants) return {};  // an older writer may omit it; the program then binds no constants
    return make_error(ErrorCode::kMalformed, std::string("flat export without ") + record);
  }
  SAFECKPT_TRY(RecordBytes rb, zip.read(*e, true));
  LoadOptions lo;
  lo.limits = limits.container;
  SAFECKPT_TRY(Checkpoint ck, load_bytes(rb.bytes, lo));
  for (const NamedTensor& nt : ck.state_dict()) {
    const TensorInfo& ti = ck.tensors()[nt.tensor];
    const std::string w = std::string(record) + " entry '" + nt.name + "'";
    if (nt.name.empty()) return make_error(ErrorCode::kMalformed, w + ": not a dict of tensors");
    if (ti.layout != Layout::kStrided || ti.is_meta || ti.storage == kNoStorage || dtype_is_quantized(ti.dtype))
      return make_error(ErrorCode::kUnsupported, w + ": not a dense tensor");
    ArchiveTensor t;
    t.fqn = nt.name;
    t.is_constant = constants;
    t.record = e->name;
    t.pickled = true;
    t.meta.dtype = ti.dtype;
    for (std::size_t d = 0; d < ti.shape.size(); ++d) {
      t.meta.sizes.push_back(SymInt{ti.shape[d], -1});
      t.meta.strides.push_back(SymInt{d < ti.stride.size() ? ti.stride[d] : 0, -1});
    }
    SAFECKPT_TRY(auto bytes, ck.contiguous_bytes(nt.tensor));
    SAFECKPT_TRY(t.tensor, make_host_tensor(ti.dtype, ti.shape, bytes));
    t.storage = static_cast<std::int32_t>(out.size());
    out.push_back(std::move(t));
  }
  return {};
}

}  // namespace

Status Pt2Archive::open_flat(const ZipArchive& zip, const GraphLimits& limits) {
  for (const ZipAnomaly& an : zip.anomalies())
    if (an.kind != ZipAnomalyKind::kNoRootFolder)
      return make_error(ErrorCode::kMalformed, std::string(zip_anomaly_name(an.kind)) + ": " + an.detail);
  for (const auto& e : zip.entries())
    if (is_code_record(e.name))
      return make_error(ErrorCode::kUnsupported, "record '" + e.name + "' is compiled or source code",
                        Location{e.name});
  const ZipEntry* ve = zip.find_full("version");
  if (ve == nullptr) return make_error(ErrorCode::kMalformed, "flat export without a version record");
  if (ve->uncompressed_size > 64) return make_error(ErrorCode::kMalformed, "flat export: version record too long");
  SAFECKPT_TRY(RecordBytes vb, zip.read(*ve, true));
  std::string ver(reinterpret_cast<const char*>(vb.bytes.data()), vb.bytes.size());
  if (ver.rfind("8.", 0) != 0)
    return make_error(ErrorCode::kUnsupported,
                      "flat export of schema version '" + ver.substr(0, 16) +
                          "': only major 8 is read (torch 2.11 load() requires the same major)");
  const ZipEntry* je = zip.find_full("serialized_exported_program.json");
  if (je->uncompressed_size > limits.max_json_bytes)
    return make_error(ErrorCode::kLimitExceeded,
                      "record '" + je->name + "' is larger than GraphLimits::max_json_bytes");
  SAFECKPT_TRY(RecordBytes jb, zip.read(*je, true));
  SAFECKPT_TRY(Program p,
               parse_program_json(std::string_view(reinterpret_cast<const char*>(jb.bytes.data()), jb.bytes.size()),
                                  "model", limits));
  std::vector<ArchiveTensor> w;
  SAFECKPT_CHECK(read_flat_tensors(zip, "serialized_state_dict.pt", false, w, limits));
  SAFECKPT_CHECK(read_flat_tensors(zip, "serialized_constants.pt", true, w, limits));
  model_names_.emplace_back("model");
  programs_.push_back(std::make_unique<Program>(std::move(p)));
  weights_.push_back(std::move(w));
  return {};
}

bool is_code_record(std::string_view name) {
  if (name.starts_with("data/aotinductor/") || name.find("/data/aotinductor/") != std::string_view::npos) return true;
  const auto dot = name.rfind('.');
  if (dot == std::string_view::npos || name.find('/', dot) != std::string_view::npos) return false;
  std::string ext(name.substr(dot + 1));
  for (char& ch : ext) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  for (std::string_view x : {"so",  "dll", "dylib", "o",   "obj", "a", "cubin", "ptx", "fatbin", "hsaco",
                             "spv", "cpp", "cc",    "cxx", "cu",  "c", "h",     "hpp", "py",     "pyc"})
    if (ext == x) return true;
  return false;
}

Result<Pt2Archive> Pt2Archive::open(Bytes file, const GraphLimits& limits) {
  try {
    SAFECKPT_TRY(ZipArchive zip, ZipArchive::open(file, limits.container));
    if (zip.root().empty() && zip.find_full("serialized_exported_program.json") != nullptr) {
      Pt2Archive a;
      SAFECKPT_CHECK(a.open_flat(zip, limits));
      return a;
    }
    SAFECKPT_CHECK(zip.require_no_anomalies());
    if (zip.find("serialized_exported_program.json") != nullptr)
      return make_error(ErrorCode::kUnsupported,
                        "serialized_exported_program.json under a root folder: the torch 2.6/2.7 flat layout keeps "
                        "its records at the top level of the zip (no root folder)");
    if (zip.find("archive_format") == nullptr)
      return make_error(ErrorCode::kUnsupported, "not a PT2 archive (no " + zip.root() + "/archive_format record)");
    SAFECKPT_TRY(std::string fmt, read_text(zip, "archive_format", 64));
    if (fmt != "pt2")
      return make_error(ErrorCode::kUnsupported, "archive_format is '" + fmt.substr(0, 16) + "', not 'pt2'");
    SAFECKPT_TRY(std::string ver, read_text(zip, "archive_version", 64));
    if (ver != "0")
      return make_error(ErrorCode::kUnsupported,
                        "archive_version is '" + ver.substr(0, 16) + "'; torch 2.11 reads version \"0\" only");
    if (zip.find("byteorder") != nullptr) {
      SAFECKPT_TRY(std::string bo, read_text(zip, "byteorder", 64));
      if (bo != "little")
        return make_error(ErrorCode::kUnsupported, "byteorder '" + bo.substr(0, 16) + "' (only little)");
    }
    Pt2Archive a;
    std::string models_dir = zip.root() + "/models/";
    for (const auto& e : zip.entries()) {
      std::string_view n = e.name;
      std::string_view rel = n.size() > zip.root().size() + 1 ? n.substr(zip.root().size() + 1) : std::string_view();
      if (is_code_record(rel))
        return make_error(ErrorCode::kUnsupported,
                          "record '" + e.name +
                              "' is compiled or source code (an AOTInductor package): the engine "
                              "runs graphs as data only; export with torch.export.save instead",
                          Location{e.name});
      if (n.substr(0, models_dir.size()) == models_dir && ends_with(n, ".json")) {
        std::string name(n.substr(models_dir.size(), n.size() - models_dir.size() - 5));
        if (name.empty() || name.find('/') != std::string::npos)
          return make_error(ErrorCode::kMalformed, "model record '" + e.name + "' has no plain name");
        a.model_names_.push_back(name);
      }
    }
    if (a.model_names_.empty())
      return make_error(ErrorCode::kMalformed, "PT2 archive without models/<name>.json (an AOTInductor-only package?)");
    for (const auto& name : a.model_names_) {
      SAFECKPT_TRY(std::string text, read_text(zip, "models/" + name + ".json", limits.max_json_bytes));
      SAFECKPT_TRY(Program p, parse_program_json(text, name, limits));
      std::vector<ArchiveTensor> w;
      // Config names of 2.11 (pt2_archive_constants.h WEIGHTS_CONFIG_FILENAME_FORMAT /
      // CONSTANTS_CONFIG_FILENAME_FORMAT), else the legacy ones the same header keeps
      // (`{}_model_param_config.json`, `{}_model_constants_config.json`).
      auto pick = [&](const std::string& dir, const std::string& now, const std::string& legacy) {
        return zip.find(dir + now) == nullptr && zip.find(dir + legacy) != nullptr ? legacy : now;
      };
      SAFECKPT_CHECK(read_config(
          zip, "data/weights/", pick("data/weights/", name + "_weights_config.json", name + "_model_param_config.json"),
          "weight_", false, w, limits));
      SAFECKPT_CHECK(
          read_config(zip, "data/constants/",
                      pick("data/constants/", name + "_constants_config.json", name + "_model_constants_config.json"),
                      "tensor_", true, w, limits));
      a.programs_.push_back(std::make_unique<Program>(std::move(p)));
      a.weights_.push_back(std::move(w));
    }
    return a;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "out of memory reading the PT2 archive");
  }
}

Result<Pt2Archive> Pt2Archive::open_file(const std::filesystem::path& path, const GraphLimits& limits) {
  SAFECKPT_TRY(MappedFile f, MappedFile::open(path));
  auto file = std::make_shared<MappedFile>(std::move(f));
  SAFECKPT_TRY(Pt2Archive a, open(file->bytes(), limits));
  a.file_ = std::move(file);
  return a;
}

Result<const Program*> Pt2Archive::program(std::string_view model) const {
  for (std::size_t i = 0; i < model_names_.size(); ++i)
    if (model_names_[i] == model) return programs_[i].get();
  return make_error(ErrorCode::kInvalidArgument, "no model '" + std::string(model) + "' in the archive");
}

Result<const std::vector<ArchiveTensor>*> Pt2Archive::weights(std::string_view model) const {
  for (std::size_t i = 0; i < model_names_.size(); ++i)
    if (model_names_[i] == model) return &weights_[i];
  return make_error(ErrorCode::kInvalidArgument, "no model '" + std::string(model) + "' in the archive");
}

Result<WeightMap> archive_weights(const Pt2Archive& archive, std::string_view model) {
  SAFECKPT_TRY(const std::vector<ArchiveTensor>* w, archive.weights(model));
  WeightMap m;
  for (const auto& t : *w) m[t.fqn] = t.tensor;
  return m;
}

std::uint64_t HostTensor::numel() const noexcept {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

Result<HostTensor> make_host_tensor(DType dtype, std::vector<std::int64_t> shape, Bytes bytes) {
  std::uint64_t n = 1;
  for (auto s : shape) {
    if (s < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(s), &n))
      return make_error(ErrorCode::kLimitExceeded, "tensor shape overflows");
  }
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(n, dtype_size(dtype), &need) || need != bytes.size())
    return make_error(ErrorCode::kInvalidArgument, "tensor of " + std::to_string(n) + " " +
                                                       std::string(dtype_name(dtype)) + " elements given " +
                                                       std::to_string(bytes.size()) + " bytes");
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = std::make_shared<std::vector<std::uint8_t>>(bytes.begin(), bytes.end());
  return t;
}

Result<WeightMap> checkpoint_weights(const Program& program, const Checkpoint& ckpt, const WeightMap* fallback,
                                     const GraphLimits& limits) {
  (void)limits;
  WeightMap out;
  std::map<std::string, std::uint32_t> named;
  for (const auto& nt : ckpt.state_dict()) named.emplace(nt.name, nt.tensor);
  std::vector<std::string> missing, unexpected, misshapen;
  std::map<std::string, bool> wanted;
  for (const auto& in : program.inputs) {
    if (in.kind == InputKind::kUserInput) continue;
    wanted[in.fqn] = true;
    const TensorMeta& m = program.values[static_cast<std::size_t>(in.value)];
    auto it = named.find(in.fqn);
    if (it == named.end()) {
      bool stateless = in.kind == InputKind::kConstant || (in.kind == InputKind::kBuffer && !in.persistent);
      if (stateless && fallback != nullptr) {
        if (auto f = fallback->find(in.fqn); f != fallback->end()) {
          out[in.fqn] = f->second;
          continue;
        }
      }
      missing.push_back(in.fqn);
      continue;
    }
    const TensorInfo& ti = ckpt.tensors()[it->second];
    bool ok = ti.layout == Layout::kStrided && !ti.is_meta && ti.dtype == m.dtype && ti.shape.size() == m.sizes.size();
    for (std::size_t d = 0; ok && d < ti.shape.size(); ++d)
      ok = !m.sizes[d].is_symbolic() && m.sizes[d].value == ti.shape[d];
    // Strides too (dims of size > 1; a stride of a size-1 dim addresses
    // nothing): the engine binds views of these bytes with the program's
    // recorded layout (the GPU engine without a copy), so a checkpoint tensor
    // laid out differently (say, saved from a transposed view) is refused
    // like a misshapen one rather than silently re-laid out.
    bool strides_ok = true;
    if (ok && ti.stride.size() == ti.shape.size() && m.strides.size() == ti.shape.size()) {
      std::uint64_t numel = 1;
      for (auto v : ti.shape) numel *= static_cast<std::uint64_t>(v);
      for (std::size_t d = 0; numel > 0 && d < ti.shape.size(); ++d)
        if (ti.shape[d] > 1 && (m.strides[d].is_symbolic() || m.strides[d].value != ti.stride[d])) strides_ok = false;
    }
    if (ok && !strides_ok) {
      std::string want = "[", got = "[";
      for (std::size_t d = 0; d < m.strides.size(); ++d)
        want += (d ? "," : "") + (m.strides[d].is_symbolic() ? std::string("?") : std::to_string(m.strides[d].value));
      for (std::size_t d = 0; d < ti.stride.size(); ++d) got += (d ? "," : "") + std::to_string(ti.stride[d]);
      misshapen.push_back(in.fqn + " (program strides " + want + "], checkpoint strides " + got + "])");
      continue;
    }
    if (!ok) {
      std::string want = std::string(dtype_name(m.dtype)) + "[";
      for (std::size_t d = 0; d < m.sizes.size(); ++d)
        want += (d ? "," : "") + (m.sizes[d].is_symbolic() ? std::string("?") : std::to_string(m.sizes[d].value));
      std::string got = std::string(dtype_name(ti.dtype)) + "[";
      for (std::size_t d = 0; d < ti.shape.size(); ++d) got += (d ? "," : "") + std::to_string(ti.shape[d]);
      misshapen.push_back(in.fqn + " (program " + want + "], checkpoint " + got + "])");
      continue;
    }
    SAFECKPT_TRY(auto bytes, ckpt.contiguous_bytes(it->second));
    SAFECKPT_TRY(out[in.fqn], make_host_tensor(ti.dtype, ti.shape, bytes));
  }
  for (const auto& [name, idx] : named)
    if (!wanted.count(name)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && misshapen.empty()) return out;
  std::string msg = "checkpoint does not match the program (load_state_dict strict=True):";
  auto add = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    msg += std::string(" ") + what + ":";
    for (std::size_t i = 0; i < v.size(); ++i) msg += (i ? ", " : " ") + v[i];
    msg += ";";
  };
  add("missing", missing);
  add("unexpected", unexpected);
  add("wrong dtype, shape or strides", misshapen);
  return make_error(ErrorCode::kInvalidArgument, msg);
}

}  // namespace safeckpt::graph
