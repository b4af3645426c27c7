#!/usr/bin/env bash
# Issue 14's benchmark table on the GPU machine: every model x batch x dtype
# row of `safeckpt bench-engine` with PyTorch 2.11's rows in the same run
# (bench/engine_baselines.py), in parts that each fit one device call.
#
# usage: bench/engine_table.sh PART [BIN_DIR] [WORK_DIR]
#   PART     export   the real-size programs into WORK_DIR (GPT-2 124M, BERT-base
#                     at batch 1 and 32, ResNet-50; float32 and bfloat16; ~3 min)
#            gpt2 | bert | resnet   that model's four rows (batch 1 and 32 x
#                     float32 and bfloat16), then a summary table
#            rows     all twelve rows (more than one device call's 10 minutes)
#   BIN_DIR  where the `safeckpt` binary is (default build/cli)
#   WORK_DIR the exported programs (default /dev/shm/safeckpt-engine-table)
# Environment: ITERS (timed runs per row, default 20), EXTRA (more bench-engine
# flags, e.g. "--no-gemm-autotune" or "--no-gemm-epilogue" for an A/B run),
# OUT (where each row's full output is kept; default WORK_DIR/out).
#
# The summary's ratio is ours / torch.compile(mode="reduce-overhead"), warm
# replay, both medians from the same call (the issue's bar: <= 1.0). See
# HACKING.md "Benchmarks" for the libraries the binary needs there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
part=${1:?usage: bench/engine_table.sh export|gpt2|bert|resnet|rows [BIN_DIR] [WORK_DIR]}
bin=${2:-build/cli}
work=${3:-/dev/shm/safeckpt-engine-table}
iters=${ITERS:-20}
extra=${EXTRA:-}
out=${OUT:-$work/out}
mkdir -p "$work" "$out"

rows_of() {  # model -> "program batch" lines
  case $1 in
    gpt2) for d in float32 bfloat16; do for b in 1 32; do echo "gpt2_124m_$d.train.pt2 $b"; done; done ;;
    bert) for d in float32 bfloat16; do for b in 1 32; do echo "bert_base_${d}_b$b.train.pt2 $b"; done; done ;;
    resnet) for d in float32 bfloat16; do for b in 1 32; do echo "resnet50_$d.train.pt2 $b"; done; done ;;
  esac
}

# The value (ms) of the row whose label starts with $2 in file $1.
value() { grep -F "  $2" "$1" | head -1 | awk '{print $NF}'; }

run_row() {
  local prog=$1 batch=$2 name=${1%.train.pt2}_b$2
  local log="$out/$name.txt"
  if [ ! -f "$work/$prog" ]; then
    echo "$name: $work/$prog missing (run: bench/engine_table.sh export)" | tee "$log"
    return
  fi
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  "$bin/safeckpt" bench-engine "$work/$prog" --batch "$batch" --iters "$iters" $extra \
    --baselines "python3 bench/engine_baselines.py $work/$prog --batch $batch --iters $iters" >"$log" 2>&1
  echo "$name: exit $? ($log)"
}

summary() {
  printf '\n%-26s %12s %12s %7s %18s %12s %18s\n' "row (batch)" "ours warm" "t.c. r-o" "ratio" \
    "cold ours/t.c." "warm cache" "file->out ours/pt"
  for f in "$@"; do
    [ -f "$f" ] || continue
    local ours tc cold tcc warm file pfile
    ours=$(value "$f" "safeckpt compiled, warm (CUDA graph replay")
    tc=$(value "$f" "torch.compile reduce-overhead, warm")
    tcc=$(value "$f" "torch.compile first call, empty inductor cache")
    file=$(value "$f" "safeckpt file -> first output")
    pfile=$(value "$f" "PyTorch file -> first output")
    # The cold and warm-cache rows end with cache counters: take the number after the label.
    cold=$(grep -F "safeckpt first call, cold engine" "$f" | head -1 | sed -E 's/.*\)[[:space:]]+([0-9.]+).*/\1/')
    warm=$(grep -F "safeckpt first call, warm persistent cache" "$f" | head -1 |
      sed -E 's/.*\)[[:space:]]+([0-9.]+).*/\1/')
    local ratio="-"
    if [ -n "$ours" ] && [ -n "$tc" ]; then ratio=$(awk -v a="$ours" -v b="$tc" 'BEGIN{printf "%.3f", a/b}'); fi
    printf '%-26s %12s %12s %7s %18s %12s %18s\n' "$(basename "$f" .txt)" "${ours:--}" "${tc:--}" "$ratio" \
      "${cold:--}/${tcc:--}" "${warm:--}" "${file:--}/${pfile:--}"
  done
}

case $part in
  export)
    python3 bench/export_gpt2_124m.py "$work" --dtype float32
    python3 bench/export_gpt2_124m.py "$work" --dtype bfloat16
    python3 bench/export_bert_base.py "$work" --dtype float32 --batch 1,32
    python3 bench/export_bert_base.py "$work" --dtype bfloat16 --batch 1,32
    python3 bench/export_resnet50.py "$work" --dtype both
    ls -la "$work"
    ;;
  gpt2 | bert | resnet | rows)
    models=$part
    [ "$part" = rows ] && models="gpt2 bert resnet"
    logs=()
    for m in $models; do
      while read -r prog batch; do
        run_row "$prog" "$batch"
        logs+=("$out/${prog%.train.pt2}_b$batch.txt")
      done < <(rows_of "$m")
    done
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    echo "bench-engine --iters $iters $extra"
    summary "${logs[@]}"
    ;;
  *)
    echo "unknown part '$part'" >&2
    exit 2
    ;;
esac
