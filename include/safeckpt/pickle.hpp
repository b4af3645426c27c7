// safeckpt/pickle.hpp — the restricted pickle machine (mechanism, not policy).
//
// The machine knows pickle opcodes (protocols 0-5) and builds plain data into
// a ValueArena. Everything that imports or calls is handed to PickleHooks
// (the policy: the torch object model + the safe-globals allowlist), and
// every import/call is also reported to an optional PickleObserver (the
// scanner), so the loader and the auditor run the very same parser.
//
// Accepted grammar:
//  1. Data opcodes of every protocol: MARK STOP POP POP_MARK DUP, INT LONG
//     FLOAT (text, strict decimal syntax; CPython's readings of other text
//     with PickleOptions::cpython_text_operands), BININT BININT1 BININT2 LONG1 LONG4
//     BINFLOAT, NONE NEWTRUE NEWFALSE, STRING BINSTRING SHORT_BINSTRING
//     (py2 str, decoded as UTF-8 like torch.load's encoding="utf-8"),
//     UNICODE (raw-unicode-escape) BINUNICODE SHORT_BINUNICODE BINUNICODE8
//     (UTF-8, surrogates allowed as Python's "surrogatepass"), BINBYTES
//     SHORT_BINBYTES BINBYTES8 BYTEARRAY8, EMPTY_TUPLE TUPLE TUPLE1-3,
//     EMPTY_LIST LIST APPEND APPENDS, EMPTY_DICT DICT SETITEM SETITEMS,
//     EMPTY_SET ADDITEMS FROZENSET, GET BINGET LONG_BINGET, PUT BINPUT
//     LONG_BINPUT MEMOIZE, PROTO (0..5), FRAME (protocol 4 framing enforced:
//     no opcode or argument may cross a frame end; a new FRAME only at the end
//     of the current one).
//  2. Imports: GLOBAL and STACK_GLOBAL whose two operands are str values
//     (literals, possibly fetched from the memo). Names are mapped like
//     Python's fix_imports when the protocol is < 3, then passed to
//     hooks.resolve_global(). A name containing '.' (attribute walk) is
//     refused. A STACK_GLOBAL operand that is not a str is a dynamic import:
//     refused.
//  3. Calls: REDUCE, NEWOBJ, BUILD go to the hooks; BINPERSID goes to
//     hooks.persistent_load().
//  4. Refused as policy (kDisallowedGlobal / kDisallowedOperation), but fully
//     parsed and reported so a scan can continue: INST, OBJ, NEWOBJ_EX,
//     EXT1/EXT2/EXT4, PERSID (text persistent id), non-constant STACK_GLOBAL.
//     Refused as unsupported: NEXT_BUFFER, READONLY_BUFFER (out-of-band).
//  5. Container rules (torch >= 2.10, CVE-2026-24747): APPEND(S) only onto a
//     list; SETITEM(S) only onto dict/OrderedDict/Counter; ADDITEMS only onto
//     a set. Dict keys and set members must be hashable; equal keys replace
//     (Python's == for numbers/str/bytes/tuples, identity otherwise).
//  6. The stream ends at STOP with exactly one value on the stack and no open
//     MARK; bytes after STOP are left to the caller (legacy files hold several
//     pickles back to back).
// No recursion on input-shaped data; every length is checked against Limits
// and the bytes remaining before anything is allocated.
// Memory: every value node, string, container item, memo entry, stack slot,
// MARK and dict/set key index entry is charged to the run's MemoryBudget
// (limits.max_memory_bytes; unit costs in limits.hpp) before it is made.
// Nodes a hook adds are charged when the hook returns (a hook adds a few
// nodes, or copies one container of at most max_container_items), and
// hooks charge their own side tables through OpContext::budget.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt {

// Where an operation happens: for hooks' error messages and events.
struct OpContext {
  std::string_view record;  // stream name, e.g. "archive/data.pkl"
  std::uint64_t offset;     // byte offset of the opcode in the stream
  std::string_view opcode;  // opcode name
  int protocol;             // protocol in effect (PROTO or 0)
  // The run's memory budget (never null when the machine calls a hook):
  // hooks charge what they allocate beyond value nodes (tensor metadata,
  // array buffers) before allocating it.
  MemoryBudget* budget = nullptr;
};

// Everything a scanner wants to know, emitted whether or not the operation
// is allowed and whether or not its result is ever used.
struct PickleEvent {
  enum class Type : std::uint8_t {
    kImport,  // GLOBAL / STACK_GLOBAL / INST / OBJ class / EXTn
    kCall,    // REDUCE / NEWOBJ / NEWOBJ_EX / OBJ / INST
    kBuild,   // BUILD (state applied to an object)
    kPersistentId,
  };
  Type type;
  std::string opcode;
  std::uint64_t offset;
  // Canonical "module.qualname" after fix_imports (imports), or the callee's
  // canonical name for calls when it is a known global; "<dynamic>" when the
  // name was built at run time; "<ext:N>" for extension codes.
  std::string name;
  std::string raw_module, raw_name;  // as written in the stream (imports)
  bool dynamic = false;              // non-constant STACK_GLOBAL operands
  bool dotted = false;               // name walks attributes ("a.b")
};

class PickleObserver {
 public:
  virtual ~PickleObserver() = default;
  virtual void on_event(const PickleEvent& e) = 0;
  // Only with PickleOptions::cpython_text_operands: a text operand of INT,
  // LONG, FLOAT, GET or PUT that is not what pickle writes, read as CPython's
  // C unpickler reads it. `opcode` names it, `offset` is the opcode's byte
  // offset in the stream, `text` the operand (printable: other bytes as \xNN,
  // at most 40 characters and "..."), `read_as` the value CPython gives it
  // ("16", "True", "1.5", or the memo index).
  virtual void on_text_operand(std::string_view opcode, std::uint64_t offset, std::string_view text,
                               std::string_view read_as) {
    (void)opcode, (void)offset, (void)text, (void)read_as;
  }
};

// The policy side. Each hook returns a node in the machine's arena or an
// Error (policy errors use kDisallowedGlobal / kDisallowedOperation).
class PickleHooks {
 public:
  virtual ~PickleHooks() = default;
  // GLOBAL / STACK_GLOBAL after name mapping: `qualname` = "module.name".
  virtual Result<NodeId> resolve_global(std::string_view qualname, const OpContext& ctx) = 0;
  // REDUCE: callable(*args). `args` is a kTuple node.
  virtual Result<NodeId> call(NodeId callable, NodeId args, const OpContext& ctx) = 0;
  // NEWOBJ: cls.__new__(cls, *args).
  virtual Result<NodeId> new_object(NodeId cls, NodeId args, const OpContext& ctx) = 0;
  // BUILD: apply `state` to `obj` in place (obj stays on the stack).
  virtual Status build(NodeId obj, NodeId state, const OpContext& ctx) = 0;
  // BINPERSID: `pid` is the popped persistent id value.
  virtual Result<NodeId> persistent_load(NodeId pid, const OpContext& ctx) = 0;
  // Implicit constructions by opcode (EMPTY_SET -> "builtins.set",
  // FROZENSET -> "builtins.frozenset", BYTEARRAY8 -> "builtins.bytearray"):
  // allowed only if the same global would be.
  virtual Status require_builtin(std::string_view qualname, const OpContext& ctx) = 0;
};

struct PickleOptions {
  Limits limits;
  std::string record;  // stream name used in errors/events
  // Scanner mode: after a policy error, keep parsing (pushing an opaque
  // kObject placeholder for the refused result) so every import and call is
  // reported. A stream that then reaches STOP returns a PickleResult whose
  // policy_error holds the FIRST policy error (the run did NOT pass the
  // policy) and whose end_offset is where the stream ends, so a caller with
  // several streams back to back needs no second walk; an error that is not
  // a policy error still fails the run.
  bool continue_after_policy_error = false;
  // Charged for everything the run allocates (limits.max_memory_bytes):
  // share one budget across the streams and records of one file. Null: the
  // run uses its own budget of limits.max_memory_bytes. Borrowed; must
  // outlive the call.
  MemoryBudget* budget = nullptr;
  // Scanner mode: read the text operands of INT, LONG, FLOAT, GET and PUT as
  // CPython's C unpickler does (Modules/_pickle.c load_int: strtol base 0,
  // then int(s, 0); load_long: int(s, 0) without the final 'L'; load_float:
  // a NUL ends the number; load_get/load_put: int(s, 10)), so a payload after
  // a form like "I0x10", "I1_0", "L0x10L", "I1\0z" or "F1.5\0x" is still
  // seen; each such operand is reported with on_text_operand(). Off (the
  // loader): only the text pickle writes is accepted (INT/LONG
  // -?(0|[1-9][0-9]*) with an optional final 'L' for LONG, INT 00/01 as
  // bools; FLOAT as Python's float() reads it; GET/PUT decimal digits);
  // anything else is kMalformed.
  bool cpython_text_operands = false;
  // The caller passed only the first limits.max_pickle_bytes bytes of a
  // longer stream (the scanner scans a prefix): running out of bytes is then
  // kLimitExceeded "pickle stream longer than max_pickle_bytes (N)" instead
  // of kMalformed "truncated".
  bool input_cut_at_limit = false;
};

struct PickleResult {
  NodeId root = kNoNode;
  std::uint64_t end_offset = 0;  // offset just past STOP
  int protocol = 0;              // highest PROTO seen (0 if none)
  // Only with continue_after_policy_error: the first policy error
  // (kDisallowedGlobal / kDisallowedOperation, located at its opcode); the
  // root then holds placeholders for what was refused. Empty otherwise.
  std::optional<Error> policy_error;
};

// Runs one pickle stream starting at `data[0]`. Nodes are added to `arena`.
// Errors: kMalformed (bad opcode/argument, truncated stream, stack misuse,
// frame violation — message names the opcode and its offset), kLimitExceeded,
// kUnsupported, policy errors from the hooks or rule 4/5 above (without
// continue_after_policy_error; with it they come in PickleResult::policy_error).
Result<PickleResult> run_pickle(Bytes data, ValueArena& arena, PickleHooks& hooks, PickleObserver* observer,
                                const PickleOptions& options);

// Python-2 name mapping applied for protocols < 3 (Python's _compat_pickle
// NAME_MAPPING / IMPORT_MAPPING, as used by pickle's fix_imports=True).
// Returns the canonical "module.name".
std::string canonical_global_name(std::string_view module, std::string_view name, int protocol);

// Opcode byte -> name ("REDUCE"), or "" for bytes that are not opcodes.
std::string_view opcode_name(std::uint8_t op) noexcept;

}  // namespace safeckpt
