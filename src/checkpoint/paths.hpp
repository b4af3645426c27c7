// Internal: the one walk that names values by path ("layer.0.weight"), shared
// by Checkpoint::named_tensors() and the inspect text renderer (json.cpp).
//
// Iterative (explicit stack, no recursion on input-shaped data) and linear in
// the arena: a container is expanded once, at the first path that reaches it
// (a memo-shared sub-graph, however often referenced, costs its size once; a
// cycle ends at the revisit). Leaves are visited once per reference. The
// path lives in one buffer that grows and shrinks with the walk, so a deep
// tree costs O(depth) memory, not O(depth^2); a path longer than
// `max_path_bytes` is not materialized: visit() then sees `path_complete ==
// false` (and a truncated `path`) and decides what that means.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/value.hpp"

namespace safeckpt::detail {

struct PathVisit {
  NodeId id;
  std::string_view path;     // the dotted path (the first max_path_bytes bytes at most)
  bool path_complete;        // false: the real path is longer than max_path_bytes
  std::uint64_t path_bytes;  // the real path's length in bytes
  std::uint64_t depth;       // containers between the root and this node
  bool revisit;              // a container already expanded at another path (or a cycle)
};

enum class WalkStep : std::uint8_t { kDescend, kSkip, kStop };

inline bool is_named_container(Kind k) {
  return k == Kind::kDict || k == Kind::kOrderedDict || k == Kind::kCounter || k == Kind::kList || k == Kind::kTuple;
}

// What walk_paths follows beyond torch's state_dict naming (the defaults).
struct PathWalkOptions {
  // Names a dict key that is not str/int (e.g. "[(1, 2)]"); null: such keys
  // are not followed, as in torch's state_dict naming. The name is one path
  // component like any other.
  std::function<std::string(NodeId key)> other_key;
  // Walk into kObject nodes (allowlisted classes the library does not model,
  // e.g. a whole nn.Module saved with torch.save(model)): their non-empty
  // args as "(args)", their BUILD state as "__dict__" when it is a dict (what
  // BUILD updates), else "(state)".
  bool into_objects = false;
};

// Calls visit(const PathVisit&) -> WalkStep for the root and every value
// reachable through dicts (str/int keys; others as `options` says), lists and
// tuples (and objects, with options.into_objects), depth-first, in order.
// kDescend on a container (not a revisit) walks its children; kStop ends the walk.
template <class Visit>
void walk_paths(const ValueArena& a, NodeId root, std::uint64_t max_path_bytes, Visit&& visit,
                const PathWalkOptions& options = {}) {
  if (root == kNoNode || root >= a.size()) return;
  auto is_container = [&](Kind k) { return is_named_container(k) || (options.into_objects && k == Kind::kObject); };
  struct Frame {
    NodeId id;
    std::uint64_t len;  // real path length at this container
    std::size_t next;
  };
  std::vector<Frame> st;
  std::vector<bool> expanded(a.size(), false);
  std::string path;
  auto enter = [&](NodeId id, std::uint64_t len, std::uint64_t depth) -> bool {
    const bool container = is_container(a[id].kind);
    const bool revisit = container && expanded[id];
    const PathVisit v{id, path, len <= max_path_bytes, len, depth, revisit};
    const WalkStep s = visit(v);
    if (s == WalkStep::kStop) return false;
    if (s == WalkStep::kDescend && container && !revisit) {
      expanded[id] = true;
      st.push_back({id, len, 0});
    }
    return true;
  };
  if (!enter(root, 0, 0)) return;
  std::string key;
  while (!st.empty()) {
    Frame& f = st.back();
    const Node& n = a[f.id];
    const bool dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict || n.kind == Kind::kCounter;
    const std::size_t step = dict ? 2 : 1;
    if (f.next + step > n.items.size()) {
      st.pop_back();
      continue;
    }
    const std::size_t i = f.next;
    f.next += step;
    if (dict) {
      if (n.items[i] == kNoNode || n.items[i] >= a.size()) continue;
      const Node& k = a[n.items[i]];
      if (k.kind == Kind::kStr)
        key = k.text;
      else if (k.kind == Kind::kInt)
        key = std::to_string(k.i);
      else if (options.other_key)
        key = options.other_key(n.items[i]);
      else
        continue;                          // other keys do not name values
    } else if (n.kind == Kind::kObject) {  // items: [args, state] (value.hpp)
      const NodeId c = n.items[i];
      if (c == kNoNode || c >= a.size()) continue;
      if (i == 0) {
        if (a[c].items.empty()) continue;  // no args
        key = "(args)";
      } else {
        const Kind sk = a[c].kind;
        key = sk == Kind::kDict || sk == Kind::kOrderedDict ? "__dict__" : "(state)";
      }
    } else {
      key = std::to_string(i);
    }
    const NodeId child = n.items[i + step - 1];
    if (child == kNoNode || child >= a.size()) continue;
    const std::uint64_t len = f.len == 0 ? key.size() : f.len + 1 + key.size();
    if (f.len <= max_path_bytes) path.resize(static_cast<std::size_t>(f.len));
    if (len <= max_path_bytes) {
      if (f.len != 0) path.push_back('.');
      path += key;
    }
    const std::uint64_t depth = st.size();
    if (!enter(child, len, depth)) return;
  }
}

}  // namespace safeckpt::detail
