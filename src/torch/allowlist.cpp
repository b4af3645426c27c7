// Safe-globals allowlist: parsing, lookup, and the table of globals the
// library knows how to build (what an allowlist entry is "handled as").
#include "safeckpt/allowlist.hpp"

#include <string>

#include "safeckpt/mapped_file.hpp"

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
    {"torch.distributed.tensor.DTensor", Builtin::kDTensor},
};

// Exact names first (more specific), then module wildcards; the first match
// wins. kCritical rows are the hard block (allowlist.hpp). Moved here from
// scanner/src/catalogue.cpp so the loader and the scanner read one table.
constexpr DangerousGlobal kDangerous[] = {
    // --- code execution --------------------------------------------------
    {"builtins.eval", "exec", Danger::kCritical, "evaluates a Python expression from the file"},
    {"builtins.exec", "exec", Danger::kCritical, "executes Python source from the file"},
    {"builtins.compile", "exec", Danger::kCritical, "compiles Python source into a code object"},
    {"builtins.__import__", "importer", Danger::kCritical, "imports any module by name"},
    {"builtins.getattr", "gadget", Danger::kCritical, "walks attributes: reaches any function of an object or module"},
    {"builtins.setattr", "gadget", Danger::kCritical, "overwrites attributes of any object or module"},
    {"builtins.delattr", "gadget", Danger::kHigh, "deletes attributes of any object or module"},
    {"builtins.globals", "gadget", Danger::kCritical, "exposes the interpreter's globals"},
    {"builtins.locals", "gadget", Danger::kHigh, "exposes local variables"},
    {"builtins.vars", "gadget", Danger::kHigh, "exposes an object's namespace"},
    {"builtins.open", "file", Danger::kCritical, "opens files for reading or writing"},
    {"builtins.breakpoint", "exec", Danger::kHigh, "starts a debugger"},
    {"builtins.input", "exec", Danger::kMedium, "reads from stdin"},
    {"builtins.type", "gadget", Danger::kHigh, "creates classes at run time"},
    {"builtins.object.__reduce_ex__", "gadget", Danger::kHigh, "reduction gadget"},
    {"io.open", "file", Danger::kCritical, "opens files for reading or writing"},
    {"io.FileIO", "file", Danger::kCritical, "opens files for reading or writing"},
    {"_io.open", "file", Danger::kCritical, "opens files for reading or writing"},
    {"_io.FileIO", "file", Danger::kCritical, "opens files for reading or writing"},
    {"code.*", "exec", Danger::kCritical,
     "interactive interpreter: runs Python source (InteractiveInterpreter.runcode)"},
    {"codeop.*", "exec", Danger::kCritical, "compiles Python source"},
    {"runpy.*", "exec", Danger::kCritical, "runs Python modules or code (runpy._run_code)"},
    {"cProfile.*", "exec", Danger::kCritical, "cProfile.run executes a source string"},
    {"profile.*", "exec", Danger::kCritical, "profile.run executes a source string"},
    {"timeit.*", "exec", Danger::kCritical, "timeit executes a source string"},
    {"trace.*", "exec", Danger::kCritical, "trace runs code"},
    {"pdb.*", "exec", Danger::kCritical, "debugger: runs arbitrary statements"},
    {"bdb.*", "exec", Danger::kCritical, "debugger framework: runs code"},
    {"doctest.*", "exec", Danger::kCritical, "runs examples as code"},
    {"idlelib.*", "exec", Danger::kCritical, "IDLE internals run code"},
    {"lib2to3.*", "exec", Danger::kHigh, "lib2to3 gadgets (refactoring runs code paths)"},
    {"types.FunctionType", "exec", Danger::kCritical, "builds a function from a code object"},
    {"types.CodeType", "exec", Danger::kCritical, "builds a code object"},
    {"types.*", "gadget", Danger::kHigh, "creates functions, modules and classes at run time"},
    // Call gadgets (docs/threats.md: bypasses hide the real call behind a
    // helper): critical, so a user allowlist cannot enable them silently.
    {"functools.partial", "gadget", Danger::kCritical, "binds arguments to any callable (hides the real call)"},
    {"functools.reduce", "gadget", Danger::kHigh, "calls a function repeatedly"},
    {"operator.attrgetter", "gadget", Danger::kCritical, "walks attributes: reaches any function"},
    {"operator.methodcaller", "gadget", Danger::kCritical, "calls any method by name"},
    {"operator.itemgetter", "gadget", Danger::kMedium, "indexes arbitrary objects"},
    {"_operator.attrgetter", "gadget", Danger::kCritical, "walks attributes: reaches any function"},
    {"_operator.methodcaller", "gadget", Danger::kCritical, "calls any method by name"},
    {"operator.*", "gadget", Danger::kHigh, "operator functions combine into arbitrary calls"},
    {"_operator.*", "gadget", Danger::kHigh, "operator functions combine into arbitrary calls"},
    {"copyreg._reconstructor", "gadget", Danger::kCritical, "instantiates any class without calling __init__"},
    {"copyreg.*", "gadget", Danger::kHigh, "pickle reconstruction helpers"},
    {"torch.utils.collect_env.run", "process", Danger::kCritical, "runs a shell command"},
    {"torch._dynamo.*", "exec", Danger::kHigh, "compiler internals can run code"},
    {"torch.jit.*", "exec", Danger::kHigh, "TorchScript compilation/loading runs code"},
    {"torch.hub.*", "network", Danger::kCritical, "downloads and runs code from the network"},
    {"torch.package.*", "loader", Danger::kCritical, "loads packaged Python code"},
    // --- processes and shells ---------------------------------------------
    {"os.*", "process", Danger::kCritical,
     "operating-system access (system, popen, exec*, spawn*, file writes); always blocked"},
    {"posix.*", "process", Danger::kCritical, "operating-system access; always blocked"},
    {"nt.*", "process", Danger::kCritical, "operating-system access; always blocked"},
    {"sys.*", "process", Danger::kCritical, "interpreter internals (modules, settrace); always blocked"},
    {"subprocess.*", "process", Danger::kCritical, "runs processes"},
    {"_posixsubprocess.*", "process", Danger::kCritical, "runs processes"},
    {"pty.*", "process", Danger::kCritical, "spawns processes on a pseudo-terminal"},
    {"commands.*", "process", Danger::kCritical, "runs shell commands (Python 2)"},
    {"popen2.*", "process", Danger::kCritical, "runs shell commands (Python 2)"},
    {"platform.popen", "process", Danger::kCritical, "runs shell commands"},
    {"multiprocessing.*", "process", Danger::kCritical, "starts processes"},
    {"asyncio.*", "process", Danger::kCritical, "asyncio subprocess transports start processes (CVE-2025-10157)"},
    {"signal.*", "process", Danger::kHigh, "signal handling / process control"},
    {"ctypes.*", "native", Danger::kCritical, "calls native code and reads/writes memory"},
    {"_ctypes.*", "native", Danger::kCritical, "calls native code and reads/writes memory"},
    {"cffi.*", "native", Danger::kCritical, "calls native code"},
    {"pip.*", "process", Danger::kCritical, "installs packages and runs their code (CVE-2025-1716)"},
    {"pip._internal.*", "process", Danger::kCritical, "installs packages and runs their code"},
    {"setuptools.*", "process", Danger::kCritical, "builds and runs package code"},
    {"distutils.*", "process", Danger::kCritical, "builds and runs package code"},
    {"ensurepip.*", "process", Danger::kCritical, "installs packages"},
    {"venv.*", "process", Danger::kHigh, "creates environments and runs pip"},
    {"webbrowser.*", "process", Danger::kCritical, "starts a browser process / opens URLs"},
    // --- nested loaders --------------------------------------------------
    {"pickle.*", "loader", Danger::kCritical, "nested unpickler: runs a second-stage pickle"},
    {"_pickle.*", "loader", Danger::kCritical, "nested unpickler: runs a second-stage pickle"},
    {"cPickle.*", "loader", Danger::kCritical, "nested unpickler: runs a second-stage pickle"},
    {"dill.*", "loader", Danger::kCritical, "nested unpickler that also serialises code"},
    {"cloudpickle.*", "loader", Danger::kCritical, "nested unpickler that also serialises code"},
    {"joblib.*", "loader", Danger::kCritical, "joblib.load unpickles a second stage"},
    {"shelve.*", "loader", Danger::kCritical, "shelve unpickles values"},
    {"marshal.*", "loader", Danger::kCritical, "marshal.loads builds code objects"},
    {"torch.load", "loader", Danger::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.serialization.load", "loader", Danger::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.serialization._load", "loader", Danger::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.serialization._legacy_load", "loader", Danger::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.storage._load_from_bytes", "loader", Danger::kCritical,
     "torch.load of embedded bytes (weights_only=False)"},
    {"numpy.load", "loader", Danger::kCritical, "numpy.load may unpickle object arrays"},
    {"numpy.lib.npyio.load", "loader", Danger::kCritical, "numpy.load may unpickle object arrays"},
    {"numpy.core.numeric.load", "loader", Danger::kCritical, "unpickles data"},
    {"numpy._core.numeric.load", "loader", Danger::kCritical, "unpickles data"},
    {"numpy.loads", "loader", Danger::kCritical, "unpickles data"},
    {"pandas.read_pickle", "loader", Danger::kCritical, "unpickles data"},
    {"jsonpickle.*", "loader", Danger::kCritical, "jsonpickle decodes to arbitrary objects"},
    {"yaml.*", "loader", Danger::kHigh, "yaml.load/unsafe_load can construct arbitrary objects"},
    {"keras.*", "loader", Danger::kHigh, "keras model loading can run Lambda layers"},
    // --- importers and resolvers -------------------------------------------
    {"importlib.*", "importer", Danger::kCritical, "imports any module by name"},
    {"pkgutil.*", "importer", Danger::kCritical, "pkgutil.resolve_name resolves any dotted name"},
    {"pydoc.*", "importer", Danger::kCritical, "pydoc.locate resolves any dotted name"},
    {"imp.*", "importer", Danger::kCritical, "imports modules"},
    {"zipimport.*", "importer", Danger::kCritical, "imports code from zip files"},
    {"builtins.*", "gadget", Danger::kUnlisted, "Python builtin outside the allowlist"},
    {"__builtin__.*", "gadget", Danger::kUnlisted, "Python builtin outside the allowlist"},
    // --- network -----------------------------------------------------------
    {"socket.*", "network", Danger::kCritical, "opens network connections"},
    {"_socket.*", "network", Danger::kCritical, "opens network connections"},
    {"ssl.*", "network", Danger::kHigh, "network connections"},
    {"urllib.*", "network", Danger::kCritical, "fetches URLs"},
    {"urllib2.*", "network", Danger::kCritical, "fetches URLs"},
    {"urllib3.*", "network", Danger::kCritical, "fetches URLs"},
    {"http.*", "network", Danger::kCritical, "HTTP client/server"},
    {"httplib.*", "network", Danger::kCritical, "HTTP client"},
    {"requests.*", "network", Danger::kCritical, "fetches URLs"},
    {"httpx.*", "network", Danger::kCritical, "fetches URLs"},
    {"aiohttp.*", "network", Danger::kCritical, "fetches URLs"},
    {"ftplib.*", "network", Danger::kCritical, "FTP client"},
    {"smtplib.*", "network", Danger::kCritical, "sends mail"},
    {"telnetlib.*", "network", Danger::kCritical, "telnet client"},
    {"xmlrpc.*", "network", Danger::kCritical, "RPC client/server"},
    {"socketserver.*", "network", Danger::kCritical, "network server"},
    {"huggingface_hub.*", "network", Danger::kHigh, "downloads files"},
    // --- file writes -------------------------------------------------------
    // A path object is inert; its methods (write_text, unlink) are reachable
    // only through getattr or a dotted name, both refused. Training
    // checkpoints keep PosixPath hyper-parameters: allowlistable.
    {"pathlib.PosixPath", "file", Danger::kHigh, "a path object; its methods read, write and delete files"},
    {"pathlib.WindowsPath", "file", Danger::kHigh, "a path object; its methods read, write and delete files"},
    {"pathlib.PurePosixPath", "file", Danger::kMedium, "a pure path object (no file access)"},
    {"pathlib.PureWindowsPath", "file", Danger::kMedium, "a pure path object (no file access)"},
    {"shutil.*", "file", Danger::kCritical, "copies, moves and deletes files"},
    {"pathlib.*", "file", Danger::kCritical, "reads, writes and deletes files"},
    {"tempfile.*", "file", Danger::kHigh, "creates files"},
    {"glob.*", "file", Danger::kMedium, "lists files"},
    {"fileinput.*", "file", Danger::kHigh, "reads/rewrites files in place"},
    {"zipfile.*", "file", Danger::kHigh, "reads and writes archives"},
    {"tarfile.*", "file", Danger::kHigh, "extracts archives (path traversal)"},
    {"logging.*", "file", Danger::kMedium, "logging handlers write files"},
    {"sqlite3.*", "file", Danger::kHigh, "opens databases (files)"},
    {"mmap.*", "file", Danger::kHigh, "maps files"},
};

bool pattern_matches(std::string_view pattern, std::string_view name) {
  if (pattern.size() >= 2 && pattern.substr(pattern.size() - 2) == ".*") {
    std::string_view mod = pattern.substr(0, pattern.size() - 2);
    return name.size() > mod.size() && name.substr(0, mod.size()) == mod && name[mod.size()] == '.';
  }
  return pattern == name;
}

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

const DangerousGlobal* find_dangerous_global(std::string_view name) noexcept {
  for (const auto& d : kDangerous)
    if (pattern_matches(d.pattern, name)) return &d;
  return nullptr;
}

bool is_known_dangerous(std::string_view name) noexcept {
  const DangerousGlobal* d = find_dangerous_global(name);
  return d != nullptr && d->danger != Danger::kUnlisted;
}

std::span<const DangerousGlobal> dangerous_globals() noexcept {
  return kDangerous;
}

Allowlist::Allowlist() : Allowlist(default_policy()) {}

Allowlist Allowlist::none() {
  return Allowlist(NoneTag{});
}

Status Allowlist::add(std::string_view name, std::string_view handled_as, std::string_view source) {
  if (!valid_name(name))
    return make_error(ErrorCode::kInvalidArgument, "not a 'module.qualname' global name: '" + std::string(name) + "'");
  if (is_blocked(name))
    return make_error(ErrorCode::kInvalidArgument,
                      "'" + std::string(name) + "' cannot be allowlisted: " + blocked_reason(name) +
                          ". A file that imports it tries to run code; it is refused whatever the allowlist says");
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

Status Allowlist::parse_into(Allowlist& a, std::string_view text, std::string_view source) {
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
    a.entries_[a.index_.at(std::string(name))].comment = comment;
  }
  return {};
}

Result<Allowlist> Allowlist::parse(std::string_view text, std::string_view source) {
  Allowlist a;
  SAFECKPT_CHECK(parse_into(a, text, source));
  return a;
}

namespace {
// A regular file of at most kMaxAllowlistFileBytes (MappedFile: a FIFO or
// device is refused, not read until it ends).
Result<std::string> read_text(const std::filesystem::path& path) {
  auto f = MappedFile::open(path);
  if (!f)
    return make_error(ErrorCode::kIo, "cannot read allowlist file " + path.string() + " (" + f.error().message() + ")");
  if (f->size() > Allowlist::kMaxAllowlistFileBytes)
    return make_error(ErrorCode::kLimitExceeded, "allowlist file " + path.string() + ": " + std::to_string(f->size()) +
                                                     " bytes, above " +
                                                     std::to_string(Allowlist::kMaxAllowlistFileBytes));
  return std::string(reinterpret_cast<const char*>(f->bytes().data()), f->size());
}
}  // namespace

Result<Allowlist> Allowlist::load_file(const std::filesystem::path& path) {
  SAFECKPT_TRY(std::string text, read_text(path));
  return parse(text, path.string());
}

void Allowlist::merge(const Allowlist& other) {
  for (const auto& e : other.entries_) (void)insert(e);
}

Status Allowlist::add_file(const std::filesystem::path& path) {
  SAFECKPT_TRY(std::string text, read_text(path));
  // Parse into a copy so a bad line leaves this policy unchanged.
  Allowlist copy = *this;
  SAFECKPT_CHECK(parse_into(copy, text, path.string()));
  *this = std::move(copy);
  return {};
}

const AllowEntry* Allowlist::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end() || is_blocked(name)) return nullptr;
  return &entries_[it->second];
}

bool Allowlist::is_blocked(std::string_view name) {
  // torch/_weights_only_unpickler.py: `module in {"sys", "os", "posix", "nt"}`
  // (the module part of the GLOBAL; "os.path" as module text is blocked here
  // too: stricter, and no checkpoint needs it), extended to every kCritical
  // row of kDangerous (allowlist.hpp, "Hard block").
  for (std::string_view m : {"sys", "os", "posix", "nt"}) {
    if (name.size() > m.size() && name.substr(0, m.size()) == m && name[m.size()] == '.') return true;
  }
  const DangerousGlobal* d = find_dangerous_global(name);
  return d != nullptr && d->danger == Danger::kCritical;
}

std::string Allowlist::blocked_reason(std::string_view name) {
  if (!is_blocked(name)) return {};
  const DangerousGlobal* d = find_dangerous_global(name);
  if (d == nullptr || d->danger != Danger::kCritical)
    return "its module is blocked by PyTorch's weights-only unpickler (sys, os, posix, nt)";
  return "known-dangerous (" + std::string(d->category) + "): " + std::string(d->why);
}

const Allowlist& Allowlist::default_policy() {
  static const Allowlist kDefault = [] {
    Allowlist a = Allowlist::none();
    // The embedded file is checked by tests; a parse failure is a build bug.
    if (!parse_into(a, detail::kDefaultAllowlist, "default")) return Allowlist::none();
    return a;
  }();
  return kDefault;
}

}  // namespace safeckpt
