// Comparing value trees in the corpus JSON schema (tests/data/corpus/README.md).
// Both helpers are iterative: trees from hostile files can be a million levels
// deep, and nlohmann's dump() / operator== recurse (used here on scalars only).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace test_support {

using nlohmann::json;

// Storage ids renumbered by first appearance; empty storages' ids dropped
// (every empty storage looks alike: the 2.11
// corpus generator keyed storages by data pointer, which is 0 for all of them).
inline void normalize(json& j) {
  std::map<long long, long long> ids;
  std::vector<json*> work{&j};
  while (!work.empty()) {
    json* x = work.back();
    work.pop_back();
    if (x->is_object()) {
      if (x->contains("$tensor")) {
        json& t = (*x)["$tensor"];
        if (t.contains("storage_id")) {
          if (t.value("storage_nbytes", 0) == 0) {
            t.erase("storage_id");
          } else {
            long long old = t["storage_id"].get<long long>();
            auto it = ids.find(old);
            if (it == ids.end()) it = ids.emplace(old, static_cast<long long>(ids.size())).first;
            t["storage_id"] = it->second;
          }
        }
        if (t.contains("sparse_indices") && !t["sparse_indices"].is_null()) work.push_back(&t["sparse_indices"]);
        continue;
      }
      std::vector<json*> kids;
      for (auto& [k, v] : x->items()) kids.push_back(&v);
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) work.push_back(*it);
    } else if (x->is_array()) {
      for (auto it = x->rbegin(); it != x->rend(); ++it) work.push_back(&*it);
    }
  }
}

// Short text of a value for a difference message: a scalar in full (200
// bytes at most), a container by type and size (dump() would recurse).
inline std::string brief(const json& j) {
  if (j.is_object()) return "{object of " + std::to_string(j.size()) + "}";
  if (j.is_array()) return "[array of " + std::to_string(j.size()) + "]";
  return j.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 200);
}

// "" when equal, else the path of the first difference (depth-first, in
// order). Iterative (explicit stack; paths are rebuilt from parent links only
// for the message), so a tree a million levels deep is fine.
inline std::string first_diff(const json& a, const json& b, const std::string& root = "$") {
  struct Item {
    const json* a;
    const json* b;
    std::size_t parent;  // index into `seen`, or npos for the root
    std::string step;    // ".key" or "[i]"
  };
  std::vector<Item> seen;  // every pair compared (parents of later items)
  std::vector<std::size_t> work;
  seen.push_back({&a, &b, std::string::npos, root});
  work.push_back(0);
  auto path = [&](std::size_t i) {
    std::vector<const std::string*> parts;
    for (std::size_t k = i; k != std::string::npos; k = seen[k].parent) parts.push_back(&seen[k].step);
    std::string p;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) p += **it;
    return p;
  };
  while (!work.empty()) {
    const std::size_t i = work.back();
    work.pop_back();
    const json& x = *seen[i].a;
    const json& y = *seen[i].b;
    if (x.type() != y.type()) return path(i) + ": " + brief(x) + " != " + brief(y);
    if (x.is_object()) {
      for (auto& [k, v] : x.items())
        if (!y.contains(k)) return path(i) + "." + k + ": missing in second";
      for (auto& [k, v] : y.items())
        if (!x.contains(k)) return path(i) + "." + k + ": missing in first";
      std::vector<std::size_t> kids;
      for (auto& [k, v] : x.items()) {
        seen.push_back({&v, &y.at(k), i, "." + k});
        kids.push_back(seen.size() - 1);
      }
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) work.push_back(*it);
    } else if (x.is_array()) {
      if (x.size() != y.size())
        return path(i) + ": length " + std::to_string(x.size()) + " != " + std::to_string(y.size());
      for (std::size_t k = x.size(); k-- > 0;) {
        seen.push_back({&x[k], &y[k], i, "[" + std::to_string(k) + "]"});
        work.push_back(seen.size() - 1);
      }
    } else if (x != y) {  // scalars: flat comparison
      return path(i) + ": " + brief(x) + " != " + brief(y);
    }
  }
  return "";
}

}  // namespace test_support
