# Sourced at the start of a device call (repo root as cwd; `carry` named
# devrun/, made by bench/devrun_pack.sh): unpacks the binaries into
# /tmp/bin, puts their libraries and the cu13 NVIDIA wheels' (cuBLASLt,
# NVRTC, cuDNN: what the engine dlopens, HACKING.md "GPU machine") on
# LD_LIBRARY_PATH, and defines
#   W              /dev/shm/et, where export_model writes programs
#   export_model   gpt2|bert|resnet [float32|bfloat16]: a real-size program
#                  (bench/export_*.py; bert at batch 1 and 32, resnet both
#                  dtypes when none is given)
#   left MSG       MSG with the seconds used and left of BUDGET (default 580)
# and prints the GPU. It leaves `set -uo pipefail` on in the calling shell.
# Example: `source bench/devrun_env.sh; export_model gpt2
# bfloat16; /tmp/bin/safeckpt bench-engine $W/gpt2_124m_bfloat16.train.pt2 --batch 32`.
set -uo pipefail
START=$(date +%s)
BUDGET=${BUDGET:-580}
left() { echo "[$(($(date +%s) - START))s used, $((BUDGET - ($(date +%s) - START)))s left] $*"; }
mkdir -p /tmp/bin && tar xJf devrun/devrun.tar.xz -C /tmp/bin || {
  echo "devrun_env: devrun/devrun.tar.xz did not unpack (run bench/devrun_pack.sh here, carry devrun)" >&2
  return 1
}
NV=$(python3 -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))")/nvidia
LIBS=/tmp/bin/lib
for d in "$NV"/*/lib; do [ -d "$d" ] && LIBS="$LIBS:$d"; done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SAFECKPT_TEST_DATA_DIR=$PWD/tests/data
export PYTHONUNBUFFERED=1
W=/dev/shm/et
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export_model() {
  case ${1:-} in
    gpt2) python3 bench/export_gpt2_124m.py "$W" --dtype "${2:-bfloat16}" ;;
    bert) python3 bench/export_bert_base.py "$W" --dtype "${2:-bfloat16}" --batch 1,32 ;;
    resnet) python3 bench/export_resnet50.py "$W" --dtype "${2:-both}" ;;
    *) echo "export_model: gpt2|bert|resnet [dtype]" >&2; return 2 ;;
  esac
}
