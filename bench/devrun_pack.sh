#!/usr/bin/env bash
# Packs the binaries a device call needs into devrun/ (git-ignored; name it
# in the device tool's `carry`): BUILD_DIR's CLI and engine tests (or the
# targets named), stripped, plus the Debian shared libraries they link that
# the GPU machine's image lacks (libopenblas, libgfortran, libquadmath,
# libboost_serialization, libfmt: every one ldd resolves but the C/C++
# runtime's and libz / libcrypto / libssl, which the image has and its
# Python loads: a Debian copy first on LD_LIBRARY_PATH could shadow them),
# as one devrun/devrun.tar.xz (~10 MiB of the 64 MiB a call may carry).
# On the device, `source bench/devrun_env.sh` unpacks it into /tmp/bin.
#
# usage: bench/devrun_pack.sh [BUILD_DIR] [BINARY...]
#   BUILD_DIR  a build with -DSAFECKPT_CUDA=ON (default: build)
#   BINARY     paths under BUILD_DIR (default: cli/safeckpt
#              tests/safeckpt_engine_tests)
# Rebuild every binary after a header change before packing (HACKING.md
# "GPU machine": two layouts of one struct in one binary crashed there).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(cli/safeckpt tests/safeckpt_engine_tests)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" devrun
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { echo "devrun_pack: $build/$b missing (build it first)" >&2; exit 2; }
  strip -o "$stage/$(basename "$b")" "$build/$b"
  # The resolved libraries the image lacks (above), by their real files.
  ldd "$build/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    grep -v -E '^(linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libz\.so|libcrypto|libssl)' |
    while read -r name path; do cp -L "$path" "$stage/lib/$name"; done
done
tar cJf devrun/devrun.tar.xz -C "$stage" .
echo "devrun/devrun.tar.xz: $(du -h devrun/devrun.tar.xz | cut -f1) ($(ls "$stage" | grep -v '^lib$' | tr '\n' ' ')+ lib/: $(ls "$stage/lib" | tr '\n' ' '))"
