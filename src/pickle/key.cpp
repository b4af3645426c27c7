#include "pickle/key.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace safeckpt {
namespace {

// Numbers: integers (and integral floats that are exactly representable as
// such) use their decimal text, so 1, 1.0 and True share a key.
std::string number_key(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
    return "n" + std::to_string(static_cast<long long>(v));
  }
  if (v == 0) return "n0";  // -0.0
  char buf[40];
  std::snprintf(buf, sizeof buf, "f%a", v);
  return buf;
}

}  // namespace

Result<std::string> KeyIndex::key_of(const ValueArena& arena, NodeId root, const Limits& limits) const {
  std::string out;
  // Explicit stack: a NodeId to expand, or kNoNode meaning "close a tuple".
  std::vector<NodeId> work{root};
  const std::uint64_t cap = limits.max_string_bytes + 64;
  while (!work.empty()) {
    NodeId id = work.back();
    work.pop_back();
    if (id == kNoNode) {
      out += ')';
      continue;
    }
    const Node& n = arena[id];
    switch (n.kind) {
      case Kind::kNone: out += "N;"; break;
      case Kind::kBool: out += n.flag ? "n1;" : "n0;"; break;
      case Kind::kInt: out += "n" + std::to_string(n.i) + ";"; break;
      case Kind::kBigInt: out += "n" + n.text + ";"; break;
      case Kind::kFloat:
        if (std::isnan(n.re)) {
          out += "@" + std::to_string(id) + ";";  // NaN equals only itself
        } else {
          out += number_key(n.re) + ";";
        }
        break;
      case Kind::kComplex:
        if (n.im == 0 && !std::isnan(n.re)) {
          out += number_key(n.re) + ";";
        } else {
          out += "@" + std::to_string(id) + ";";
        }
        break;
      case Kind::kStr: out += "s" + std::to_string(n.text.size()) + ":" + n.text; break;
      case Kind::kBytes: out += "b" + std::to_string(n.text.size()) + ":" + n.text; break;
      case Kind::kTuple:
      case Kind::kSize:
        out += "t(";
        work.push_back(kNoNode);
        for (auto it = n.items.rbegin(); it != n.items.rend(); ++it) work.push_back(*it);
        break;
      case Kind::kDtype: out += "dtype" + std::to_string(n.i) + ";"; break;
      case Kind::kDevice: out += "dev" + n.text + ";"; break;
      case Kind::kLayout: out += "layout" + n.text + ";"; break;
      case Kind::kQScheme: out += "qs" + n.text + ";"; break;
      case Kind::kGlobal: out += "g" + n.text + ";"; break;
      case Kind::kList:
      case Kind::kDict:
      case Kind::kOrderedDict:
      case Kind::kCounter:
      case Kind::kSet:
      case Kind::kByteArray:
      case Kind::kSlice:
        return make_error(ErrorCode::kDisallowedOperation,
                          "unhashable type used as a dict key or set member: " + std::string(kind_name(n.kind)));
      default: out += "@" + std::to_string(id) + ";"; break;
    }
    if (out.size() > cap) return make_error(ErrorCode::kLimitExceeded, "dict key too large to compare");
  }
  return out;
}

KeyIndex::Slot KeyIndex::find_or_insert(NodeId container, const std::string& key, std::size_t next_index) {
  auto& m = index_[container];
  auto [it, inserted] = m.emplace(key, next_index);
  if (inserted) stored_bytes_ += key.size();
  return Slot{it->second, inserted};
}

}  // namespace safeckpt
