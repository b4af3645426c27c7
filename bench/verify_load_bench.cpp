// What verify-then-load costs (issue 15): safeckpt::load and, in a CUDA
// build, cuda::load_to_device of one checkpoint, without a verifier and with
// LoadOptions::verify_bytes = sign::make_load_verifier for a `files` and a
// `shards` bundle, against `sha256sum` of the same bytes and the verifier's
// hashing alone (sign::verify_model), in the same run, warm page cache.
//
//   safeckpt_verify_load_bench FILE --key PEM --pub PEM [--runs N] [--shard-mib S] [--no-device]
//
// FILE is signed twice into FILE's directory (FILE.files.sig,
// FILE.shards.sig) with the EC private key PEM; PUB is its public key. Each
// row is the best of N runs (default 3). "added" = row minus the same load
// without a verifier.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/sign.hpp"
#ifdef SAFECKPT_BENCH_CUDA
#include "safeckpt/device_checkpoint.hpp"
#endif

namespace fs = std::filesystem;
using namespace safeckpt;

namespace {

double best_of(int runs, const std::function<bool()>& f) {
  double best = 1e300;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!f()) return -1;
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

[[noreturn]] void die(const std::string& what, const Error& e) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE --key PEM --pub PEM [--runs N] [--shard-mib S] [--no-device]\n", argv[0]);
    return 2;
  }
  const fs::path file = argv[1];
  fs::path key, pub;
  int runs = 3;
  int shard_mib = 256;
  bool device = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--key") key = next();
    if (a == "--pub") pub = next();
    if (a == "--runs") runs = std::max(1, std::atoi(next().c_str()));
    if (a == "--shard-mib") shard_mib = std::atoi(next().c_str());
    if (a == "--no-device") device = false;
  }
  auto signer = sign::signer_from_files(key, {}, {});
  if (!signer) die("key", signer.error());
  auto trust = sign::trust_from_public_key_file(pub);
  if (!trust) die("public key", trust.error());
  const std::uint64_t bytes = fs::file_size(file);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  struct Signed {
    const char* name;
    sign::Bundle bundle;
    std::function<Status(Bytes, const fs::path&)> verifier;
  };
  std::vector<Signed> bundles;
  for (sign::Method m : {sign::Method::kFiles, sign::Method::kShards}) {
    sign::SignOptions so;
    so.hash.method = m;
    so.hash.shard_size = std::uint64_t(shard_mib) << 20;
    const char* name = m == sign::Method::kFiles ? "files" : "shards";
    const fs::path sig = file.string() + "." + name + ".sig";
    auto b = sign::sign_model(file, sig, *signer, so);
    if (!b) die("sign", b.error());
    auto v = sign::make_load_verifier(*b, *trust);
    if (!v) die("verifier", v.error());
    bundles.push_back({name, std::move(*b), std::move(*v)});
  }

  std::printf("file %s: %.2f GB; %u CPU threads; best of %d warm runs; shards of %d MiB\n\n", file.c_str(),
              double(bytes) / 1e9, cores, runs, shard_mib);
  std::printf("| what | verifier | s | GB/s of the file | added s |\n|---|---|---|---|---|\n");
  auto row = [&](const char* what, const char* verifier, double s, double base) {
    if (s < 0) {
      std::printf("| %s | %s | failed | | |\n", what, verifier);
      return;
    }
    std::printf("| %s | %s | %.3f | %.2f | %s |\n", what, verifier, s, double(bytes) / s / 1e9,
                base > 0 ? std::to_string(s - base).substr(0, 6).c_str() : "");
  };
  const std::string quoted = "'" + file.string() + "'";
  if (std::system(("cat " + quoted + " > /dev/null").c_str()) != 0) return 1;  // warm the page cache
  row("sha256sum (one core, coreutils)", "",
      best_of(1, [&] { return std::system(("sha256sum " + quoted + " > /dev/null").c_str()) == 0; }), 0);
  for (const Signed& s : bundles) {
    row("sign::verify_model (hashing + signature)", s.name,
        best_of(runs,
                [&] {
                  auto r = sign::verify_model(file, s.bundle, *trust);
                  return r && r->ok();
                }),
        0);
  }

  const double host = best_of(runs, [&] { return load(file).has_value(); });
  row("safeckpt::load", "none", host, 0);
  for (const Signed& s : bundles) {
    LoadOptions lo;
    lo.verify_bytes = s.verifier;
    row("safeckpt::load", s.name, best_of(runs, [&] { return load(file, lo).has_value(); }), host);
  }

#ifdef SAFECKPT_BENCH_CUDA
  if (device) {
    auto engine = cuda::TransferEngine::create({});
    if (!engine) die("engine", engine.error());
    auto dev_load = [&](const cuda::DeviceLoadOptions& o) {
      auto d = cuda::load_to_device(file, o, &*engine);
      if (!d) std::fprintf(stderr, "load_to_device: %s\n", d.error().to_string().c_str());
      return d.has_value();
    };
    (void)dev_load({});  // the engine's ring pinned, the CUDA context made
    const double gpu = best_of(runs, [&] { return dev_load({}); });
    row("cuda::load_to_device (engine reused)", "none", gpu, 0);
    for (const Signed& s : bundles) {
      cuda::DeviceLoadOptions o;
      o.load.verify_bytes = s.verifier;
      row("cuda::load_to_device (engine reused)", s.name, best_of(runs, [&] { return dev_load(o); }), gpu);
    }
  }
#else
  (void)device;
  std::printf("| cuda::load_to_device | | not built (no CUDA) | | |\n");
#endif
  return 0;
}
