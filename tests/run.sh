#!/usr/bin/env bash
# Builds (normal and ASan+UBSan) and runs the whole test suite with ctest,
# then fuzzes every libFuzzer target (clang, ASan+UBSan) for a short while.
# Usage: tests/run.sh            (from the repository root)
# Environment: JOBS (parallelism, default nproc), SAFECKPT_SKIP_SANITIZERS=1
# (normal build only), SAFECKPT_FUZZ_SECONDS (per fuzz target, default 90;
# 0 skips fuzzing; the stage needs clang-14 + libclang-rt-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSAFECKPT_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -LE slow
if [ "${SAFECKPT_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSAFECKPT_CUDA=OFF -DSAFECKPT_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE 'slow|cuda|report'
fi
fuzz_secs=${SAFECKPT_FUZZ_SECONDS:-90}
if [ "$fuzz_secs" != 0 ]; then
  # Any crash, leak, timeout or broken invariant fails the run; the input is
  # left in fuzz/crashes/<target>/ (see fuzz/README.md).
  JOBS=$jobs fuzz/run.sh "$fuzz_secs"
fi
