#include "pickle_scan.hpp"

#include <string>
#include <unordered_set>

#include "catalogue.hpp"
#include "torch/weights_only_rules.hpp"

namespace safeckpt::scan {

// ---- Sink -------------------------------------------------------------------

void Sink::add(Finding f) {
  if (rep_.findings.size() >= kMaxFindings) {
    ++dropped_findings_;
    return;
  }
  rep_.findings.push_back(std::move(f));
}

void Sink::event(Event e) {
  if (!keep_events_) return;
  if (rep_.events.size() >= kMaxEvents) {
    ++dropped_events_;
    return;
  }
  rep_.events.push_back(std::move(e));
}

void Sink::refuse_last_event(std::uint64_t offset) {
  if (!rep_.events.empty() && rep_.events.back().offset == offset) rep_.events.back().allowed = false;
}

void Sink::finish() {
  if (dropped_findings_ > 0) {
    Finding f;
    f.rule = Rule::kLimit;
    f.severity = Severity::kInfo;
    f.message = std::to_string(dropped_findings_) + " more findings were found but not listed (report cap " +
                std::to_string(kMaxFindings) + ")";
    f.why = "the verdict counts them; re-run on a smaller part of the file to list them";
    rep_.findings.push_back(std::move(f));
  }
  if (dropped_events_ > 0) {
    Finding f;
    f.rule = Rule::kLimit;
    f.severity = Severity::kInfo;
    f.message = std::to_string(dropped_events_) + " more imports/calls were seen but not listed (event cap " +
                std::to_string(kMaxEvents) + ")";
    rep_.findings.push_back(std::move(f));
  }
}

// ---- classification ---------------------------------------------------------

bool is_allowed(const Allowlist& allow, std::string_view name) {
  return allow.find(name) != nullptr && !Allowlist::is_blocked(name);
}

namespace {

constexpr std::string_view kResultOf = "result of ";

// Names the machine gives values that are not globals: "<kind_name()>".
bool is_kind_name(std::string_view n) {
  if (n.size() < 3 || n.front() != '<' || n.back() != '>') return false;
  n = n.substr(1, n.size() - 2);
  static const std::unordered_set<std::string_view> kKinds = {"NoneType",
                                                              "bool",
                                                              "int",
                                                              "float",
                                                              "complex",
                                                              "str",
                                                              "bytes",
                                                              "bytearray",
                                                              "list",
                                                              "tuple",
                                                              "set",
                                                              "frozenset",
                                                              "slice",
                                                              "dict",
                                                              "collections.OrderedDict",
                                                              "collections.Counter",
                                                              "torch.Size",
                                                              "torch.dtype",
                                                              "torch.device",
                                                              "torch.layout",
                                                              "torch.qscheme",
                                                              "torch.Tensor",
                                                              "global",
                                                              "object"};
  return kKinds.count(n) != 0;
}

// Only for globals outside the known-dangerous table (those never get an
// allowlisting remedy: issue 11, item 6).
std::string how_to_allow(std::string_view name) {
  if (name.rfind("numpy.", 0) == 0)
    return "the loader refuses it; the file holds numpy arrays or scalars: if you trust it, use --allow numpy "
           "(the bundled allowlist/numpy.allow, which rebuilds arrays as tensors and scalars as numbers)";
  return "the loader refuses it; if you trust this file and the callable is harmless, allow it with --allow " +
         std::string(name) + " or --allow FILE (a line `" + std::string(name) + "`)";
}

}  // namespace

void ScanObserver::finding(Rule r, Severity s, const PickleEvent& e, std::string global, std::string msg,
                           std::string why, std::string category) {
  Finding f;
  f.rule = r;
  f.severity = s;
  f.member = member_;
  f.stream = stream_;
  f.offset = base_ + e.offset;
  f.opcode = e.opcode;
  f.global = std::move(global);
  f.category = std::move(category);
  f.message = std::move(msg);
  f.why = std::move(why);
  sink_.add(std::move(f));
  unsafe_seen = true;
}

void ScanObserver::on_event(const PickleEvent& e) {
  ++events_seen;
  Event ev;
  ev.member = member_;
  ev.stream = stream_;
  ev.offset = base_ + e.offset;
  ev.opcode = e.opcode;
  ev.name = e.name;
  switch (e.type) {
    case PickleEvent::Type::kImport: {
      ev.type = Event::Type::kImport;
      if (e.dynamic) {
        finding(Rule::kImportDynamic, Severity::kCritical, e, "<dynamic>",
                "STACK_GLOBAL imports a name built at run time (operands are not constant strings)",
                "the imported callable cannot be known without executing the pickle; a name computed by a call "
                "(e.g. str.join) evades every name-based scanner");
      } else if (e.name.rfind("<ext:", 0) == 0) {
        finding(Rule::kImportExtension, Severity::kHigh, e, e.name,
                e.opcode + " imports extension-registry code " + e.name.substr(5, e.name.size() - 6),
                "copyreg's extension registry maps numbers to arbitrary globals at load time; the loader refuses "
                "EXT opcodes");
      } else {
        ev.allowed = !e.dotted && is_allowed(allow_, e.name);
        if (e.dotted) {
          const CatalogueEntry* c = catalogue_lookup(e.name);
          finding(Rule::kImportDotted, Severity::kCritical, e, e.name,
                  e.opcode + " imports dotted name '" + e.raw_module + "' '" + e.raw_name + "'",
                  "a dotted name walks attributes from the module, reaching callables that look harmless by "
                  "module name; the loader refuses it" +
                      (c != nullptr ? std::string("; ") + std::string(c->why) : std::string()),
                  c != nullptr ? std::string(c->category) : std::string());
        } else if (!ev.allowed) {
          const CatalogueEntry* c = catalogue_lookup(e.name);
          std::string raw;
          if (!e.raw_module.empty() && e.raw_module + "." + e.raw_name != e.name)
            raw = " (written as '" + e.raw_module + "' '" + e.raw_name + "')";
          std::string blocked = Allowlist::is_blocked(e.name)
                                    ? "; the file tries to run code: this global is hard-blocked and can never be "
                                      "allowlisted"
                                    : "";
          if (c != nullptr) {
            finding(Rule::kImportDangerous, c->severity, e, e.name,
                    e.opcode + " imports " + e.name + raw + ": " + std::string(c->why),
                    is_known_dangerous(e.name)
                        ? "known-dangerous (" + std::string(c->category) + ") and not in the allowlist" + blocked
                        : how_to_allow(e.name),
                    std::string(c->category));
          } else {
            finding(Rule::kImportUnlisted, Severity::kMedium, e, e.name,
                    e.opcode + " imports " + e.name + raw + ", which is not in the allowlist",
                    how_to_allow(e.name) + blocked);
          }
        }
      }
      if (e.opcode == "INST") {
        finding(Rule::kRefusedOpcode, Severity::kHigh, e, e.name, "INST imports and calls " + e.name,
                "protocol-0 INST is an import plus a call in one opcode; torch's weights-only unpickler and the "
                "loader refuse it");
      }
      break;
    }
    case PickleEvent::Type::kCall: {
      ev.type = Event::Type::kCall;
      // REDUCE and NEWOBJ: the loader's rule for the callee
      // (weights_only::check_call), which ScanHooks applies too.
      const bool listed = is_allowed(allow_, e.name);
      Status rule = listed ? weights_only::check_call(*allow_.find(e.name), e.opcode == "NEWOBJ") : Status{};
      ev.allowed = e.opcode != "INST" && e.opcode != "OBJ" && e.opcode != "NEWOBJ_EX" && listed && rule.has_value();
      const CatalogueEntry* c = catalogue_lookup(e.name);
      if (c != nullptr && c->category == "loader") nested_loader_called = true;
      if (e.opcode == "OBJ" || e.opcode == "NEWOBJ_EX") {
        finding(Rule::kRefusedOpcode, Severity::kHigh, e, e.name, e.opcode + " calls " + e.name,
                "the loader never accepts " + e.opcode + " (it builds objects of any class)");
      } else if (listed && !rule) {
        finding(Rule::kCall, Severity::kMedium, e, e.name,
                e.opcode + " calls " + e.name + ": " + rule.error().message(),
                "the global is allowlisted but the weights-only rules do not let " + e.opcode +
                    " call it (a value such as a dtype or qscheme, a class used only as a storage type, or NEWOBJ of "
                    "anything but nn.Parameter and add_safe_globals classes); the loader refuses the file");
      }
      if (!ev.allowed && !listed) {
        std::string what =
            e.name.rfind(kResultOf, 0) == 0 || is_kind_name(e.name) ? "a value (" + e.name + ")" : e.name;
        Severity sev = c != nullptr ? c->severity : Severity::kHigh;
        finding(Rule::kCall, sev, e, e.name, e.opcode + " calls " + what,
                (c != nullptr ? std::string(c->why) + "; " : std::string()) +
                    "the call runs when the file is unpickled, whether or not its result is used",
                c != nullptr ? std::string(c->category) : std::string());
      }
      break;
    }
    case PickleEvent::Type::kBuild: {
      ev.type = Event::Type::kBuild;
      bool value_target = e.name.rfind(kResultOf, 0) == 0 || is_kind_name(e.name);
      ev.allowed = value_target || is_allowed(allow_, e.name);
      if (!ev.allowed) {
        const CatalogueEntry* c = catalogue_lookup(e.name);
        finding(Rule::kCall, c != nullptr ? c->severity : Severity::kHigh, e, e.name,
                "BUILD applies state to an object made by " + e.name,
                "BUILD calls __setstate__ (or sets attributes) on an object of a non-allowlisted type",
                c != nullptr ? std::string(c->category) : std::string());
      }
      break;
    }
    case PickleEvent::Type::kPersistentId: {
      if (e.opcode == "PERSID") {
        finding(Rule::kRefusedOpcode, Severity::kMedium, e, "", "PERSID (text persistent id)",
                "protocol-0 persistent ids are never written by torch.save; the loader refuses them");
      }
      return;  // not an import or call
    }
  }
  sink_.event(std::move(ev));
}

void ScanObserver::on_text_operand(std::string_view opcode, std::uint64_t offset, std::string_view text,
                                   std::string_view read_as) {
  Finding f;
  f.rule = Rule::kRefusedOpcode;
  f.severity = Severity::kMedium;
  f.member = member_;
  f.stream = stream_;
  f.offset = base_ + offset;
  f.opcode = std::string(opcode);
  f.message = std::string(opcode) + " operand '" + std::string(text) +
              "' is not the text pickle writes; CPython reads it as " + std::string(read_as);
  f.why =
      "a non-canonical encoding (hex, octal, '_' separators, whitespace, sign, or text after a NUL) that "
      "CPython's unpickler accepts: it hides values from strict parsers; the loader refuses it, the scan reads "
      "on as pickle.load would";
  sink_.add(std::move(f));
}

// ---- hooks ------------------------------------------------------------------

Result<NodeId> ScanHooks::opaque(std::string what) {
  // The machine's "refused" placeholder form: calls and BUILD on it are
  // reported by the machine and never come back here.
  Node n;
  n.kind = Kind::kObject;
  n.text = "<refused>:" + std::move(what);
  return arena_.add(std::move(n));
}

Result<NodeId> ScanHooks::resolve_global(std::string_view qualname, const OpContext&) {
  Node g;
  g.kind = Kind::kGlobal;
  g.text = std::string(qualname);
  g.i = is_allowed(allow_, qualname) ? 0 : -1;  // -1: the machine treats it as refused
  return arena_.add(std::move(g));
}

// Calls follow the loader's rules (weights_only::check_call): a call the
// loader refuses is returned as its policy error (the machine records it and
// pushes a refused placeholder; ScanObserver reported it as a kCall finding
// from the event). A call it accepts gives a value of the kind the loader's
// object model makes, where that decides later opcodes: dict-like
// containers (SETITEM), user objects and numpy objects (BUILD), bytes
// (embedded payloads); other results are plain objects, which BUILD,
// SETITEM and APPEND refuse as the loader does on tensors and sizes.
Result<NodeId> ScanHooks::do_call(NodeId callable, NodeId args, bool newobj) {
  const Node& c = arena_[callable];
  const AllowEntry* e = c.kind == Kind::kGlobal ? allow_.find(c.text) : nullptr;
  if (e == nullptr) {
    // Not a global (a value: the observer reported the call) or refused.
    std::string name = c.kind == Kind::kGlobal ? c.text : std::string(kind_name(c.kind));
    return opaque(std::string(kResultOf) + name + "()");
  }
  SAFECKPT_CHECK(weights_only::check_call(*e, newobj));
  Node n;
  if (e->user && e->builtin == Builtin::kGeneric) {
    n.kind = Kind::kObject;  // as TorchHooks: a user object, BUILD sets its state
    n.text = e->name;
    n.items = {args, kNoNode};
    return arena_.add(std::move(n));
  }
  switch (e->builtin) {
    case Builtin::kOrderedDict: n.kind = Kind::kOrderedDict; return arena_.add(std::move(n));
    case Builtin::kCounter: n.kind = Kind::kCounter; return arena_.add(std::move(n));
    case Builtin::kSet: n.kind = Kind::kSet; return arena_.add(std::move(n));
    case Builtin::kFrozenSet: n.kind = Kind::kFrozenSet; return arena_.add(std::move(n));
    case Builtin::kByteArray:
    case Builtin::kCodecsEncode: {
      n.kind = e->builtin == Builtin::kCodecsEncode ? Kind::kBytes : Kind::kByteArray;
      // bytes are pickled (protocol 2) as _codecs.encode(str, 'latin1'):
      // recover them so embedded payloads can be scanned.
      const Node& a = arena_[args];
      if (!a.items.empty()) {
        const Node& s = arena_[a.items[0]];
        if (s.kind == Kind::kBytes || s.kind == Kind::kByteArray) {
          n.text = s.text;
        } else if (s.kind == Kind::kStr) {
          // UTF-8 -> latin-1 (code points above 0xFF cannot be latin-1: keep raw).
          const auto* u = reinterpret_cast<const unsigned char*>(s.text.data());
          std::string out;
          out.reserve(s.text.size());
          bool ok = true;
          for (std::size_t i = 0; i < s.text.size();) {
            if (u[i] < 0x80) {
              out.push_back(static_cast<char>(u[i]));
              ++i;
            } else if ((u[i] & 0xE0) == 0xC0 && i + 1 < s.text.size()) {
              unsigned cp = ((u[i] & 0x1Fu) << 6) | (u[i + 1] & 0x3Fu);
              if (cp > 0xFF) ok = false;
              out.push_back(static_cast<char>(cp));
              i += 2;
            } else {
              ok = false;
              break;
            }
          }
          if (ok)
            n.text = std::move(out);
          else
            n.text = s.text;
        }
      }
      return arena_.add(std::move(n));
    }
    default: break;
  }
  n.kind = Kind::kObject;
  n.text = std::string(kResultOf) + e->name + "()";
  const NodeId id = arena_.add(std::move(n));
  if (e->builtin == Builtin::kNumpyDtype || e->builtin == Builtin::kNumpyReconstruct) numpy_objects_.insert(id);
  return id;
}

Result<NodeId> ScanHooks::call(NodeId callable, NodeId args, const OpContext&) {
  return do_call(callable, args, false);
}

Result<NodeId> ScanHooks::new_object(NodeId cls, NodeId args, const OpContext&) {
  return do_call(cls, args, true);
}

Status ScanHooks::build(NodeId obj, NodeId state, const OpContext& ctx) {
  const Node& o = arena_[obj];
  using weights_only::BuildTarget;
  const BuildTarget target = weights_only::build_target(o, numpy_objects_.count(obj) != 0, allow_);
  auto st = weights_only::check_build(target, o.kind == Kind::kObject ? o.text : std::string(kind_name(o.kind)), arena_,
                                      state);
  if (!st && sink_ != nullptr) {
    Finding f;
    f.rule = Rule::kRefusedOperation;
    f.severity = Severity::kHigh;
    f.member = member_;
    f.stream = stream_;
    f.offset = base_ + ctx.offset;
    f.opcode = "BUILD";
    f.message = st.error().message();
    f.why =
        "BUILD calls __setstate__ or sets attributes; the weights-only rules allow it only on OrderedDicts (a dict of "
        "attribute names), numpy arrays and dtypes, and classes allowlisted with add_safe_globals; the loader refuses "
        "this one";
    sink_->refuse_last_event(f.offset);
    sink_->add(std::move(f));
  }
  return st;
}

Result<NodeId> ScanHooks::persistent_load(NodeId pid, const OpContext&) {
  PidInfo info;
  const Node& p = arena_[pid];
  // The loader's policy (torch's too): only ("storage", ...) tuples. Anything
  // else is refused there, so it must not scan clean (fuzz/regressions/differential).
  {
    const Node* tag = p.kind == Kind::kTuple && !p.items.empty() ? &arena_[p.items[0]] : nullptr;
    if (tag == nullptr || !((tag->kind == Kind::kStr || tag->kind == Kind::kBytes) && tag->text == "storage"))
      return make_error(ErrorCode::kDisallowedOperation, "Only persistent_load of storage is allowed");
  }
  if (p.kind == Kind::kTuple && p.items.size() >= 5) {
    const Node& tag = arena_[p.items[0]];
    const Node& type = arena_[p.items[1]];
    const Node& key = arena_[p.items[2]];
    const Node& numel = arena_[p.items[4]];
    bool tag_ok = (tag.kind == Kind::kStr || tag.kind == Kind::kBytes) && tag.text == "storage";
    if (type.kind == Kind::kGlobal) info.storage_type = type.text;
    if (key.kind == Kind::kStr || key.kind == Kind::kBytes) info.key = key.text;
    if (numel.kind == Kind::kInt) info.numel = numel.i;
    info.well_formed = tag_ok && type.kind == Kind::kGlobal && (key.kind == Kind::kStr || key.kind == Kind::kBytes) &&
                       numel.kind == Kind::kInt && numel.i >= 0;
  }
  if (pids.size() < (1u << 22)) pids.push_back(info);
  Node n;
  n.kind = Kind::kStorage;
  n.i = static_cast<std::int64_t>(pids.size());
  return arena_.add(std::move(n));
}

Status ScanHooks::require_builtin(std::string_view qualname, const OpContext& ctx) {
  if (sink_ == nullptr) return {};
  Event ev;
  ev.type = Event::Type::kImport;
  ev.member = member_;
  ev.stream = stream_;
  ev.offset = base_ + ctx.offset;
  ev.opcode = std::string(ctx.opcode);
  ev.name = std::string(qualname);
  ev.allowed = is_allowed(allow_, qualname);
  if (!ev.allowed) {
    Finding f;
    f.rule = Rule::kImportUnlisted;
    f.severity = Severity::kMedium;
    f.member = member_;
    f.stream = stream_;
    f.offset = ev.offset;
    f.opcode = ev.opcode;
    f.global = ev.name;
    f.message = ev.opcode + " constructs " + ev.name + ", which is not in the allowlist";
    f.why = how_to_allow(qualname);
    sink_->add(std::move(f));
  }
  sink_->event(std::move(ev));
  return {};
}

}  // namespace safeckpt::scan
