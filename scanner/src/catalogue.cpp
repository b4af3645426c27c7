#include "catalogue.hpp"

#include <string_view>

namespace safeckpt::scan {
namespace {

using S = Severity;

// Exact names first (more specific), then module wildcards. Lookup scans the
// table in order; the first match wins.
constexpr CatalogueEntry kEntries[] = {
    // --- code execution --------------------------------------------------
    {"builtins.eval", "exec", S::kCritical, "evaluates a Python expression from the file"},
    {"builtins.exec", "exec", S::kCritical, "executes Python source from the file"},
    {"builtins.compile", "exec", S::kCritical, "compiles Python source into a code object"},
    {"builtins.__import__", "importer", S::kCritical, "imports any module by name"},
    {"builtins.getattr", "gadget", S::kCritical, "walks attributes: reaches any function of an object or module"},
    {"builtins.setattr", "gadget", S::kCritical, "overwrites attributes of any object or module"},
    {"builtins.delattr", "gadget", S::kHigh, "deletes attributes of any object or module"},
    {"builtins.globals", "gadget", S::kCritical, "exposes the interpreter's globals"},
    {"builtins.locals", "gadget", S::kHigh, "exposes local variables"},
    {"builtins.vars", "gadget", S::kHigh, "exposes an object's namespace"},
    {"builtins.open", "file", S::kCritical, "opens files for reading or writing"},
    {"builtins.breakpoint", "exec", S::kHigh, "starts a debugger"},
    {"builtins.input", "exec", S::kMedium, "reads from stdin"},
    {"builtins.type", "gadget", S::kHigh, "creates classes at run time"},
    {"builtins.object.__reduce_ex__", "gadget", S::kHigh, "reduction gadget"},
    {"io.open", "file", S::kCritical, "opens files for reading or writing"},
    {"io.FileIO", "file", S::kCritical, "opens files for reading or writing"},
    {"_io.open", "file", S::kCritical, "opens files for reading or writing"},
    {"_io.FileIO", "file", S::kCritical, "opens files for reading or writing"},
    {"code.*", "exec", S::kCritical, "interactive interpreter: runs Python source (InteractiveInterpreter.runcode)"},
    {"codeop.*", "exec", S::kCritical, "compiles Python source"},
    {"runpy.*", "exec", S::kCritical, "runs Python modules or code (runpy._run_code)"},
    {"cProfile.*", "exec", S::kCritical, "cProfile.run executes a source string"},
    {"profile.*", "exec", S::kCritical, "profile.run executes a source string"},
    {"timeit.*", "exec", S::kCritical, "timeit executes a source string"},
    {"trace.*", "exec", S::kCritical, "trace runs code"},
    {"pdb.*", "exec", S::kCritical, "debugger: runs arbitrary statements"},
    {"bdb.*", "exec", S::kCritical, "debugger framework: runs code"},
    {"doctest.*", "exec", S::kCritical, "runs examples as code"},
    {"idlelib.*", "exec", S::kCritical, "IDLE internals run code"},
    {"lib2to3.*", "exec", S::kHigh, "lib2to3 gadgets (refactoring runs code paths)"},
    {"types.FunctionType", "exec", S::kCritical, "builds a function from a code object"},
    {"types.CodeType", "exec", S::kCritical, "builds a code object"},
    {"types.*", "gadget", S::kHigh, "creates functions, modules and classes at run time"},
    {"functools.partial", "gadget", S::kHigh, "binds arguments to any callable (hides the real call)"},
    {"functools.reduce", "gadget", S::kHigh, "calls a function repeatedly"},
    {"operator.attrgetter", "gadget", S::kCritical, "walks attributes: reaches any function"},
    {"operator.methodcaller", "gadget", S::kCritical, "calls any method by name"},
    {"operator.itemgetter", "gadget", S::kMedium, "indexes arbitrary objects"},
    {"_operator.attrgetter", "gadget", S::kCritical, "walks attributes: reaches any function"},
    {"_operator.methodcaller", "gadget", S::kCritical, "calls any method by name"},
    {"operator.*", "gadget", S::kHigh, "operator functions combine into arbitrary calls"},
    {"_operator.*", "gadget", S::kHigh, "operator functions combine into arbitrary calls"},
    {"copyreg._reconstructor", "gadget", S::kHigh, "instantiates any class without calling __init__"},
    {"copyreg.*", "gadget", S::kHigh, "pickle reconstruction helpers"},
    {"torch.utils.collect_env.run", "process", S::kCritical, "runs a shell command"},
    {"torch._dynamo.*", "exec", S::kHigh, "compiler internals can run code"},
    {"torch.jit.*", "exec", S::kHigh, "TorchScript compilation/loading runs code"},
    {"torch.hub.*", "network", S::kCritical, "downloads and runs code from the network"},
    {"torch.package.*", "loader", S::kCritical, "loads packaged Python code"},
    // --- processes and shells ---------------------------------------------
    {"os.*", "process", S::kCritical,
     "operating-system access (system, popen, exec*, spawn*, file writes); always blocked"},
    {"posix.*", "process", S::kCritical, "operating-system access; always blocked"},
    {"nt.*", "process", S::kCritical, "operating-system access; always blocked"},
    {"sys.*", "process", S::kCritical, "interpreter internals (modules, settrace); always blocked"},
    {"subprocess.*", "process", S::kCritical, "runs processes"},
    {"_posixsubprocess.*", "process", S::kCritical, "runs processes"},
    {"pty.*", "process", S::kCritical, "spawns processes on a pseudo-terminal"},
    {"commands.*", "process", S::kCritical, "runs shell commands (Python 2)"},
    {"popen2.*", "process", S::kCritical, "runs shell commands (Python 2)"},
    {"platform.popen", "process", S::kCritical, "runs shell commands"},
    {"multiprocessing.*", "process", S::kCritical, "starts processes"},
    {"asyncio.*", "process", S::kCritical, "asyncio subprocess transports start processes (CVE-2025-10157)"},
    {"signal.*", "process", S::kHigh, "signal handling / process control"},
    {"ctypes.*", "native", S::kCritical, "calls native code and reads/writes memory"},
    {"_ctypes.*", "native", S::kCritical, "calls native code and reads/writes memory"},
    {"cffi.*", "native", S::kCritical, "calls native code"},
    {"pip.*", "process", S::kCritical, "installs packages and runs their code (CVE-2025-1716)"},
    {"pip._internal.*", "process", S::kCritical, "installs packages and runs their code"},
    {"setuptools.*", "process", S::kCritical, "builds and runs package code"},
    {"distutils.*", "process", S::kCritical, "builds and runs package code"},
    {"ensurepip.*", "process", S::kCritical, "installs packages"},
    {"venv.*", "process", S::kHigh, "creates environments and runs pip"},
    {"webbrowser.*", "process", S::kCritical, "starts a browser process / opens URLs"},
    // --- nested loaders --------------------------------------------------
    {"pickle.*", "loader", S::kCritical, "nested unpickler: runs a second-stage pickle"},
    {"_pickle.*", "loader", S::kCritical, "nested unpickler: runs a second-stage pickle"},
    {"cPickle.*", "loader", S::kCritical, "nested unpickler: runs a second-stage pickle"},
    {"dill.*", "loader", S::kCritical, "nested unpickler that also serialises code"},
    {"cloudpickle.*", "loader", S::kCritical, "nested unpickler that also serialises code"},
    {"joblib.*", "loader", S::kCritical, "joblib.load unpickles a second stage"},
    {"shelve.*", "loader", S::kCritical, "shelve unpickles values"},
    {"marshal.*", "loader", S::kCritical, "marshal.loads builds code objects"},
    {"torch.load", "loader", S::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.serialization.load", "loader", S::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.serialization._load", "loader", S::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.serialization._legacy_load", "loader", S::kCritical, "nested torch.load: a second-stage checkpoint"},
    {"torch.storage._load_from_bytes", "loader", S::kCritical, "torch.load of embedded bytes (weights_only=False)"},
    {"numpy.load", "loader", S::kCritical, "numpy.load may unpickle object arrays"},
    {"numpy.lib.npyio.load", "loader", S::kCritical, "numpy.load may unpickle object arrays"},
    {"numpy.core.numeric.load", "loader", S::kCritical, "unpickles data"},
    {"numpy._core.numeric.load", "loader", S::kCritical, "unpickles data"},
    {"numpy.loads", "loader", S::kCritical, "unpickles data"},
    {"pandas.read_pickle", "loader", S::kCritical, "unpickles data"},
    {"jsonpickle.*", "loader", S::kCritical, "jsonpickle decodes to arbitrary objects"},
    {"yaml.*", "loader", S::kHigh, "yaml.load/unsafe_load can construct arbitrary objects"},
    {"keras.*", "loader", S::kHigh, "keras model loading can run Lambda layers"},
    // --- importers and resolvers -------------------------------------------
    {"importlib.*", "importer", S::kCritical, "imports any module by name"},
    {"pkgutil.*", "importer", S::kCritical, "pkgutil.resolve_name resolves any dotted name"},
    {"pydoc.*", "importer", S::kCritical, "pydoc.locate resolves any dotted name"},
    {"imp.*", "importer", S::kCritical, "imports modules"},
    {"zipimport.*", "importer", S::kCritical, "imports code from zip files"},
    {"builtins.*", "gadget", S::kHigh, "Python builtin outside the allowlist"},
    {"__builtin__.*", "gadget", S::kHigh, "Python builtin outside the allowlist"},
    // --- network -----------------------------------------------------------
    {"socket.*", "network", S::kCritical, "opens network connections"},
    {"_socket.*", "network", S::kCritical, "opens network connections"},
    {"ssl.*", "network", S::kHigh, "network connections"},
    {"urllib.*", "network", S::kCritical, "fetches URLs"},
    {"urllib2.*", "network", S::kCritical, "fetches URLs"},
    {"urllib3.*", "network", S::kCritical, "fetches URLs"},
    {"http.*", "network", S::kCritical, "HTTP client/server"},
    {"httplib.*", "network", S::kCritical, "HTTP client"},
    {"requests.*", "network", S::kCritical, "fetches URLs"},
    {"httpx.*", "network", S::kCritical, "fetches URLs"},
    {"aiohttp.*", "network", S::kCritical, "fetches URLs"},
    {"ftplib.*", "network", S::kCritical, "FTP client"},
    {"smtplib.*", "network", S::kCritical, "sends mail"},
    {"telnetlib.*", "network", S::kCritical, "telnet client"},
    {"xmlrpc.*", "network", S::kCritical, "RPC client/server"},
    {"socketserver.*", "network", S::kCritical, "network server"},
    {"huggingface_hub.*", "network", S::kHigh, "downloads files"},
    // --- file writes -------------------------------------------------------
    {"shutil.*", "file", S::kCritical, "copies, moves and deletes files"},
    {"pathlib.*", "file", S::kCritical, "reads, writes and deletes files"},
    {"tempfile.*", "file", S::kHigh, "creates files"},
    {"glob.*", "file", S::kMedium, "lists files"},
    {"fileinput.*", "file", S::kHigh, "reads/rewrites files in place"},
    {"zipfile.*", "file", S::kHigh, "reads and writes archives"},
    {"tarfile.*", "file", S::kHigh, "extracts archives (path traversal)"},
    {"logging.*", "file", S::kMedium, "logging handlers write files"},
    {"sqlite3.*", "file", S::kHigh, "opens databases (files)"},
    {"mmap.*", "file", S::kHigh, "maps files"},
};

bool matches(std::string_view pattern, std::string_view name) {
  if (pattern.size() >= 2 && pattern.substr(pattern.size() - 2) == ".*") {
    std::string_view mod = pattern.substr(0, pattern.size() - 2);
    return name.size() > mod.size() && name.substr(0, mod.size()) == mod && name[mod.size()] == '.';
  }
  return pattern == name;
}

}  // namespace

const CatalogueEntry* catalogue_lookup(std::string_view name) noexcept {
  for (const auto& e : kEntries)
    if (matches(e.pattern, name)) return &e;
  return nullptr;
}

bool is_nested_loader(std::string_view name) noexcept {
  const CatalogueEntry* e = catalogue_lookup(name);
  return e != nullptr && e->category == "loader";
}

}  // namespace safeckpt::scan
