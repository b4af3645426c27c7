// safeckpt/allowlist.hpp — the safe-globals allowlist (policy as data).
//
// The default policy is PyTorch 2.6+'s weights-only set
// (torch/_weights_only_unpickler.py `_get_allowed_globals`), kept readable in
// allowlist/default.allow and embedded at build time. The loader and the
// scanner consult the same Allowlist object, so "scan clean" and "loads" can
// never disagree.
//
// Lookups are by the exact canonical string "module.qualname" (after
// Python-2 name mapping); a dotted name is never walked, nothing is imported.
// Modules sys, os, posix, nt are blocked even when allowlisted (PyTorch 2.5+).
//
// Allowlist file format (allowlist/*.allow, `--allow FILE`), one entry a line:
//     module.qualname                  # comment
//     module.qualname = known.name     # handled exactly like known.name
// The `= known.name` form mirrors torch's `add_safe_globals([(obj, "name")])`
// tuple: it lets a renamed module (numpy.core vs numpy._core) be built like
// the known one. Blank lines and lines starting with '#' are ignored.
// An entry the library does not know how to build (e.g. argparse.Namespace)
// is returned as a generic kObject node (name, args, state), never executed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"

namespace safeckpt {

// What the loader does with an allowlisted global.
enum class Builtin : std::uint16_t {
  kGeneric = 0,  // allowlisted, not modelled: kObject node
  kOrderedDict,
  kCounter,
  kSet,
  kFrozenSet,
  kByteArray,
  kComplex,
  kSlice,
  kCodecsEncode,
  kSize,
  kDevice,
  kDtype,
  kGetLayout,
  kQScheme,
  kTensorClass,
  kParameter,
  kStorageClass,  // legacy typed storage class (torch.FloatStorage ...): carries a dtype
  kTypedStorage,
  kUntypedStorage,
  kRebuildTensor,
  kRebuildTensorV2,
  kRebuildTensorV3,
  kRebuildParameter,
  kRebuildParameterWithState,
  kRebuildQTensor,
  kRebuildSparseTensor,
  kRebuildMetaTensorNoStorage,
  kRebuildWrapperSubclass,
  kRebuildDeviceTensorFromCpuTensor,
  kRebuildDeviceTensorFromNumpy,
  kRebuildFromTypeV2,
  kNumpyReconstruct,
  kNumpyNdarray,
  kNumpyDtype,
  kNumpyScalar,
  kNumpyDTypeClass,
};

struct AllowEntry {
  std::string name;  // canonical "module.qualname" as it appears in GLOBAL
  Builtin builtin = Builtin::kGeneric;
  DType dtype = DType::kUInt8;  // for kDtype / kStorageClass
  std::string handled_as;       // the known name it is built like ("" = itself)
  std::string comment;
  std::string source;  // "default" or the file/API that added it
  bool user = false;   // added by the user (torch: add_safe_globals)
};

class Allowlist {
 public:
  Allowlist() = default;

  // PyTorch 2.6+'s default weights-only set (allowlist/default.allow).
  static const Allowlist& default_policy();
  // An empty allowlist (refuses every global).
  static Allowlist empty() { return Allowlist(); }

  // Parses allowlist text. Errors: kInvalidArgument naming `source` and the
  // line (bad name syntax, `= name` that is not a known builtin).
  static Result<Allowlist> parse(std::string_view text, std::string_view source);
  // Reads and parses a file. Errors: kIo, kInvalidArgument.
  static Result<Allowlist> load_file(const std::filesystem::path& path);

  // Like torch.serialization.add_safe_globals: adds `name`, optionally built
  // like the known global `handled_as`. Errors: kInvalidArgument.
  Status add(std::string_view name, std::string_view handled_as = {}, std::string_view source = "api");
  // Adds every entry of `other` (entries keep their source).
  void merge(const Allowlist& other);
  // Adds the entries of the file at `path` as user entries.
  Status add_file(const std::filesystem::path& path);

  // nullptr when `name` is not allowlisted.
  const AllowEntry* find(std::string_view name) const;
  // True for globals whose module is blocked regardless of the list
  // (sys, os, posix, nt and their submodules' qualnames "os.x").
  static bool is_blocked(std::string_view name);

  const std::vector<AllowEntry>& entries() const noexcept { return entries_; }

 private:
  Status insert(AllowEntry e);
  std::vector<AllowEntry> entries_;
  std::unordered_map<std::string, std::size_t> index_;
};

// How `torch.load` describes a refused global, with our remedy:
// "... GLOBAL os.system was not an allowed global ... allow it with
// --allow FILE / Allowlist::add(\"os.system\") if you trust this file".
// (Torch layer: src/torch/object_model.cpp; was in checkpoint.hpp.)
std::string allow_hint(std::string_view global_name);

// Known globals the library can build, for `= name` mappings and tools.
// Returns false if `name` is not a known global.
bool lookup_known_global(std::string_view name, Builtin& builtin, DType& dtype);

}  // namespace safeckpt
