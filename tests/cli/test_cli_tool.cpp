// The `safeckpt` tool's common surface (cli/main.cpp, cli/allow_arg.*):
// --version, unknown commands with a suggestion, the one meaning of --allow
// (file, bundled allowlist name, global name) in inspect/scan/convert, and
// "cannot open" for a file that cannot be read.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "safeckpt/version.hpp"
#include "support/run_cli.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::run_cli;

const fs::path kCorpus = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";

std::string corpus(const char* name) {
  return (kCorpus / name).string();
}

}  // namespace

TEST_CASE("cli: --version prints the library's version") {
  auto r = run_cli("--version");
  CHECK(r.code == 0);
  CHECK(r.out == std::string("safeckpt ") + SAFECKPT_VERSION_STRING + "\n");
}

TEST_CASE("cli: an unknown command names the nearest one") {
  auto r = run_cli("inspecct x.pt", true);
  CHECK(r.code == 2);
  CHECK(r.out == "safeckpt: unknown command 'inspecct' (did you mean inspect?)\n");
  r = run_cli("sca x.pt", true);  // a prefix
  CHECK(r.code == 2);
  CHECK(r.out == "safeckpt: unknown command 'sca' (did you mean scan?)\n");
  r = run_cli("frobnicate", true);  // nothing close: the list
  CHECK(r.code == 2);
  // bench-engine is listed in every build (it says so when the CUDA engine is absent).
  CHECK(r.out ==
        "safeckpt: unknown command 'frobnicate' (commands: inspect, scan, convert, bench, run, inspect-program, "
        "bench-engine, sign, verify)\n");
}

TEST_CASE("cli: --allow takes a file, a bundled allowlist name or a global name") {
  const std::string file = corpus("argparse_namespace.pt");
  // Refused by the default policy.
  CHECK(run_cli("inspect " + file).code == 1);
  CHECK(run_cli("scan -q " + file).code == 1);
  const std::string path = (fs::path(SAFECKPT_SOURCE_DIR) / "allowlist" / "argparse.allow").string();
  for (const std::string& allow :
       {path, std::string("argparse"), std::string("argparse.allow"), std::string("argparse.Namespace")}) {
    CAPTURE(allow);
    CHECK(run_cli("inspect --allow " + allow + " " + file).code == 0);
    CHECK(run_cli("scan -q --allow " + allow + " " + file).code == 0);
  }
  // Neither a file, a bundled name nor a global name: a usage error that
  // lists the bundled allowlists.
  auto r = run_cli("inspect --allow nump " + file, true);
  CHECK(r.code == 2);
  CHECK(r.out.find(
            "--allow nump: not a file, a bundled allowlist (bundled: argparse, dtensor, numpy, python_values) or a "
            "global name") != std::string::npos);
  // A path that does not exist is never taken for a name.
  r = run_cli("inspect --allow ./no/such.allow " + file, true);
  CHECK(r.code == 2);
  CHECK(r.out.find("cannot read allowlist file ./no/such.allow") != std::string::npos);
}

TEST_CASE("cli: --allow repeats in inspect as in scan (a file needing several globals)") {
  // python_values.pt needs builtins.frozenset and builtins.slice (allowlist/python_values.allow).
  const std::string file = corpus("python_values.pt");
  CHECK(run_cli("inspect " + file).code == 1);
  const std::string both = " --allow builtins.frozenset --allow builtins.slice ";
  auto r = run_cli("inspect" + both + file, true);
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK(run_cli("scan -q" + both + file).code == 0);
  CHECK(run_cli("inspect --allow builtins.frozenset " + file).code == 1);  // one is not enough
}

TEST_CASE("cli: convert reads --allow the same way") {
  // (to safetensors, dropping the Namespace: save() refuses to write a
  // global that torch.load(weights_only=True) would refuse)
  const fs::path out = fs::temp_directory_path() / "safeckpt_test_cli_tool_convert.safetensors";
  fs::remove(out);
  const std::string args = corpus("argparse_namespace.pt") + " " + out.string();
  CHECK(run_cli("convert --drop-non-tensors " + args).code == 1);
  CHECK(run_cli("convert --drop-non-tensors --allow argparse " + args).code == 0);
  CHECK(fs::exists(out));
  fs::remove(out);
}

TEST_CASE("cli: a missing file is 'cannot open', not 'refused'") {
  auto r = run_cli("inspect /nonexistent/model.pt", true);
  CHECK(r.code == 2);
  CHECK(r.out.find("safeckpt: /nonexistent/model.pt: cannot open\n") == 0);
  CHECK(r.out.find("refused") == std::string::npos);
  r = run_cli("convert /nonexistent/model.pt /tmp/safeckpt_never_written.safetensors", true);
  CHECK(r.code == 2);
  CHECK(r.out.find("safeckpt convert: /nonexistent/model.pt: cannot open\n") == 0);
}

TEST_CASE("cli: --max-memory sets the parse budget in inspect, scan and convert") {
  // many_tensors.pt (3,000 tensors) needs about 16 MiB of budget
  // (limits.hpp survey): refused under 2 MiB, naming the cap; read under 64.
  const std::string f = corpus("many_tensors.pt");
  auto r = run_cli("inspect --max-memory 2 " + f, true);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.out.find("max_memory_bytes") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("--max-memory MIB raises") != std::string::npos, r.out);  // the remedy is named
  r = run_cli("inspect --max-memory 64 " + f, true);
  CHECK_MESSAGE(r.code == 0, r.out);
  r = run_cli("scan --max-memory 2 " + f, true);
  CHECK(r.code != 0);
  CHECK_MESSAGE(r.out.find("max_memory_bytes") != std::string::npos, r.out);
  r = run_cli("scan --max-memory 64 " + f, true);
  CHECK_MESSAGE(r.code == 0, r.out);
  const std::string out = (fs::temp_directory_path() / "safeckpt_max_memory_test.safetensors").string();
  r = run_cli("convert --force --max-memory 2 " + f + " " + out, true);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.out.find("max_memory_bytes") != std::string::npos, r.out);
  CHECK_FALSE(fs::exists(out));
  r = run_cli("inspect --max-memory 0 " + f, true);  // outside 1..1 Mi MiB: a usage error
  CHECK(r.code == 2);
}
