#!/usr/bin/env bash
# Packs the binaries a device call needs into devrun/ (git-ignored; name it
# in the device tool's `carry`): BUILD_DIR's CLI and engine tests (or the
# binaries named), stripped, plus the Debian shared libraries they link that
# the GPU machine's image lacks, as one devrun/devrun.tar.xz (~10 MiB of the
# 64 MiB a call may carry). On the device, `source bench/devrun_env.sh`
# unpacks it into /tmp/bin.
#
# usage: bench/devrun_pack.sh [BUILD_DIR] [BINARY...]
#   BUILD_DIR  a build with -DSAFECKPT_CUDA=ON (default: build)
#   BINARY     paths under BUILD_DIR (default: cli/safeckpt
#              tests/safeckpt_engine_tests)
# Environment: DEVRUN_LIBS, an extended regex of the library names to carry
# (default: the ones the image lacked on 2026-12-06 - OpenBLAS and its
# Fortran runtime, Boost.Serialization, fmt). Only those go: the C/C++
# runtime, libz, libcrypto and the driver's libraries are the image's own,
# and a Debian copy first on LD_LIBRARY_PATH would shadow what its Python
# loads. `ldd BINARY | grep 'not found'` there says what else a new
# dependency needs. Rebuild every binary after a header change before
# packing (HACKING.md "GPU machine": two layouts of one struct in one
# binary crashed there).
set -euo pipefail
build=$(realpath "${1:-build}")
shift || true
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(cli/safeckpt tests/safeckpt_engine_tests)
carry=${DEVRUN_LIBS:-'^lib(openblas|gfortran|quadmath|boost_serialization|fmt)\.so'}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" devrun
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { echo "devrun_pack: $build/$b missing (build it first)" >&2; exit 2; }
  strip -o "$stage/$(basename "$b")" "$build/$b"
  deps=$(ldd "$build/$b" || true)
  if grep -q 'not found' <<<"$deps"; then
    echo "devrun_pack: $build/$b: libraries not found here:" >&2
    grep 'not found' <<<"$deps" >&2
    exit 2
  fi
  while read -r name path; do
    if [[ $name =~ $carry ]]; then cp -L "$path" "$stage/lib/$name"; fi
  done < <(awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' <<<"$deps")
done
tar cJf devrun/devrun.tar.xz -C "$stage" .
echo "devrun/devrun.tar.xz: $(du -h devrun/devrun.tar.xz | cut -f1);" \
  "binaries: $(cd "$stage" && ls -p | grep -v / | tr '\n' ' ')lib/: $(ls "$stage/lib" | tr '\n' ' ')"
