// Issue 11, items 5, 6 and 8: the Allowlist API extends PyTorch's defaults
// like add_safe_globals (the empty policy is the explicit Allowlist::none());
// known-dangerous globals are never offered as "allow it" and the critical
// ones are hard-blocked (API, allowlist files, CLI --allow, loader, scanner);
// numpy refusals point at the shipped allowlist/numpy.allow.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/scan.hpp"
#include "support/run_cli.hpp"

namespace fs = std::filesystem;
using safeckpt::Allowlist;
using safeckpt::ErrorCode;

namespace {

const fs::path kC211 = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";

// Globals the catalogue marks critical, one per family of the list.
const char* const kCritical[] = {
    "builtins.eval",
    "builtins.exec",
    "builtins.compile",
    "os.system",
    "posix.system",
    "nt.system",
    "subprocess.Popen",
    "pty.spawn",
    "runpy._run_code",
    "importlib.import_module",
    "torch.load",
    "pickle.loads",
    "builtins.getattr",
    "operator.attrgetter",
    "builtins.__import__",
    "sys.modules",
    "torch.serialization.load",
    "_pickle.loads",
    "marshal.loads",
    "webbrowser.open",
    // User test finding: the call gadgets of threats.md ("only an exact
    // allowlist holds"): partial binds any callable and hides the real call,
    // _reconstructor instantiates any class; a user allowlist line must not
    // turn them on silently.
    "functools.partial",
    "copyreg._reconstructor",
};

safeckpt::Result<safeckpt::Checkpoint> load_with(const fs::path& f, const Allowlist& a) {
  safeckpt::LoadOptions o;
  o.allowlist = &a;
  return safeckpt::load(f, o);
}

fs::path write_temp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("safeckpt_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

}  // namespace

TEST_CASE("allowlist: the obvious code extends PyTorch's defaults (add_safe_globals)") {
  Allowlist a;
  REQUIRE(a.add("mypkg.X").has_value());
  CHECK(a.find("mypkg.X") != nullptr);
  CHECK(a.find("torch._utils._rebuild_tensor_v2") != nullptr);
  CHECK(a.entries().size() == Allowlist::default_policy().entries().size() + 1);
  auto r = load_with(kC211 / "mlp_state_dict.pt", a);
  CHECK_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));

  // parse / load_file also give the defaults plus the text.
  auto p = Allowlist::parse("mypkg.Y  # mine\n", "test");
  REQUIRE_MESSAGE(p.has_value(), (p ? "" : p.error().to_string()));
  CHECK(p->find("mypkg.Y") != nullptr);
  CHECK(p->find("mypkg.Y")->comment == "mine");
  CHECK(p->find("torch.Size") != nullptr);
  auto f = write_temp("extend.allow", "mypkg.Z\n");
  auto lf = Allowlist::load_file(f);
  REQUIRE_MESSAGE(lf.has_value(), (lf ? "" : lf.error().to_string()));
  CHECK(lf->find("torch._utils._rebuild_tensor_v2") != nullptr);
  CHECK(lf->find("mypkg.Z") != nullptr);
  fs::remove(f);
}

TEST_CASE("allowlist: Allowlist::none() is the explicit empty policy") {
  Allowlist n = Allowlist::none();
  CHECK(n.entries().empty());
  CHECK(n.find("torch._utils._rebuild_tensor_v2") == nullptr);
  auto r = load_with(kC211 / "mlp_state_dict.pt", n);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == ErrorCode::kDisallowedGlobal);
  REQUIRE(n.add("mypkg.X").has_value());
  CHECK(n.entries().size() == 1);
}

TEST_CASE("allowlist: critical globals are hard-blocked from the API and from files") {
  for (const char* g : kCritical) {
    INFO(g);
    CHECK(Allowlist::is_blocked(g));
    Allowlist a;
    auto st = a.add(g);
    REQUIRE_FALSE(st.has_value());
    CHECK(st.error().code() == ErrorCode::kInvalidArgument);
    CHECK(st.error().message().find("cannot be allowlisted") != std::string::npos);
    CHECK(st.error().message().find("run code") != std::string::npos);
    CHECK(a.find(g) == nullptr);
    // The `= known` form cannot smuggle it in either.
    CHECK_FALSE(a.add(g, "torch.Size").has_value());
    // A file line names file, line and why.
    auto p = Allowlist::parse(std::string("mypkg.X\n") + g + "\n", "my.allow");
    REQUIRE_FALSE(p.has_value());
    CHECK(p.error().code() == ErrorCode::kInvalidArgument);
    CHECK(p.error().message().rfind("my.allow:2: '" + std::string(g) + "' cannot be allowlisted", 0) == 0);
  }
  // A failed add_file leaves the policy as it was.
  Allowlist a;
  auto f = write_temp("eval.allow", "mypkg.X\nbuiltins.eval\n");
  CHECK_FALSE(a.add_file(f).has_value());
  CHECK(a.find("mypkg.X") == nullptr);
  fs::remove(f);
  // Harmless globals and the shipped files are not blocked.
  for (const char* ok : {"argparse.Namespace", "pathlib.PosixPath", "builtins.frozenset", "numpy.ndarray"}) {
    INFO(ok);
    CHECK_FALSE(Allowlist::is_blocked(ok));
    CHECK(Allowlist().add(ok).has_value());
  }
  for (const auto& e : fs::directory_iterator(fs::path(SAFECKPT_SOURCE_DIR) / "allowlist")) {
    if (e.path().extension() != ".allow") continue;
    INFO(e.path());
    auto lf = Allowlist::load_file(e.path());
    CHECK_MESSAGE(lf.has_value(), (lf ? "" : lf.error().to_string()));
  }
}

TEST_CASE("allowlist: --allow naming a critical global is refused by inspect and scan, with the reason") {
  auto f = write_temp("cli_eval.allow", "# trusting the wrong thing\nbuiltins.eval\n");
  const std::string file = (kC211 / "mal_builtins_eval.pt").string();
  for (const char* cmd : {"inspect", "scan"}) {
    INFO(cmd);
    auto r = test_support::run_cli(std::string(cmd) + " --allow " + f.string() + " " + file, true);
    CHECK(r.code == 2);
    CHECK(r.out.find(f.string() + ":2: 'builtins.eval' cannot be allowlisted") != std::string::npos);
    CHECK(r.out.find("run code") != std::string::npos);
  }
  fs::remove(f);
  // And without the allowlist the file stays unsafe / refused.
  CHECK(test_support::run_cli("scan " + file).code != 0);
  CHECK(test_support::run_cli("inspect " + file).code == 1);
}

TEST_CASE("refusal messages: dangerous globals never offer allowlisting; numpy points at numpy.allow") {
  struct Case {
    const char* file;
    const char* global;
  };
  for (const Case& c : {Case{"mal_os_system.pt", "os.system"}, Case{"mal_posix_system.pt", "posix.system"},
                        Case{"mal_builtins_eval.pt", "builtins.eval"}, Case{"mal_builtins_exec.pt", "builtins.exec"},
                        Case{"mal_runpy.pt", "runpy."}, Case{"mal_torch_load_nested.pt", ""},
                        Case{"mal_subprocess.pt", "subprocess."}, Case{"mal_webbrowser.pt", "webbrowser."},
                        Case{"mal_getattr_chain.pt", ""}, Case{"mal_functools_partial.pt", "functools.partial"}}) {
    INFO(c.file);
    auto r = safeckpt::load(kC211 / c.file);
    REQUIRE_FALSE(r.has_value());
    const std::string m = r.error().message();
    INFO(m);
    CHECK(m.find(c.global) != std::string::npos);
    CHECK(m.find("allow it") == std::string::npos);
    CHECK(m.find("Allowlist::add") == std::string::npos);
    CHECK(m.find("run code") != std::string::npos);
    // The scanner's findings do not offer it either.
    auto s = safeckpt::scan::scan_file(kC211 / c.file);
    CHECK(s.verdict == safeckpt::scan::Verdict::kUnsafe);
    for (const auto& fd : s.findings) {
      INFO(fd.message << " / " << fd.why);
      if (safeckpt::is_known_dangerous(fd.global)) CHECK(fd.why.find("--allow") == std::string::npos);
    }
  }
  // Builtins outside the allowlist match only the catalogue's catch-all: they
  // keep torch's remedy (python_values.pt holds a frozenset).
  auto pv = safeckpt::load(kC211 / "python_values.pt");
  REQUIRE_FALSE(pv.has_value());
  CHECK(pv.error().message().find("GLOBAL builtins.frozenset was not an allowed global by default") !=
        std::string::npos);
  CHECK(pv.error().message().find("allow it with `--allow FILE`") != std::string::npos);
  // ... and names the bundled allowlist that covers it, as `--allow NAME` finds it after install.
  CHECK(pv.error().message().find("`--allow python_values`") != std::string::npos);
  CHECK(safeckpt::allow_hint("argparse.Namespace").find("`--allow argparse`") != std::string::npos);
  // A harmless unknown global keeps torch's remedy.
  CHECK(safeckpt::allow_hint("mypkg.Config").find("allow it with `--allow FILE`") != std::string::npos);

  // numpy arrays: the shipped numpy.allow, not a plain line.
  auto n = safeckpt::load(kC211 / "numpy_array.pt");
  REQUIRE_FALSE(n.has_value());
  const std::string m = n.error().message();
  INFO(m);
  CHECK(n.error().code() == ErrorCode::kDisallowedGlobal);
  CHECK(m.find("allowlist/numpy.allow") != std::string::npos);
  CHECK(m.find("`--allow numpy`") != std::string::npos);  // the bundled name: works from any directory
  CHECK(m.find("(a line `") == std::string::npos);
  auto s = safeckpt::scan::scan_file(kC211 / "numpy_array.pt");
  bool pointed = false;
  for (const auto& fd : s.findings)
    if (fd.global.rfind("numpy.", 0) == 0 && fd.why.find("allowlist/numpy.allow") != std::string::npos) pointed = true;
  CHECK(pointed);
}

TEST_CASE("tensor subclass: an allowlisted MyTensor (real torch 1.13 file) loads as data, class name and state") {
  // tests/data/tensor_subclass: gen_tensor_subclass.py, values in observed.txt
  // (1.13's weights_only=True refuses the file: it has no add_safe_globals).
  const fs::path f = fs::path(SAFECKPT_TEST_DATA) / "tensor_subclass" / "my_tensor.pt";
  auto refused = safeckpt::load(f);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code() == ErrorCode::kDisallowedGlobal);
  CHECK(refused.error().message().find("mytensors.MyTensor") != std::string::npos);

  Allowlist a;
  REQUIRE(a.add("mytensors.MyTensor").has_value());
  auto r = load_with(f, a);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  bool saw_t = false, saw_plain = false;
  for (const auto& nt : r->state_dict()) {
    const safeckpt::TensorInfo& ti = r->tensors()[nt.tensor];
    auto bytes = r->contiguous_bytes(nt.tensor);
    REQUIRE_MESSAGE(bytes.has_value(), (bytes ? "" : bytes.error().to_string()));
    if (nt.name == "t") {
      saw_t = true;
      CHECK(ti.subclass == "mytensors.MyTensor");
      CHECK(ti.dtype == safeckpt::DType::kFloat32);
      CHECK(ti.shape == std::vector<std::int64_t>{2, 3});
      std::vector<float> v(6);
      REQUIRE(bytes->size() == 24);
      std::memcpy(v.data(), bytes->data(), 24);
      CHECK(v == std::vector<float>{1, 2, 3, 4, 5, 6});
      // state: {'tag': 'calibrated'}
      REQUIRE(ti.python_state != safeckpt::kNoNode);
      const auto& st = r->values()[ti.python_state];
      REQUIRE(st.items.size() == 2);
      CHECK(r->values()[st.items[0]].text == "tag");
      CHECK(r->values()[st.items[1]].text == "calibrated");
    }
    if (nt.name == "plain") {
      saw_plain = true;
      CHECK(ti.subclass.empty());
      CHECK(ti.dtype == safeckpt::DType::kInt64);
      std::vector<std::int64_t> v(4);
      REQUIRE(bytes->size() == 32);
      std::memcpy(v.data(), bytes->data(), 32);
      CHECK(v == std::vector<std::int64_t>{0, 1, 2, 3});
    }
  }
  CHECK(saw_t);
  CHECK(saw_plain);
}
