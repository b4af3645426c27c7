// Issue 11 item 1: hostile value trees through every walker of a value tree.
// A tree a million containers deep (the loader is iterative, so it loads) and
// a memo-shared DAG (42 nodes, 2^40 paths) must not crash, hang or grow
// without bound in: state_dict naming, the JSON and text renderers (library
// and `safeckpt inspect`), the comparison helpers (tests/support/tree_json.hpp,
// fuzz/tree_equal.hpp), save and safetensors conversion.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../fuzz/tree_equal.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"
#include "support/run_cli.hpp"
#include "support/tree_json.hpp"

namespace fs = std::filesystem;
using namespace std::string_literals;
using safeckpt::ErrorCode;

namespace {

constexpr std::size_t kDepth = 1000000;

// A bare pickle (protocol 2) of `depth` nested lists: EMPTY_LIST x depth,
// then APPEND x (depth - 1). 2 MB; the hostile input.
std::string deep_lists_pickle(std::size_t depth) {
  return "\x80\x02"s + std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
}

// L0 = []; L(i) = [L(i-1), L(i-1)] through the memo: 42 nodes, 2^40 paths.
std::string dag_bomb_pickle() {
  std::string p = "\x80\x02]q"s + '\0';
  for (int i = 1; i <= 40; ++i)
    p += "0(h"s + static_cast<char>(i - 1) + "h" + static_cast<char>(i - 1) + "lq" + static_cast<char>(i);
  return p + ".";
}

safeckpt::Checkpoint load_text(const std::string& p) {
  auto r = safeckpt::load_buffer(std::vector<std::uint8_t>(p.begin(), p.end()));
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  return std::move(*r);
}

// {"model": [[[...[tensor]...]]]}: `depth` lists, a 2-element float32 tensor at the bottom.
safeckpt::Checkpoint deep_tensor_checkpoint(std::size_t depth) {
  safeckpt::CheckpointBuilder b;
  auto s = b.add_storage(safeckpt::DType::kFloat32, std::vector<std::uint8_t>(8, 0));
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.error().to_string()));
  auto t = b.add_tensor(safeckpt::DType::kFloat32, {2}, *s);
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error().to_string()));
  safeckpt::NodeId v = *t;
  for (std::size_t i = 0; i < depth; ++i) v = b.container(safeckpt::Kind::kList, {v});
  b.set_root(b.container(safeckpt::Kind::kDict, {b.str("model"), v}));
  auto c = std::move(b).finish();
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  return std::move(*c);
}

fs::path write_temp(const std::string& name, const std::string& bytes) {
  fs::path p = fs::temp_directory_path() / ("safeckpt_deep_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

}  // namespace

TEST_CASE("deep tree: state_dict naming is linear and refuses over-long names") {
  safeckpt::Checkpoint lists = load_text(deep_lists_pickle(kDepth));
  auto none = lists.named_tensors();
  REQUIRE_MESSAGE(none.has_value(), (none ? "" : none.error().to_string()));
  CHECK(none->empty());

  safeckpt::Checkpoint deep = deep_tensor_checkpoint(kDepth);
  auto named = deep.named_tensors();
  REQUIRE_FALSE(named.has_value());
  CHECK(named.error().code() == ErrorCode::kLimitExceeded);
  CHECK_MESSAGE(named.error().to_string().find("nesting depth") != std::string::npos, named.error().to_string());
  CHECK(deep.state_dict().empty());  // documented: empty when named_tensors() fails

  // Shallow enough for the cap: the name is every index on the way down.
  safeckpt::Checkpoint ok = deep_tensor_checkpoint(1000);
  auto sd = ok.named_tensors();
  REQUIRE_MESSAGE(sd.has_value(), (sd ? "" : sd.error().to_string()));
  REQUIRE(sd->size() == 1);
  CHECK((*sd)[0].name.size() == std::string("model").size() + 2 * 1000);
}

TEST_CASE("deep tree: to_json is iterative, its output linear; to_text caps the depth shown") {
  safeckpt::Checkpoint c = load_text(deep_lists_pickle(kDepth));
  safeckpt::JsonOptions compact;
  compact.indent = -1;
  auto j = safeckpt::to_json(c, compact);
  REQUIRE_MESSAGE(j.has_value(), (j ? "" : j.error().to_string()));
  // {"$list":[ ... ]} per level: 12 bytes each, plus the newline.
  CHECK(j->size() == 12 * kDepth + 1);
  auto parsed = nlohmann::json::parse(*j);  // nlohmann's parser is iterative
  CHECK(parsed.is_object());

  auto indented = safeckpt::to_json(c);  // indentation stops growing at 32 levels
  REQUIRE_MESSAGE(indented.has_value(), (indented ? "" : indented.error().to_string()));
  CHECK(indented->size() < 100 * kDepth);  // 79 bytes a level: two lines of at most 32 spaces

  auto t = safeckpt::to_text(c);
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error().to_string()));
  CHECK(t->size() < 2000);
  CHECK_MESSAGE(t->find("nested deeper than 12 levels") != std::string::npos, *t);

  // A tensor a million lists deep is still a row of the text view, its name cut.
  safeckpt::Checkpoint deep = deep_tensor_checkpoint(kDepth);
  auto dt = safeckpt::to_text(deep);
  REQUIRE_MESSAGE(dt.has_value(), (dt ? "" : dt.error().to_string()));
  CHECK(dt->size() < 4000);
  CHECK_MESSAGE(dt->find("(1 tensors, 1 storages)") != std::string::npos, *dt);
  CHECK_MESSAGE(dt->find("model.0.0.0.0") != std::string::npos, *dt);
}

TEST_CASE("deep tree: a loaded file whose state_dict names exceed the cap is refused by the load") {
  // 40,000 lists: under max_mark_depth (64 Ki) when read back, but the
  // tensor's name ("model" + ".0" x 40,000) is over kMaxTensorNameBytes.
  safeckpt::Checkpoint c = deep_tensor_checkpoint(40000);
  auto bytes = safeckpt::save_to_bytes(c);
  REQUIRE_MESSAGE(bytes.has_value(), (bytes ? "" : bytes.error().to_string()));
  auto back = safeckpt::load_buffer(std::move(*bytes));
  REQUIRE_FALSE(back.has_value());
  CHECK(back.error().code() == ErrorCode::kLimitExceeded);
  CHECK_MESSAGE(back.error().to_string().find("nesting depth") != std::string::npos, back.error().to_string());
  // Just under the cap it loads, and state_dict() names the tensor.
  auto ok_bytes = safeckpt::save_to_bytes(deep_tensor_checkpoint(30000));
  REQUIRE_MESSAGE(ok_bytes.has_value(), (ok_bytes ? "" : ok_bytes.error().to_string()));
  auto ok = safeckpt::load_buffer(std::move(*ok_bytes));
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  CHECK(ok->state_dict().size() == 1);
}

TEST_CASE("memo-shared DAG: JSON refused by its output budget, the text view expands each container once") {
  safeckpt::Checkpoint c = load_text(dag_bomb_pickle());
  CHECK(c.values().size() < 200);
  auto j = safeckpt::to_json(c);  // default budgets
  REQUIRE_FALSE(j.has_value());
  CHECK(j.error().code() == ErrorCode::kLimitExceeded);
  CHECK_MESSAGE(j.error().to_string().find("shared") != std::string::npos, j.error().to_string());
  safeckpt::JsonOptions few;
  few.max_output_nodes = 1000;
  auto n = safeckpt::to_json(c, few);
  REQUIRE_FALSE(n.has_value());
  CHECK_MESSAGE(n.error().to_string().find("max_output_nodes") != std::string::npos, n.error().to_string());

  auto t = safeckpt::to_text(c);
  REQUIRE_MESSAGE(t.has_value(), (t ? "" : t.error().to_string()));
  CHECK(t->size() < 20000);
  CHECK_MESSAGE(t->find("the same object as an earlier path") != std::string::npos, *t);
  auto sd = c.named_tensors();
  REQUIRE_MESSAGE(sd.has_value(), (sd ? "" : sd.error().to_string()));
  CHECK(sd->empty());
}

TEST_CASE("deep tree: the comparison helpers are iterative") {
  safeckpt::Checkpoint a = load_text(deep_lists_pickle(kDepth));
  safeckpt::Checkpoint b = load_text(deep_lists_pickle(kDepth));
  safeckpt::JsonOptions compact;
  compact.indent = -1;
  auto ja = safeckpt::to_json(a, compact);
  REQUIRE_MESSAGE(ja.has_value(), (ja ? "" : ja.error().to_string()));
  nlohmann::json x = nlohmann::json::parse(*ja);
  nlohmann::json y = nlohmann::json::parse(*ja);
  test_support::normalize(x);
  CHECK(test_support::first_diff(x, y).empty());
  // One level shorter: the difference is found at the bottom, path and all.
  safeckpt::Checkpoint s = load_text(deep_lists_pickle(kDepth - 1));
  auto js = safeckpt::to_json(s, compact);
  REQUIRE_MESSAGE(js.has_value(), (js ? "" : js.error().to_string()));
  std::string d = test_support::first_diff(x, nlohmann::json::parse(*js));
  CHECK_MESSAGE(d.find("length 1 != 0") != std::string::npos, d.substr(d.size() > 200 ? d.size() - 200 : 0));

  CHECK(safeckpt::fuzz::TreeCompare(a, b).compare(a.root(), b.root()).empty());
}

TEST_CASE("deep tree: save and safetensors conversion stay linear") {
  // save: the pickler is iterative; the file loads back as the same tree.
  safeckpt::Checkpoint c = deep_tensor_checkpoint(30000);  // under max_mark_depth (64 Ki) when read back
  auto bytes = safeckpt::save_to_bytes(c);
  REQUIRE_MESSAGE(bytes.has_value(), (bytes ? "" : bytes.error().to_string()));
  auto back = safeckpt::load_buffer(std::move(*bytes));
  REQUIRE_MESSAGE(back.has_value(), (back ? "" : back.error().to_string()));
  CHECK(safeckpt::fuzz::TreeCompare(c, *back).compare(c.root(), back->root()).empty());

  // Conversion names entries by path: a million levels is refused by the name
  // cap, quickly, not after building quadratic names.
  safeckpt::Checkpoint deep = deep_tensor_checkpoint(kDepth);
  auto st = safeckpt::checkpoint_to_safetensors(deep);
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code() == ErrorCode::kLimitExceeded);
  safeckpt::Checkpoint lists = load_text(deep_lists_pickle(kDepth));
  safeckpt::ToSafetensorsOptions drop;
  drop.drop_non_tensors = true;
  auto sl = safeckpt::checkpoint_to_safetensors(lists, drop);
  REQUIRE_FALSE(sl.has_value());
  CHECK(sl.error().code() == ErrorCode::kLimitExceeded);
  // The DAG: each container descended once; its leaves are dropped (never
  // encoded). It holds no tensor, so with every value dropped there is nothing
  // to write: refused (user finding 1), after the same linear walk.
  safeckpt::Checkpoint dag = load_text(dag_bomb_pickle());
  auto sd = safeckpt::checkpoint_to_safetensors(dag, drop);
  REQUIRE_FALSE(sd.has_value());
  CHECK(sd.error().code() == ErrorCode::kUnsupported);
  CHECK(sd.error().message().find("nothing to write") != std::string::npos);
}

TEST_CASE("inspect CLI: deep tree and memo DAG bomb, text and JSON") {
  const fs::path deep = write_temp("deep.pkl", deep_lists_pickle(kDepth));
  const fs::path dag = write_temp("dag.pkl", dag_bomb_pickle());
  auto text = test_support::run_cli("inspect " + deep.string());
  CHECK(text.code == 0);
  CHECK(text.out.size() < 2000);
  CHECK_MESSAGE(text.out.find("nested deeper than") != std::string::npos, text.out);
  auto json = test_support::run_cli("inspect --json " + deep.string());
  CHECK(json.code == 0);
  CHECK(json.out.size() < 100 * kDepth);
  auto fmt = test_support::run_cli("inspect --format json " + deep.string());
  CHECK(fmt.code == 0);
  // Not CHECK(fmt.out == json.out): doctest's success report (ctest
  // report.success_messages) would print both ~MB outputs, per run.
  const bool same_json = fmt.out == json.out;
  CHECK(same_json);

  auto dt = test_support::run_cli("inspect " + dag.string());
  CHECK(dt.code == 0);
  CHECK(dt.out.size() < 20000);
  auto dj = test_support::run_cli("inspect --format json " + dag.string(), true);
  CHECK(dj.code == 2);
  CHECK_MESSAGE(dj.out.find("exceeds") != std::string::npos, dj.out.substr(0, 2000));
  CHECK(dj.out.size() < 4096);  // refused before anything is printed
  fs::remove(deep);
  fs::remove(dag);
}
