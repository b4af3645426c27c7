// Safe-globals allowlist: parsing, lookup, and the table of globals the
// library knows how to build (what an allowlist entry is "handled as").
#include "safeckpt/allowlist.hpp"

#include <fstream>
#include <sstream>
#include <string>

namespace safeckpt {
namespace detail {
extern const char kDefaultAllowlist[];
}

namespace {

struct Known {
  std::string_view name;
  Builtin builtin;
};

constexpr Known kKnown[] = {
    {"collections.OrderedDict", Builtin::kOrderedDict},
    {"collections.Counter", Builtin::kCounter},
    {"builtins.set", Builtin::kSet},
    {"builtins.frozenset", Builtin::kFrozenSet},
    {"builtins.bytearray", Builtin::kByteArray},
    {"builtins.complex", Builtin::kComplex},
    {"builtins.slice", Builtin::kSlice},
    {"_codecs.encode", Builtin::kCodecsEncode},
    {"torch.Size", Builtin::kSize},
    {"torch.device", Builtin::kDevice},
    {"torch.Tensor", Builtin::kTensorClass},
    {"torch.nn.parameter.Parameter", Builtin::kParameter},
    {"torch.serialization._get_layout", Builtin::kGetLayout},
    {"torch.storage.TypedStorage", Builtin::kTypedStorage},
    {"torch.storage.UntypedStorage", Builtin::kUntypedStorage},
    {"torch._utils._rebuild_tensor", Builtin::kRebuildTensor},
    {"torch._utils._rebuild_tensor_v2", Builtin::kRebuildTensorV2},
    {"torch._utils._rebuild_tensor_v3", Builtin::kRebuildTensorV3},
    {"torch._utils._rebuild_parameter", Builtin::kRebuildParameter},
    {"torch._utils._rebuild_parameter_with_state", Builtin::kRebuildParameterWithState},
    {"torch._utils._rebuild_qtensor", Builtin::kRebuildQTensor},
    {"torch._utils._rebuild_sparse_tensor", Builtin::kRebuildSparseTensor},
    {"torch._utils._rebuild_meta_tensor_no_storage", Builtin::kRebuildMetaTensorNoStorage},
    {"torch._utils._rebuild_wrapper_subclass", Builtin::kRebuildWrapperSubclass},
    {"torch._utils._rebuild_device_tensor_from_cpu_tensor", Builtin::kRebuildDeviceTensorFromCpuTensor},
    {"torch._utils._rebuild_device_tensor_from_numpy", Builtin::kRebuildDeviceTensorFromNumpy},
    {"torch._tensor._rebuild_from_type_v2", Builtin::kRebuildFromTypeV2},
    {"torch.per_tensor_affine", Builtin::kQScheme},
    {"torch.per_tensor_symmetric", Builtin::kQScheme},
    {"torch.per_channel_affine", Builtin::kQScheme},
    {"torch.per_channel_symmetric", Builtin::kQScheme},
    {"torch.per_channel_affine_float_qparams", Builtin::kQScheme},
    {"numpy._core.multiarray._reconstruct", Builtin::kNumpyReconstruct},
    {"numpy._core.multiarray.scalar", Builtin::kNumpyScalar},
    {"numpy.ndarray", Builtin::kNumpyNdarray},
    {"numpy.dtype", Builtin::kNumpyDtype},
};

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 512 || s.front() == '.' || s.back() == '.') return false;
  bool dot = false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (!ok) return false;
    if (c == '.') dot = true;
  }
  return dot;  // "module.name"
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool lookup_known_global(std::string_view name, Builtin& builtin, DType& dtype) {
  for (const auto& k : kKnown) {
    if (k.name == name) {
      builtin = k.builtin;
      return true;
    }
  }
  // torch.<dtype>
  if (name.rfind("torch.", 0) == 0) {
    std::string_view rest = name.substr(6);
    if (auto d = dtype_from_name(rest)) {
      builtin = Builtin::kDtype;
      dtype = *d;
      return true;
    }
    // torch.FloatStorage / torch.cuda.FloatStorage
    std::string_view cls = rest.rfind("cuda.", 0) == 0 ? rest.substr(5) : rest;
    if (auto d = dtype_from_storage_class(cls)) {
      builtin = Builtin::kStorageClass;
      dtype = *d;
      return true;
    }
    // legacy tensor classes: torch[.cuda][.sparse].XTensor
    std::string_view t = rest;
    if (t.rfind("cuda.", 0) == 0) t.remove_prefix(5);
    if (t.rfind("sparse.", 0) == 0) t.remove_prefix(7);
    if (t.size() > 6 && t.substr(t.size() - 6) == "Tensor" && t.find('.') == std::string_view::npos) {
      builtin = Builtin::kTensorClass;
      return true;
    }
  }
  return false;
}

Status Allowlist::insert(AllowEntry e) {
  auto it = index_.find(e.name);
  if (it != index_.end()) {
    entries_[it->second] = std::move(e);  // later definition wins (like re-adding a safe global)
    return {};
  }
  index_.emplace(e.name, entries_.size());
  entries_.push_back(std::move(e));
  return {};
}

Status Allowlist::add(std::string_view name, std::string_view handled_as, std::string_view source) {
  if (!valid_name(name))
    return make_error(ErrorCode::kInvalidArgument, "not a 'module.qualname' global name: '" + std::string(name) + "'");
  AllowEntry e;
  e.name = std::string(name);
  e.source = std::string(source);
  e.user = source != "default";
  std::string_view as = handled_as.empty() ? name : handled_as;
  if (!lookup_known_global(as, e.builtin, e.dtype)) {
    if (!handled_as.empty())
      return make_error(ErrorCode::kInvalidArgument,
                        "'" + std::string(name) + " = " + std::string(handled_as) +
                            "': the right side is not a global safeckpt knows how to build");
    e.builtin = Builtin::kGeneric;
  }
  e.handled_as = std::string(handled_as);
  return insert(std::move(e));
}

Result<Allowlist> Allowlist::parse(std::string_view text, std::string_view source) {
  Allowlist a;
  std::size_t line_no = 0;
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    std::string comment;
    if (auto h = line.find('#'); h != std::string_view::npos) {
      comment = std::string(trim(line.substr(h + 1)));
      line = line.substr(0, h);
    }
    line = trim(line);
    if (line.empty()) continue;
    std::string_view name = line, as;
    if (auto eq = line.find('='); eq != std::string_view::npos) {
      name = trim(line.substr(0, eq));
      as = trim(line.substr(eq + 1));
    }
    auto st = a.add(name, as, source);
    if (!st)
      return make_error(ErrorCode::kInvalidArgument,
                        std::string(source) + ":" + std::to_string(line_no) + ": " + st.error().message());
    a.entries_.back().comment = comment;
  }
  return a;
}

Result<Allowlist> Allowlist::load_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "cannot read allowlist file " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path.string());
}

void Allowlist::merge(const Allowlist& other) {
  for (const auto& e : other.entries_) (void)insert(e);
}

Status Allowlist::add_file(const std::filesystem::path& path) {
  SAFECKPT_TRY(Allowlist other, load_file(path));
  merge(other);
  return {};
}

const AllowEntry* Allowlist::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

bool Allowlist::is_blocked(std::string_view name) {
  // torch/_weights_only_unpickler.py: `module in {"sys", "os", "posix", "nt"}`
  // (the module part of the GLOBAL; submodules like os.path are modules of
  // their own in Python, but "os.path" as module text is blocked here too:
  // stricter, and no checkpoint needs it).
  for (std::string_view m : {"sys", "os", "posix", "nt"}) {
    if (name.size() > m.size() && name.substr(0, m.size()) == m && name[m.size()] == '.') return true;
  }
  return false;
}

const Allowlist& Allowlist::default_policy() {
  static const Allowlist kDefault = [] {
    auto a = Allowlist::parse(detail::kDefaultAllowlist, "default");
    // The embedded file is checked by tests; a parse failure is a build bug.
    return a ? std::move(a).value() : Allowlist();
  }();
  return kDefault;
}

}  // namespace safeckpt
