// The weights-only rules shared by the loader and the scanner
// (weights_only_rules.hpp).
#include "torch/weights_only_rules.hpp"

#include <string>

namespace safeckpt::weights_only {

namespace {

// The builtins TorchHooks::call builds from a REDUCE (object_model.cpp's
// switch); the others are values or classes it never calls.
bool reduce_builds(Builtin b) {
  switch (b) {
    case Builtin::kDtype:
    case Builtin::kQScheme:
    case Builtin::kTensorClass:
    case Builtin::kStorageClass:
    case Builtin::kTypedStorage:
    case Builtin::kUntypedStorage:
    case Builtin::kNumpyNdarray:
    case Builtin::kNumpyDTypeClass: return false;
    default: return true;
  }
}

}  // namespace

Status check_call(const AllowEntry& e, bool newobj) {
  if (newobj) {
    if (e.builtin == Builtin::kParameter) return {};
    if (e.user && (e.builtin == Builtin::kGeneric || reduce_builds(e.builtin))) return {};
    return make_error(ErrorCode::kDisallowedOperation,
                      "Can only create new object for nn.Parameter or classes allowlisted via add_safe_globals "
                      "(--allow FILE), but got " +
                          e.name);
  }
  if (reduce_builds(e.builtin)) return {};
  return make_error(ErrorCode::kDisallowedOperation, "Trying to call reduce for unrecognized function " + e.name);
}

BuildTarget build_target(const Node& o, bool numpy_object, const Allowlist& allow) {
  if (o.kind == Kind::kOrderedDict) return BuildTarget::kOrderedDict;
  if (numpy_object) return BuildTarget::kNumpy;
  if (o.kind == Kind::kObject && o.items.size() == 2) {
    const AllowEntry* e = allow.find(o.text);
    if (e != nullptr && e->user) return BuildTarget::kUserObject;
  }
  return BuildTarget::kOther;
}

Status check_build(BuildTarget target, std::string_view what, const ValueArena& arena, NodeId state) {
  switch (target) {
    case BuildTarget::kOrderedDict: {
      // OrderedDict.__dict__.update(state): attributes such as `_metadata`.
      const Node& s = arena[state];
      if (s.kind != Kind::kDict)
        return make_error(ErrorCode::kDisallowedOperation, "OrderedDict BUILD state must be a dict");
      for (std::size_t i = 0; i < s.items.size(); i += 2)
        if (arena[s.items[i]].kind != Kind::kStr)
          return make_error(ErrorCode::kDisallowedOperation, "attribute names must be str");
      return {};
    }
    case BuildTarget::kUserObject:
    case BuildTarget::kNumpy: return {};
    case BuildTarget::kOther: break;
  }
  return make_error(
      ErrorCode::kDisallowedOperation,
      "Can only build Tensor, Parameter, OrderedDict or types allowlisted via add_safe_globals, but got " +
          std::string(what));
}

}  // namespace safeckpt::weights_only
