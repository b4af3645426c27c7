#!/usr/bin/env bash
# One call on the GPU machine (issue 16), from the repository root with
# devrun-python/ carried (HACKING.md "GPU machine"): builds the _safeckpt
# module there for its python3 (3.12) against the static libraries built here
# with CUDA (devrun-python/libs, gen/), then runs gpu_check.py, the pytest
# files (torch 2.11: CPU paths plus the GPU map_location/safe_open tests) and
# `safeckpt bench` with the Python package's rows (bench/python_load_bench.py
# rows) next to the C++ loader, torch.load and safetensors.
# devrun-python/so carries Debian's libcrypto.so.3 and libz.so.1 (rpath) and
# devrun-python/bin the CLI with its libfmt.so.9, so nothing depends on what
# the image has. Sources (include/, python/, tests/, bench/) are the tree's.
set -u
ROOT=$PWD
R=$ROOT/devrun-python
OUT=${OUT:-/tmp/out}
if [ ! -d "$R/libs" ] || [ ! -x "$R/bin/safeckpt" ]; then
  echo "run_device.sh: $R/libs or $R/bin/safeckpt missing: the device tool copies the session's checkout;" \
       "build devrun-python/ there and pass carry=[\"devrun-python\"] (HACKING.md \"GPU machine\")"
  exit 2
fi
mkdir -p "$OUT"
echo "== toolchain"; which g++ python3; python3 --version; g++ --version | head -1
INC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
PYB=$(python3 -c "import pybind11; print(pybind11.get_include())")
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ ! -f "$INC/Python.h" ]; then  # look for 3.12 headers elsewhere
  H=$(find /usr /opt -name Python.h -path "*3.12*" 2>/dev/null | head -1); [ -n "$H" ] && INC=$(dirname "$H")
fi
echo "Python.h: $(ls $INC/Python.h 2>&1)  pybind11: $PYB"
M=$R/mod
mkdir -p $M/safeckpt && cp python/safeckpt/*.py $M/safeckpt/
echo "== build"
time g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -DSAFECKPT_PYTHON_CUDA=1 -DSAFECKPT_HAVE_CUDA=1 -I"$INC" -I"$PYB" \
  -Iinclude -Iscanner/include -I$R/gen python/src/module.cpp -o $M/safeckpt/_safeckpt$EXT \
  -Wl,--start-group $R/libs/*.a -Wl,--end-group -L$R/so -l:libz.so.1 -l:libcrypto.so.3 -Wl,-rpath,$R/so \
  -lpthread -ldl -lrt 2>&1 | tail -20
ls -la $M/safeckpt/ | grep _safeckpt || { echo "BUILD FAILED"; exit 3; }
export PYTHONPATH=$M:$ROOT/tests/python SAFECKPT_TEST_DATA=$ROOT/tests/data PYTHONDONTWRITEBYTECODE=1
export LD_LIBRARY_PATH=$R/bin/lib:${LD_LIBRARY_PATH:-} SAFECKPT_CLI=$R/bin/safeckpt
python3 -c "import safeckpt, torch; print('safeckpt', safeckpt.__version__, 'cuda', safeckpt.HAS_CUDA, 'torch', torch.__version__)"
echo "== gpu_check"; timeout 75 python3 tests/python/device/gpu_check.py tests/data/corpus/torch-2.11 2>&1 | tee $OUT/gpu_check.txt | tail -25
echo "== pytest (torch 2.11)"
(cd tests/python && timeout 60 python3 -m pytest -q -p no:cacheprovider -rs . 2>&1 | tail -25) | tee $OUT/pytest.txt
echo "== safeckpt bench with the Python rows"; nproc; free -g | head -2
timeout 125 $R/bin/safeckpt bench --dir /dev/shm/b --gen-gib 2 --runs 3 \
  --baselines "python3 bench/python_load_bench.py rows --repeat 2" > $OUT/bench.txt 2> $OUT/bench.err
echo "bench rc=$?"; cat $OUT/bench.txt; tail -5 $OUT/bench.err
