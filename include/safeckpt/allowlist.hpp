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
//
// Construction follows torch.serialization.add_safe_globals: a
// default-constructed Allowlist IS the default policy, and add() / add_file()
// / parse() / load_file() extend it. The policy that refuses every global is
// the explicit Allowlist::none().
//
// Hard block: PyTorch refuses the modules sys, os, posix, nt even when
// allowlisted (torch/_weights_only_unpickler.py, `_get_allowed_globals` /
// the "module in {sys, os, posix, nt}" check, PyTorch 2.5+). safeckpt extends
// that block to every global of the known-dangerous table below whose level is
// kCritical (eval/exec/compile, os/posix/nt/subprocess/pty, runpy, importlib,
// nested loaders such as torch.load / pickle.loads, getattr-style
// introspection, the call gadgets functools.partial and
// copyreg._reconstructor (docs/threats.md: a helper that hides the real call
// or builds any class), network, file writes, native code; see
// find_dangerous_global): add() and the file parser refuse such a name
// (kInvalidArgument saying why), and find() never returns it, so neither the
// loader nor the scanner can treat it as allowed. Reason: an allowlist line
// naming one of these turns a file that runs code into one that "loads"
// (issue 11, items 6 and 8).
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
#include <span>
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
  kDTensor,  // torch.distributed.tensor.DTensor (allowlist/dtensor.allow; src/torch/dtensor.cpp)
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

// How dangerous a known-dangerous global is. kCritical globals are
// hard-blocked (never allowlistable). kUnlisted marks the catch-all rows
// (builtins.*, __builtin__.*): nothing specific is known about the name, so
// refusals treat it like any global outside the allowlist.
enum class Danger : std::uint8_t { kUnlisted, kMedium, kHigh, kCritical };

// One row of the known-dangerous table (policy data, shared by the loader's
// messages and the scanner's catalogue). Sources: docs/threats.md
// (CVE-2025-1716 pip.main, CVE-2025-10157 asyncio, the picklescan/modelscan/
// fickling bypass reports, arXiv 2508.19774).
struct DangerousGlobal {
  std::string_view pattern;   // "module.name" exact, or "module.*" (the module and its submodules)
  std::string_view category;  // exec, process, loader, importer, network, file, native, gadget
  Danger danger;
  std::string_view why;  // what it does when a pickle imports/calls it
};

// The first row matching canonical `name` (exact rows come before the
// wildcards that contain them), or nullptr. Never allocates.
const DangerousGlobal* find_dangerous_global(std::string_view name) noexcept;
// True when `name` matches a row other than a kUnlisted catch-all: refusal
// messages then say the file tries to run code and offer no allowlisting.
bool is_known_dangerous(std::string_view name) noexcept;
// Every row, in lookup order (static storage).
std::span<const DangerousGlobal> dangerous_globals() noexcept;

class Allowlist {
 public:
  // PyTorch's default weights-only set (a copy of default_policy()); add()
  // extends it, as torch.serialization.add_safe_globals does.
  Allowlist();

  // PyTorch 2.6+'s default weights-only set (allowlist/default.allow).
  static const Allowlist& default_policy();
  // The explicit empty policy: refuses every global (add() still works).
  static Allowlist none();

  // Parses allowlist text into a policy: the default set extended by the
  // text's entries (user entries, source `source`). Errors: kInvalidArgument
  // "SOURCE:LINE: ..." (bad name syntax; `= name` that is not a known
  // builtin; a hard-blocked global, with the reason).
  static Result<Allowlist> parse(std::string_view text, std::string_view source);
  // Reads and parses a file (default set + the file). Errors: kIo (cannot
  // open or read; not a regular file: a FIFO or device is refused without
  // being read), kLimitExceeded (above kMaxAllowlistFileBytes),
  // kInvalidArgument.
  static Result<Allowlist> load_file(const std::filesystem::path& path);
  static constexpr std::uint64_t kMaxAllowlistFileBytes = 16u << 20;

  // Like torch.serialization.add_safe_globals: adds `name`, optionally built
  // like the known global `handled_as`. Errors: kInvalidArgument (bad syntax,
  // unknown `handled_as`, or `name` is hard-blocked: is_blocked()).
  Status add(std::string_view name, std::string_view handled_as = {}, std::string_view source = "api");
  // Adds every entry of `other` (entries keep their source).
  void merge(const Allowlist& other);
  // Adds the entries of the file at `path` as user entries. Errors: as load_file.
  Status add_file(const std::filesystem::path& path);

  // nullptr when `name` is not allowlisted (always for a hard-blocked name).
  const AllowEntry* find(std::string_view name) const;
  // True for hard-blocked globals: PyTorch's sys/os/posix/nt modules and
  // every kCritical row of the known-dangerous table.
  static bool is_blocked(std::string_view name);
  // The reason `name` is hard-blocked ("" when it is not): category and what
  // it does, for error messages.
  static std::string blocked_reason(std::string_view name);

  const std::vector<AllowEntry>& entries() const noexcept { return entries_; }

 private:
  struct NoneTag {};
  explicit Allowlist(NoneTag) {}
  static Status parse_into(Allowlist& a, std::string_view text, std::string_view source);
  Status insert(AllowEntry e);
  std::vector<AllowEntry> entries_;
  std::unordered_map<std::string, std::size_t> index_;
};

// How a refused global is described, with the remedy that fits it
// (src/torch/object_model.cpp):
//  - hard-blocked (Allowlist::is_blocked: os.system, builtins.eval,
//    torch.load, ...): "... the file tries to run code ...; it cannot be
//    allowlisted" — no allowlisting is offered;
//  - other known-dangerous globals (find_dangerous_global: functools.partial,
//    builtins.type, ...): says it runs code; no allowlisting offered;
//  - numpy's reconstruct/ndarray/dtype/scalar: points at allowlist/numpy.allow;
//  - anything else: torch.load's words, "... was not an allowed global by
//    default ... allow it with --allow FILE / Allowlist::add(...)".
std::string allow_hint(std::string_view global_name);

// Known globals the library can build, for `= name` mappings and tools.
// Returns false if `name` is not a known global.
bool lookup_known_global(std::string_view name, Builtin& builtin, DType& dtype);

}  // namespace safeckpt
