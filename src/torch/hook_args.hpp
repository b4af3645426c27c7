// src/torch/hook_args.hpp — helpers the torch object model's files share
// (not installed): argument readers for rebuild/numpy calls. The object
// model's rules: src/torch/object_model.hpp; checked arithmetic: util/bytes.hpp.
//
//   object_model.cpp  node and budget bookkeeping, globals, call/new_object/build dispatch
//   rebuild.cpp       torch._utils rebuild functions, sets, torch.device
//   storages.cpp      persistent ids (storages) and the view check
//   numpy.cpp         numpy dtypes, scalars and arrays
//   messages.cpp      allow_hint
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "torch/object_model.hpp"

namespace safeckpt::hook_args {

inline Unexpected bad_args(std::string_view fn, std::string_view what) {
  return make_error(ErrorCode::kMalformed, std::string(fn) + ": " + std::string(what));
}

struct Args {
  const ValueArena& a;
  const std::vector<NodeId>& v;
  std::string_view fn;
  const Node& at(std::size_t i) const { return a[v[i]]; }
  Result<std::int64_t> integer(std::size_t i, std::string_view what) const {
    const Node& n = at(i);
    if (n.kind == Kind::kInt) return n.i;
    if (n.kind == Kind::kBool) return n.flag ? 1 : 0;
    return bad_args(fn, std::string(what) + " must be an int, got " + std::string(kind_name(n.kind)));
  }
  Result<bool> boolean(std::size_t i, std::string_view what) const {
    const Node& n = at(i);
    if (n.kind == Kind::kBool) return n.flag;
    return bad_args(fn, std::string(what) + " must be a bool, got " + std::string(kind_name(n.kind)));
  }
  Result<double> number(std::size_t i, std::string_view what) const {
    const Node& n = at(i);
    if (n.kind == Kind::kFloat) return n.re;
    if (n.kind == Kind::kInt) return static_cast<double>(n.i);
    if (n.kind == Kind::kBool) return n.flag ? 1.0 : 0.0;
    return bad_args(fn, std::string(what) + " must be a number, got " + std::string(kind_name(n.kind)));
  }
  Result<std::vector<std::int64_t>> int_tuple(std::size_t i, std::string_view what, std::uint64_t max_len) const {
    const Node& n = at(i);
    if (n.kind != Kind::kTuple && n.kind != Kind::kSize && n.kind != Kind::kList)
      return bad_args(fn, std::string(what) + " must be a tuple of ints, got " + std::string(kind_name(n.kind)));
    if (n.items.size() > max_len)
      return make_error(ErrorCode::kLimitExceeded, std::string(fn) + ": " + std::string(what) + " has " +
                                                       std::to_string(n.items.size()) +
                                                       " dimensions (max_tensor_rank " + std::to_string(max_len) + ")");
    std::vector<std::int64_t> out;
    out.reserve(n.items.size());
    for (NodeId id : n.items) {
      const Node& e = a[id];
      if (e.kind != Kind::kInt) return bad_args(fn, std::string(what) + " must contain ints");
      out.push_back(e.i);
    }
    return out;
  }
};

inline bool is_ordered_or_dict(Kind k) {
  return k == Kind::kOrderedDict || k == Kind::kDict;
}

}  // namespace safeckpt::hook_args
