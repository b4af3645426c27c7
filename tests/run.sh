#!/usr/bin/env bash
# Builds (normal and ASan+UBSan) and runs the whole test suite with ctest,
# then fuzzes every libFuzzer target (clang, ASan+UBSan) for a short while.
# Each build tree has one recipe, its CMakePresets.json preset: build/ is
# `dev`, build-asan/ is `asan-ubsan`, build-fuzz/ is `fuzz` (fuzz/run.sh).
# Usage: tests/run.sh            (from the repository root)
# Environment: JOBS (parallelism, default nproc), SAFECKPT_SKIP_SANITIZERS=1
# (normal build only), SAFECKPT_FUZZ_SECONDS (per fuzz target, default 60;
# 0 skips fuzzing; the stage needs clang-14 + libclang-rt-14-dev),
# SAFECKPT_TIDY=0 (skip the curated .clang-tidy, tests/check_tidy.sh; on by
# default: about 2 CPU-minutes on the dev build's compile_commands.json).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
# Formatting first: cheap, and a diff there is a CI failure anyway.
tests/check_format.sh
cmake --preset dev -DSAFECKPT_WERROR=ON >/dev/null
cmake --build --preset dev -j"$jobs"
# --timeout: a test without its own TIMEOUT that hangs fails in 15 minutes
# instead of using up CI's 90 (ctest's own default is no limit).
ctest --preset dev -j"$jobs" -LE slow --timeout 900
if [ "${SAFECKPT_TIDY:-1}" = 1 ]; then
  JOBS=$jobs tests/check_tidy.sh build
fi
if [ "${SAFECKPT_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake --preset asan-ubsan >/dev/null  # no -Werror: GCC warns spuriously under sanitizers
  cmake --build --preset asan-ubsan -j"$jobs"
  # package: installs and builds an unsanitized consumer (done by dev above).
  ctest --preset asan-ubsan -j"$jobs" -LE 'slow|cuda|report|package' --timeout 900
fi
fuzz_secs=${SAFECKPT_FUZZ_SECONDS:-60}
if [ "$fuzz_secs" != 0 ]; then
  # Any crash, leak, timeout or broken invariant fails the run; the input is
  # left in fuzz/crashes/<target>/ (see fuzz/README.md).
  JOBS=$jobs fuzz/run.sh "$fuzz_secs"
fi
