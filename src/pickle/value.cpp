#include "safeckpt/value.hpp"

namespace safeckpt {

std::string_view kind_name(Kind k) noexcept {
  switch (k) {
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kBigInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kComplex: return "complex";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kByteArray: return "bytearray";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kSlice: return "slice";
    case Kind::kDict: return "dict";
    case Kind::kOrderedDict: return "collections.OrderedDict";
    case Kind::kCounter: return "collections.Counter";
    case Kind::kSize: return "torch.Size";
    case Kind::kDtype: return "torch.dtype";
    case Kind::kDevice: return "torch.device";
    case Kind::kLayout: return "torch.layout";
    case Kind::kQScheme: return "torch.qscheme";
    case Kind::kTensor: return "torch.Tensor";
    case Kind::kStorage: return "torch.storage";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
  }
  return "unknown";
}

}  // namespace safeckpt
