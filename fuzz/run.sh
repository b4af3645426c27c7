#!/bin/sh
# fuzz/run.sh SECONDS [TARGET...] — build every fuzzer with the `fuzz` preset
# (clang, libFuzzer + ASan + UBSan, -fno-sanitize-recover=all) and run each for SECONDS over a
# scratch copy of its corpus. Exit status 0 only if no target crashed, leaked,
# timed out, ran out of memory or broke an invariant.
#
# Crashing inputs are left in fuzz/crashes/<target>/ (libFuzzer's
# crash-/leak-/timeout-/oom- files); re-running cmake adds that directory to
# the target's ctest replay (fuzz.<target>). Once triaged, move an input to
# fuzz/regressions/<target>/ with a descriptive name.
#
# Environment:
#   JOBS=N        targets fuzzed at once (default 1; CI on 2 cores: 2)
#   NICE=N        nice level for the fuzzers (default 19)
#   BUILD_DIR=D   build tree (default <repo>/build-fuzz)
#   CXX=...       clang++ to use instead of the preset's clang++-14
#   MAX_LEN=N     largest input libFuzzer generates (default 65536)
#   SKIP_BUILD=1  use the existing build
#   KEEP_GOING=1  libFuzzer fork mode (-fork=1 -ignore_crashes=1 ...): keep
#                 fuzzing after a crash so one run collects several bugs
# Per-target logs and a summary table (exec/s, coverage) are written to
# $BUILD_DIR/fuzz/logs/.
set -eu

secs=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD_DIR:-$root/build-fuzz}
jobs=${JOBS:-1}
nice_level=${NICE:-19}
max_len=${MAX_LEN:-65536}

# One recipe per build tree: the `fuzz` preset (CMakePresets.json: clang-14,
# libFuzzer, ASan+UBSan, no CUDA, no bench) configures $build; CXX, when set,
# only swaps the compiler.
if [ -z "${SKIP_BUILD:-}" ]; then
  cxx_args=""
  if [ -n "${CXX:-}" ]; then
    cxx_args="-DCMAKE_C_COMPILER=$(echo "$CXX" | sed 's/clang++/clang/') -DCMAKE_CXX_COMPILER=$CXX"
  fi
  # shellcheck disable=SC2086
  (cd "$root" && cmake --preset fuzz -B "$build" $cxx_args >/dev/null)
  nice -n "$nice_level" cmake --build "$build" --target safeckpt_fuzzers -- -j"$(nproc)"
fi

sh "$here/make_seeds.sh" "$build/fuzz/seeds" >/dev/null
logs=$build/fuzz/logs
work=$build/fuzz/work
mkdir -p "$logs" "$work"

if [ $# -gt 0 ]; then
  targets=$*
else
  targets=$(cd "$build/fuzz" && ls fuzz_* 2>/dev/null | sed 's/^fuzz_//' | tr '\n' ' ')
fi
[ -n "$targets" ] || { echo "run.sh: no fuzz targets built in $build/fuzz" >&2; exit 2; }

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# run_one TARGET: replay seeds + regressions, then fuzz; status in $logs/TARGET.rc
run_one() {
  t=$1
  bin=$build/fuzz/fuzz_$t
  corpus=$work/$t
  crashes=$here/crashes/$t
  rm -rf "$corpus"
  mkdir -p "$corpus" "$crashes"
  # Seeds larger than max_len only slow libFuzzer down; they are replayed by ctest.
  for d in "$build/fuzz/seeds/$t" "$here/corpus/$t"; do
    [ -d "$d" ] && find "$d" -type f -size -"$((max_len + 1))"c -exec cp {} "$corpus/" \;
  done
  case $t in
    pickle|pickle_torch) dict=$here/pickle.dict ;;
    *) dict=$work/all.dict; cat "$here/zip.dict" "$here/pickle.dict" >"$dict" ;;
  esac
  rc=0
  # 1. Known crashers must be fixed: replay regressions first.
  if [ -d "$here/regressions/$t" ] && [ -n "$(ls -A "$here/regressions/$t" 2>/dev/null)" ]; then
    "$bin" -runs=0 "$here/regressions/$t" >"$logs/$t.replay.log" 2>&1 || rc=1
  fi
  # 2. Fuzz.
  keep=""
  [ -n "${KEEP_GOING:-}" ] && keep="-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1"
  # shellcheck disable=SC2086
  nice -n "$nice_level" "$bin" "$corpus" -max_total_time="$secs" -max_len="$max_len" -timeout=25 \
    -rss_limit_mb=2560 -malloc_limit_mb=2048 -dict="$dict" -print_final_stats=1 -artifact_prefix="$crashes/" \
    $keep >"$logs/$t.log" 2>&1 || rc=1
  echo "$rc" >"$logs/$t.rc"
}

start=$(date +%s)
running=0
for t in $targets; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait
    running=0
  fi
done
wait
elapsed=$(($(date +%s) - start))

# Summary: target | status | runs | exec/s | cov | ft | corpus | crashes
status=0
summary=$logs/summary.md
{
  echo "fuzz/run.sh $secs s per target, JOBS=$jobs, $(date -u '+%Y-%m-%d %H:%M UTC'), wall ${elapsed}s"
  echo
  echo "| target | status | runs | exec/s | cov | ft | corpus | crash files |"
  echo "|---|---|---|---|---|---|---|---|"
  for t in $targets; do
    log=$logs/$t.log
    rc=$(cat "$logs/$t.rc" 2>/dev/null || echo 1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    if [ -z "$runs" ]; then  # fork mode: "#N: cov: .. ft: .. corp: .. exec/s: .."
      runs=$(echo "$last" | sed -n 's/^#\([0-9]*\).*/\1/p')
      eps=$(echo "$last" | sed -n 's/.*exec\/s:* \([0-9]*\).*/\1/p')
    fi
    cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.*corp: \([0-9/a-zA-Z]*\).*/\1/p')
    ncrash=$(ls "$here/crashes/$t" 2>/dev/null | wc -l)
    st=ok
    if [ "$rc" != 0 ] || [ "$ncrash" -gt 0 ]; then st=FAIL; status=1; fi
    echo "| $t | $st | ${runs:-?} | ${eps:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $ncrash |"
  done
} >"$summary"
cat "$summary"
if [ "$status" != 0 ]; then
  echo
  echo "run.sh: failures. Logs: $logs/<target>.log (and <target>.replay.log); inputs: fuzz/crashes/<target>/"
  for t in $targets; do
    if [ "$(cat "$logs/$t.rc" 2>/dev/null || echo 1)" != 0 ]; then
      echo "--- $t"
      grep -E -m3 'invariant failed|ERROR: |SUMMARY: |runtime error' "$logs/$t.replay.log" "$logs/$t.log" 2>/dev/null || true
    fi
  done
fi
exit "$status"
