// Opcode names and Python-2 name mapping.
#include "pickle/opcodes.hpp"

#include <array>
#include <map>
#include <string>
#include <utility>

#include "safeckpt/pickle.hpp"

namespace safeckpt {

std::string_view opcode_name(std::uint8_t b) noexcept {
  switch (b) {
    case op::kMark: return "MARK";
    case op::kStop: return "STOP";
    case op::kPop: return "POP";
    case op::kPopMark: return "POP_MARK";
    case op::kDup: return "DUP";
    case op::kFloat: return "FLOAT";
    case op::kInt: return "INT";
    case op::kBinInt: return "BININT";
    case op::kBinInt1: return "BININT1";
    case op::kLong: return "LONG";
    case op::kBinInt2: return "BININT2";
    case op::kNone: return "NONE";
    case op::kPersId: return "PERSID";
    case op::kBinPersId: return "BINPERSID";
    case op::kReduce: return "REDUCE";
    case op::kString: return "STRING";
    case op::kBinString: return "BINSTRING";
    case op::kShortBinString: return "SHORT_BINSTRING";
    case op::kUnicode: return "UNICODE";
    case op::kBinUnicode: return "BINUNICODE";
    case op::kAppend: return "APPEND";
    case op::kBuild: return "BUILD";
    case op::kGlobal: return "GLOBAL";
    case op::kDict: return "DICT";
    case op::kEmptyDict: return "EMPTY_DICT";
    case op::kAppends: return "APPENDS";
    case op::kGet: return "GET";
    case op::kBinGet: return "BINGET";
    case op::kInst: return "INST";
    case op::kLongBinGet: return "LONG_BINGET";
    case op::kList: return "LIST";
    case op::kEmptyList: return "EMPTY_LIST";
    case op::kObj: return "OBJ";
    case op::kPut: return "PUT";
    case op::kBinPut: return "BINPUT";
    case op::kLongBinPut: return "LONG_BINPUT";
    case op::kSetItem: return "SETITEM";
    case op::kTuple: return "TUPLE";
    case op::kEmptyTuple: return "EMPTY_TUPLE";
    case op::kSetItems: return "SETITEMS";
    case op::kBinFloat: return "BINFLOAT";
    case op::kProto: return "PROTO";
    case op::kNewObj: return "NEWOBJ";
    case op::kExt1: return "EXT1";
    case op::kExt2: return "EXT2";
    case op::kExt4: return "EXT4";
    case op::kTuple1: return "TUPLE1";
    case op::kTuple2: return "TUPLE2";
    case op::kTuple3: return "TUPLE3";
    case op::kNewTrue: return "NEWTRUE";
    case op::kNewFalse: return "NEWFALSE";
    case op::kLong1: return "LONG1";
    case op::kLong4: return "LONG4";
    case op::kBinBytes: return "BINBYTES";
    case op::kShortBinBytes: return "SHORT_BINBYTES";
    case op::kShortBinUnicode: return "SHORT_BINUNICODE";
    case op::kBinUnicode8: return "BINUNICODE8";
    case op::kBinBytes8: return "BINBYTES8";
    case op::kEmptySet: return "EMPTY_SET";
    case op::kAddItems: return "ADDITEMS";
    case op::kFrozenSet: return "FROZENSET";
    case op::kNewObjEx: return "NEWOBJ_EX";
    case op::kStackGlobal: return "STACK_GLOBAL";
    case op::kMemoize: return "MEMOIZE";
    case op::kFrame: return "FRAME";
    case op::kByteArray8: return "BYTEARRAY8";
    case op::kNextBuffer: return "NEXT_BUFFER";
    case op::kReadonlyBuffer: return "READONLY_BUFFER";
    default: return "";
  }
}

namespace {

using Pair = std::pair<std::string_view, std::string_view>;

// CPython Lib/_compat_pickle.py NAME_MAPPING (entries that map to a different
// module or name; the exception-class renames are omitted: they only move
// names into builtins, which the allowlist refuses either way).
constexpr std::array<std::pair<Pair, Pair>, 24> kNameMapping{{
    {{"__builtin__", "xrange"}, {"builtins", "range"}},
    {{"__builtin__", "reduce"}, {"functools", "reduce"}},
    {{"__builtin__", "intern"}, {"sys", "intern"}},
    {{"__builtin__", "unichr"}, {"builtins", "chr"}},
    {{"__builtin__", "unicode"}, {"builtins", "str"}},
    {{"__builtin__", "long"}, {"builtins", "int"}},
    {{"__builtin__", "basestring"}, {"builtins", "str"}},
    {{"__builtin__", "raw_input"}, {"builtins", "input"}},
    {{"__builtin__", "execfile"}, {"builtins", "exec"}},
    {{"itertools", "izip"}, {"builtins", "zip"}},
    {{"itertools", "imap"}, {"builtins", "map"}},
    {{"itertools", "ifilter"}, {"builtins", "filter"}},
    {{"itertools", "ifilterfalse"}, {"itertools", "filterfalse"}},
    {{"itertools", "izip_longest"}, {"itertools", "zip_longest"}},
    {{"UserDict", "IterableUserDict"}, {"collections", "UserDict"}},
    {{"UserList", "UserList"}, {"collections", "UserList"}},
    {{"UserString", "UserString"}, {"collections", "UserString"}},
    {{"whichdb", "whichdb"}, {"dbm", "whichdb"}},
    {{"_socket", "fromfd"}, {"socket", "fromfd"}},
    {{"_multiprocessing", "Connection"}, {"multiprocessing.connection", "Connection"}},
    {{"multiprocessing.process", "Process"}, {"multiprocessing.context", "Process"}},
    {{"multiprocessing.forking", "Popen"}, {"multiprocessing.popen_fork", "Popen"}},
    {{"urllib", "urlopen"}, {"urllib.request", "urlopen"}},
    {{"urllib", "urlretrieve"}, {"urllib.request", "urlretrieve"}},
}};

// CPython Lib/_compat_pickle.py IMPORT_MAPPING (module renames).
constexpr std::array<Pair, 40> kImportMapping{{
    {"__builtin__", "builtins"},
    {"copy_reg", "copyreg"},
    {"Queue", "queue"},
    {"SocketServer", "socketserver"},
    {"ConfigParser", "configparser"},
    {"repr", "reprlib"},
    {"tkFileDialog", "tkinter.filedialog"},
    {"tkSimpleDialog", "tkinter.simpledialog"},
    {"tkColorChooser", "tkinter.colorchooser"},
    {"tkCommonDialog", "tkinter.commondialog"},
    {"Dialog", "tkinter.dialog"},
    {"Tkdnd", "tkinter.dnd"},
    {"tkFont", "tkinter.font"},
    {"tkMessageBox", "tkinter.messagebox"},
    {"ScrolledText", "tkinter.scrolledtext"},
    {"Tkconstants", "tkinter.constants"},
    {"Tkinter", "tkinter"},
    {"markupbase", "_markupbase"},
    {"_winreg", "winreg"},
    {"thread", "_thread"},
    {"dummy_thread", "_dummy_thread"},
    {"dbhash", "dbm.bsd"},
    {"dumbdbm", "dbm.dumb"},
    {"dbm", "dbm.ndbm"},
    {"gdbm", "dbm.gnu"},
    {"xmlrpclib", "xmlrpc.client"},
    {"SimpleXMLRPCServer", "xmlrpc.server"},
    {"httplib", "http.client"},
    {"htmlentitydefs", "html.entities"},
    {"HTMLParser", "html.parser"},
    {"Cookie", "http.cookies"},
    {"cookielib", "http.cookiejar"},
    {"BaseHTTPServer", "http.server"},
    {"test.test_support", "test.support"},
    {"commands", "subprocess"},
    {"urlparse", "urllib.parse"},
    {"robotparser", "urllib.robotparser"},
    {"urllib2", "urllib.request"},
    {"anydbm", "dbm"},
    {"_abcoll", "collections.abc"},
}};

constexpr std::array<Pair, 9> kImportMapping2{{
    {"cPickle", "pickle"},
    {"_elementtree", "xml.etree.ElementTree"},
    {"FileDialog", "tkinter.filedialog"},
    {"StringIO", "io"},
    {"cStringIO", "io"},
    {"UserDict", "collections"},
    {"UserList", "collections"},
    {"UserString", "collections"},
    {"whichdb", "dbm"},
}};

}  // namespace

std::string canonical_global_name(std::string_view module, std::string_view name, int protocol) {
  if (protocol < 3) {
    for (const auto& [from, to] : kNameMapping)
      if (from.first == module && from.second == name) {
        module = to.first;
        name = to.second;
        goto done;
      }
    for (const auto& [from, to] : kImportMapping)
      if (from == module) {
        module = to;
        goto done;
      }
    for (const auto& [from, to] : kImportMapping2)
      if (from == module) {
        module = to;
        goto done;
      }
  }
done:
  std::string s;
  s.reserve(module.size() + 1 + name.size());
  s.append(module).append(".").append(name);
  return s;
}

}  // namespace safeckpt
