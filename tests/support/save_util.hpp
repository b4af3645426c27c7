// Helpers shared by test_save*.cpp and test_safetensors*.cpp.
#pragma once

#include <dirent.h>
#include <doctest/doctest.h>
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
#include "support/tree_json.hpp"

namespace safeckpt::save_test {

namespace fs = std::filesystem;
using nlohmann::json;

inline fs::path corpus_dir(const char* which) {
  return fs::path(SAFECKPT_TEST_DATA) / "corpus" / which;
}

// Every checkpoint file of both corpora, sorted: (corpus/case, path).
inline std::vector<std::pair<std::string, fs::path>> corpus_files() {
  std::vector<std::pair<std::string, fs::path>> out;
  for (const char* which : {"torch-2.11", "torch-1.13"}) {
    for (const auto& e : fs::directory_iterator(corpus_dir(which))) {
      auto ext = e.path().extension().string();
      if (ext == ".pt" || ext == ".pkl")
        out.emplace_back(std::string(which) + "/" + e.path().stem().string(), e.path());
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
inline CorpusLoad load_options_for(const std::string&) {
  return {};
}

// Loads `path` with the default policy, else with the extended allowlist.
inline Result<Checkpoint> load_any(const fs::path& path, CorpusLoad& how) {
  auto r = load(path);
  if (r) return r;
  how.load.allowlist = &extended_allowlist();
  how.weights_only_compatible = false;
  return load(path, how.load);
}

using test_support::first_diff;
using test_support::normalize;

inline json tree_json(const Checkpoint& c) {
  auto text = to_json(c);
  REQUIRE_MESSAGE(text.has_value(), (text ? "" : text.error().to_string()));
  json j = json::parse(*text);
  normalize(j);
  return j;
}

// "" when the two checkpoints hold the same value tree (safeckpt::to_json,
// with tensor and storage hashes), else the first difference.
inline std::string tree_diff(const Checkpoint& a, const Checkpoint& b) {
  return first_diff(tree_json(a), tree_json(b));
}

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
