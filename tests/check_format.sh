#!/usr/bin/env bash
# Fails when a tracked C++/CUDA file differs from what clang-format makes of
# it (.clang-format at the root). Usage: tests/check_format.sh [--fix]
# Environment: CLANG_FORMAT (default clang-format-14, else clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$cf" ]; then
  echo "check_format: clang-format-14 not found (apt-get install clang-format-14)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' ':!:tests/package/layers_bad/**')
if [ "${1:-}" = --fix ]; then
  "$cf" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$cf" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "check_format: $f is not clang-formatted (run: $cf -i $f, or tests/check_format.sh --fix)" >&2
    bad=1
  fi
done
exit $bad
