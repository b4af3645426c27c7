// `safeckpt convert`: formats by extension, exit codes, --force, notes.
// Runs the CLI built next to this test binary; skips when it is absent.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "safeckpt/safetensors.hpp"
#include "support/save_util.hpp"

using namespace safeckpt;
using namespace safeckpt::save_test;

namespace {

fs::path cli_path() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return self.parent_path().parent_path() / "cli" / "safeckpt";
}

int run(const std::string& args, const fs::path& log) {
  std::string cmd = cli_path().string() + " " + args + " >" + log.string() + " 2>&1";
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("convert: PyTorch <-> safetensors through the CLI") {
  if (!fs::exists(cli_path())) {
    MESSAGE("SKIP: " << cli_path().string() << " not built");
    return;
  }
  TempDir dir;
  const fs::path log = dir.path / "log.txt";
  const fs::path c211 = corpus_dir("torch-2.11");
  const std::string st = (dir.path / "m.safetensors").string(), pt = (dir.path / "m.pt").string();
  CHECK(run("convert " + (c211 / "mlp_state_dict.pt").string() + " " + st, log) == 0);
  CHECK(run("convert " + st + " " + pt, log) == 0);
  // Refuses to replace without --force (exit 2), replaces with it.
  CHECK(run("convert " + st + " " + pt, log) == 2);
  CHECK(run("convert --force " + st + " " + pt, log) == 0);
  // The tensors survived both conversions (safetensors orders them by dtype
  // and name, so compare by name).
  auto a = load(c211 / "mlp_state_dict.pt");
  auto b = load(pt);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  std::map<std::string, std::uint32_t> by_name;
  for (const auto& nt : b->state_dict()) by_name[nt.name] = nt.tensor;
  auto sa = a->state_dict();
  REQUIRE(sa.size() == by_name.size());
  for (const auto& nt : sa) {
    REQUIRE(by_name.count(nt.name));
    CHECK(*a->contiguous_bytes(nt.tensor) == *b->contiguous_bytes(by_name[nt.name]));
  }
  // PyTorch -> PyTorch re-save, and a training checkpoint to safetensors with
  // its plain values in __metadata__.
  CHECK(run("convert " + (c211 / "protocol_4.pt").string() + " " + (dir.path / "p4.pt").string(), log) == 0);
  CHECK(load(dir.path / "p4.pt").has_value());
  // --legacy: the pre-1.6 layout, same tensors; not for safetensors outputs.
  CHECK(run("convert --legacy " + st + " " + (dir.path / "legacy.pt").string(), log) == 0);
  auto lg = load(dir.path / "legacy.pt");
  REQUIRE(lg.has_value());
  CHECK(lg->format() == FileFormat::kLegacyPickle);
  CHECK(tree_diff(*b, *lg).empty());
  CHECK(run("convert --legacy " + pt + " " + (dir.path / "legacy.safetensors").string(), log) == 2);
  CHECK(run("convert " + (c211 / "training_checkpoint.pt").string() + " " + (dir.path / "t.safetensors").string(),
            log) == 0);
  auto t = SafetensorsFile::open(dir.path / "t.safetensors");
  REQUIRE(t.has_value());
  CHECK(t->has_metadata());
  // A refused input exits 1 (policy) and writes nothing; an unknown output
  // extension exits 2.
  CHECK(run("convert " + (c211 / "mal_os_system.pt").string() + " " + (dir.path / "x.pt").string(), log) == 1);
  CHECK_FALSE(fs::exists(dir.path / "x.pt"));
  CHECK(run("convert " + st + " " + (dir.path / "x.npz").string(), log) == 2);
  // Shared storages become separate tensors, with a note.
  CHECK(run("convert " + (c211 / "views_shared_storage.pt").string() + " " + (dir.path / "v.safetensors").string(),
            log) == 0);
  auto text = read_file(log);
  CHECK(std::string(text.begin(), text.end()).find("share storage") != std::string::npos);
}

// User test finding: a whole module saved with torch.save(model) has no
// tensor safetensors can name; with --drop-non-tensors the conversion used to
// write a file of 0 tensors and exit 0. It is refused now, and nothing is
// written.
TEST_CASE("convert: a whole-module torch.save with --drop-non-tensors is refused, not written empty") {
  if (!fs::exists(cli_path())) {
    MESSAGE("SKIP: " << cli_path().string() << " not built");
    return;
  }
  TempDir dir;
  const fs::path log = dir.path / "log.txt";
  const fs::path out = dir.path / "m.safetensors";
  const std::string args = "convert --allow torch.nn.modules.linear.Linear --drop-non-tensors " +
                           (corpus_dir("torch-2.11") / "whole_module.pt").string() + " " + out.string();
  CHECK(run(args, log) == 2);
  CHECK_FALSE(fs::exists(out));
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  CAPTURE(text);
  CHECK(text.find("nothing to write") != std::string::npos);
  CHECK(text.find("model.state_dict()") != std::string::npos);
}
