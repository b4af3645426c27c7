// Pickle streams: each run once through the machine in scanner mode (see scan.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "catalogue.hpp"
#include "pickle_scan.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/zip.hpp"
#include "scanner.hpp"

namespace safeckpt::scan {

// ---- pickle streams ---------------------------------------------------------

StreamOutcome Scanner::run_stream(Bytes data, std::uint64_t base, const std::string& member, int index, int depth,
                                  std::vector<PidInfo>* pids, RootInfo* root_info) {
  StreamOutcome out;
  const std::uint64_t cap = opt_.limits.max_pickle_bytes;
  const bool capped = data.size() > cap;
  Bytes d = capped ? data.first(static_cast<std::size_t>(cap)) : data;
  ValueArena arena;
  ScanHooks hooks(arena, allow_, &sink_);
  hooks.set_place(member, index, base);
  obs_.set_place(member, index, base);
  PickleOptions po;
  po.limits = opt_.limits;
  po.record = member.empty() ? std::string("<file>") : member;
  po.continue_after_policy_error = true;
  po.cpython_text_operands = true;  // see what pickle.load would run (issue 11, item 7)
  po.input_cut_at_limit = capped;   // running out of bytes is the cap, not damage
  const std::uint64_t events_before = obs_.events_seen;
  const bool loader_before = obs_.nested_loader_called;
  obs_.nested_loader_called = false;
  ++sink_.report().pickle_streams;
  // The one run of this stream: its end (where the next stream starts) and
  // its first policy error come back together.
  auto r = run_pickle(d, arena, hooks, &obs_, po);
  if (r && !r->policy_error) {
    out.status = StreamOutcome::kDone;
    out.end = r->end_offset;
    out.root = r->root;
  } else if (r) {
    out.status = StreamOutcome::kPolicyDone;
    out.end = r->end_offset;
    out.error = *r->policy_error;
    // Imports, calls and refused opcodes are reported as events; the
    // container rules (CVE-2026-24747: SETITEM on a tensor, APPEND onto a
    // non-list) surface only as this error.
    static const std::set<std::string, std::less<>> kContainerOps = {"APPEND",   "APPENDS", "SETITEM",   "SETITEMS",
                                                                     "ADDITEMS", "DICT",    "FROZENSET", "BINPERSID"};
    const Error& pe = out.error;
    if (pe.code() == ErrorCode::kDisallowedOperation && kContainerOps.count(pe.where().opcode) != 0) {
      Finding f;
      f.rule = Rule::kRefusedOperation;
      f.severity = Severity::kHigh;
      f.member = member;
      f.stream = index;
      f.offset = pe.where().offset == Location::kNoOffset ? Location::kNoOffset : base + pe.where().offset;
      f.opcode = pe.where().opcode;
      f.message = pe.message();
      f.why = pe.where().opcode == "BINPERSID"
                  ? "the weights-only rules load only (\"storage\", ...) persistent ids; the loader refuses others"
                  : "the weights-only rules allow SETITEM(S) only on dict/OrderedDict/Counter and APPEND(S) only on "
                    "lists; torch < 2.10 did not check (CVE-2026-24747: out-of-bounds tensor write)";
      sink_.add(std::move(f));
    }
  } else {
    out.status = StreamOutcome::kFailed;
    out.error = r.error();
    const Error& e = r.error();
    out.failed_at_start =
        obs_.events_seen == events_before && (e.where().offset == 0 || e.where().offset == Location::kNoOffset);
  }
  if (pids != nullptr) *pids = hooks.pids;
  if (root_info != nullptr && out.status == StreamOutcome::kDone) {
    const Node& root = arena[out.root];
    if (root.kind == Kind::kList)
      for (NodeId id : root.items)
        if (arena[id].kind == Kind::kStr || arena[id].kind == Kind::kBytes) root_info->strs.push_back(arena[id].text);
    if (root.kind == Kind::kInt) root_info->int_value = root.i;
    if (root.kind == Kind::kTuple && root.items.size() == 3 && arena[root.items[2]].kind == Kind::kGlobal)
      root_info->third_global = arena[root.items[2]].text;
  }
  // Embedded payloads: byte strings that are pickles/checkpoints themselves
  // (second stages for pickle.loads, torch.load(BytesIO), ...).
  const bool loader_called = obs_.nested_loader_called;
  obs_.nested_loader_called = loader_before || loader_called;
  {
    std::vector<std::string> payloads;
    for (std::size_t i = 0; i < arena.size(); ++i) {
      const Node& n = arena[static_cast<NodeId>(i)];
      if ((n.kind == Kind::kBytes || n.kind == Kind::kByteArray) && n.text.size() >= 2) {
        Bytes b(reinterpret_cast<const std::uint8_t*>(n.text.data()), n.text.size());
        FileFormat f = sniff_format(b);
        if ((f == FileFormat::kUnknown && !can_start_pickle(b)) || f == FileFormat::kEmpty ||
            f == FileFormat::kSafetensors)
          continue;
        payloads.push_back(n.text);
        if (payloads.size() >= 64) break;
      }
    }
    if (!payloads.empty() && depth >= opt_.max_nesting) {
      add(Rule::kLimit, Severity::kHigh, member,
          std::to_string(payloads.size()) +
              " embedded byte string(s) that look like pickles or checkpoints are "
              "nested deeper than max_nesting (" +
              std::to_string(opt_.max_nesting) + ") and were not examined",
          kIncompleteWhy, Location::kNoOffset, index);
      payloads.clear();
    }
    int k = 0;
    for (const std::string& p : payloads) {
      Bytes b(reinterpret_cast<const std::uint8_t*>(p.data()), p.size());
      std::string sub = (member.empty() ? std::string() : member) + "!bytes#" + std::to_string(k++);
      FileReport nested;
      nested.path = sub;
      ScanOptions o2 = opt_;
      o2.run_loader = false;
      Scanner inner(o2, allow_, nested);
      inner.dispatch(b, sub, depth + 1, false);
      bool unsafe = false;
      for (const Finding& f : nested.findings)
        if (klass_of(f) == Klass::kUnsafe || klass_of(f) == Klass::kUnscannable) unsafe = true;
      if (!unsafe && !loader_called) continue;  // inert data that merely looks like a pickle
      if (unsafe) {
        std::string globals;
        for (const Finding& f : nested.findings)
          if (!f.global.empty() && globals.find(f.global) == std::string::npos && globals.size() < 200)
            globals += (globals.empty() ? "" : ", ") + f.global;
        add(Rule::kEmbeddedPayload, Severity::kCritical, sub,
            "embedded byte string of " + std::to_string(p.size()) + " bytes is a " +
                std::string(file_format_name(sniff_format(b))) + " with findings" +
                (globals.empty() ? std::string() : " (" + globals + ")"),
            "a nested loader (pickle.loads, torch.load, ...) reached from this pickle runs it as a second stage",
            Location::kNoOffset, index);
      }
      for (Finding& f : nested.findings) sink_.add(std::move(f));
      for (Event& e : nested.events) sink_.event(std::move(e));
      sink_.report().pickle_streams += nested.pickle_streams;
    }
  }
  return out;
}

bool Scanner::scan_streams(Bytes data, const std::string& member, int depth, std::uint64_t start, int first_index,
                           bool trailing_is_finding, std::vector<PidInfo>* pids) {
  std::uint64_t pos = start;
  int index = first_index;
  while (pos < data.size()) {
    std::vector<PidInfo> p;
    StreamOutcome o = run_stream(data.subspan(static_cast<std::size_t>(pos)), pos, member, index, depth, &p);
    if (pids != nullptr) pids->insert(pids->end(), p.begin(), p.end());
    if (o.status == StreamOutcome::kFailed) {
      if (index > first_index && o.failed_at_start) {
        if (trailing_is_finding)
          add(Rule::kTrailingData, Severity::kMedium, member,
              std::to_string(data.size() - pos) + " bytes after pickle stream " + std::to_string(index - 1) +
                  " are not a pickle",
              "unexplained bytes can hide data for other readers; the scan cannot call them clean", pos);
        return true;
      }
      add_error(o.error, member, index, pos, kIncompleteWhy);
      return false;
    }
    pos += o.end;
    ++index;
  }
  return true;
}

}  // namespace safeckpt::scan
