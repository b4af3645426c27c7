// Comparing value trees in the corpus JSON schema (tests/data/corpus/README.md).
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

inline std::string first_diff(const json& a, const json& b, const std::string& path = "$") {
  if (a.type() != b.type()) return path + ": " + a.dump().substr(0, 200) + " != " + b.dump().substr(0, 200);
  if (a.is_object()) {
    for (auto& [k, v] : a.items()) {
      if (!b.contains(k)) return path + "." + k + ": missing in second";
      auto d = first_diff(v, b.at(k), path + "." + k);
      if (!d.empty()) return d;
    }
    for (auto& [k, v] : b.items())
      if (!a.contains(k)) return path + "." + k + ": missing in first";
    return "";
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return path + ": length " + std::to_string(a.size()) + " != " + std::to_string(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      auto d = first_diff(a[i], b[i], path + "[" + std::to_string(i) + "]");
      if (!d.empty()) return d;
    }
    return "";
  }
  return a == b ? "" : path + ": " + a.dump().substr(0, 200) + " != " + b.dump().substr(0, 200);
}

}  // namespace test_support
