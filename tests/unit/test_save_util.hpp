// Helpers shared by test_save*.cpp and test_safetensors*.cpp.
#pragma once

#include <doctest/doctest.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"

namespace safeckpt::save_test {

namespace fs = std::filesystem;
using nlohmann::json;

inline fs::path corpus_dir(const char* which) { return fs::path(SAFECKPT_TEST_DATA) / "corpus" / which; }

// Every checkpoint file of both corpora, sorted: (corpus/case, path).
inline std::vector<std::pair<std::string, fs::path>> corpus_files() {
  std::vector<std::pair<std::string, fs::path>> out;
  for (const char* which : {"torch-2.11", "torch-1.13"}) {
    for (const auto& e : fs::directory_iterator(corpus_dir(which))) {
      auto ext = e.path().extension().string();
      if (ext == ".pt" || ext == ".pkl") out.emplace_back(std::string(which) + "/" + e.path().stem().string(), e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Default allowlist plus every allowlist/*.allow file of the repository:
// loads the corpus files that hold frozensets, slices, numpy values and
// argparse namespaces (saved back only with weights_only_compatible off).
inline const Allowlist& extended_allowlist() {
  static const Allowlist a = [] {
    Allowlist x = Allowlist::default_policy();
    for (const auto& e : fs::directory_iterator(fs::path(SAFECKPT_SOURCE_DIR) / "allowlist")) {
      if (e.path().extension() != ".allow" || e.path().filename() == "default.allow") continue;
      auto st = x.add_file(e.path());
      REQUIRE_MESSAGE(st.has_value(), e.path().string());
    }
    return x;
  }();
  return a;
}

struct CorpusLoad {
  LoadOptions load;
  bool weights_only_compatible = true;
};
inline CorpusLoad load_options_for(const std::string&) { return {}; }

// Loads `path` with the default policy, else with the extended allowlist.
inline Result<Checkpoint> load_any(const fs::path& path, CorpusLoad& how) {
  auto r = load(path);
  if (r) return r;
  how.load.allowlist = &extended_allowlist();
  how.weights_only_compatible = false;
  return load(path, how.load);
}

// Storage ids renumbered by first appearance; empty storages' ids dropped
// (every empty storage looks alike).
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

inline json tree_json(const Checkpoint& c) {
  auto text = to_json(c);
  REQUIRE_MESSAGE(text.has_value(), text.error().to_string());
  json j = json::parse(*text);
  normalize(j);
  return j;
}

// "" when the two checkpoints hold the same value tree (safeckpt::to_json,
// with tensor and storage hashes), else the first difference.
inline std::string tree_diff(const Checkpoint& a, const Checkpoint& b) { return first_diff(tree_json(a), tree_json(b)); }

inline std::vector<std::uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "safeckpt-save-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    REQUIRE(p != nullptr);
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace safeckpt::save_test
