#!/usr/bin/env bash
# Runs the curated .clang-tidy on the library, scanner and CLI sources.
# Usage: tests/check_tidy.sh BUILD_DIR [FILE...]   (BUILD_DIR has
# compile_commands.json: the presets export it). Environment: JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tests/check_tidy.sh BUILD_DIR [FILE...]}
shift
tidy=${CLANG_TIDY:-$(command -v clang-tidy-14 || command -v clang-tidy || true)}
if [ -z "$tidy" ]; then
  echo "check_tidy: clang-tidy-14 not found (apt-get install clang-tidy-14)" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files 'src/*.cpp' 'scanner/src/*.cpp' 'cli/*.cpp' 'python/src/*.cpp')
fi
printf '%s\n' "${files[@]}" | xargs -P "${JOBS:-$(nproc)}" -n 4 "$tidy" -p "$build" --quiet
