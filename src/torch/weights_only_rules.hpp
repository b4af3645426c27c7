// The weights-only rules that do not depend on argument values: which
// allowlisted globals REDUCE and NEWOBJ may call, and what BUILD may update.
// One definition for the loader's object model (object_model.cpp) and the
// scanner's own pickle walk (scanner/src/pickle_scan.cpp), so the scanner
// never calls clean what the loader refuses on policy (STYLE.md "the loader
// and the scanner agree"; fuzz finding 2026-12-04: a REDUCE of the qscheme
// torch.per_tensor_affine scanned clean, tests/scanner/test_scan_agree.cpp).
//
// Source of the rules: torch/_weights_only_unpickler.py (PyTorch 2.11):
// REDUCE only on allowlisted callables, NEWOBJ only on nn.Parameter and
// add_safe_globals classes, BUILD only on tensors, Parameters, OrderedDicts
// and add_safe_globals classes. We are stricter where torch would call a
// value (a dtype or qscheme: torch raises TypeError) or a class the object
// model does not build (torch.FloatStorage(), torch.Tensor()).
#pragma once

#include <cstdint>
#include <string_view>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt::weights_only {

// REDUCE (newobj false) or NEWOBJ (true) of the allowlisted global `e`.
// Success: the object model builds the call's result (its arguments are
// checked there: kMalformed/kUnsupported). Errors: kDisallowedOperation
// (torch's words) when every call of this kind on `e` is refused: values
// (dtypes, qschemes), classes seen only as storage types or subclasses
// (torch.FloatStorage, TypedStorage, UntypedStorage, torch.Tensor),
// numpy.ndarray and numpy dtype classes; NEWOBJ of anything but
// nn.Parameter and user (add_safe_globals) entries.
Status check_call(const AllowEntry& e, bool newobj);

// What BUILD may update, by the target the object model made.
enum class BuildTarget : std::uint8_t {
  kOrderedDict,  // collections.OrderedDict (and `= collections.OrderedDict` aliases): state is attributes
  kUserObject,   // a generic object of a user (add_safe_globals) class
  kNumpy,        // numpy dtype/ndarray under construction (their states are checked by numpy.cpp)
  kOther,        // anything else: refused
};

// The BUILD target `o` is: an OrderedDict, a numpy object (`numpy_object`:
// the caller tracks which nodes its numpy calls made), a kObject of a user
// class (text = the class's allowlist name, items = {args, state}), or other.
BuildTarget build_target(const Node& o, bool numpy_object, const Allowlist& allow);

// BUILD of `state` on a target of kind `target` (`what` names it in the
// error). Errors: kDisallowedOperation for kOther, and for an OrderedDict
// whose state is not a dict with str keys.
Status check_build(BuildTarget target, std::string_view what, const ValueArena& arena, NodeId state);

}  // namespace safeckpt::weights_only
