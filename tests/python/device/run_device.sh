#!/usr/bin/env bash
# One call on the GPU machine (issue 16), from /work/main with devrun-python/
# carried: builds the _safeckpt module there for its python3 (3.12) against
# the static libraries built here with CUDA, then runs gpu_check.py, the
# benchmark (cuda and cpu rows) and the pytest suite (torch 2.11, CPU paths).
# so/ carries Debian's libcrypto.so.3 and libz.so.1 (rpath), so the link does
# not depend on what the image has.
set -u
R=$PWD/devrun-python
cd "$R"
echo "== toolchain"; which g++ python3; python3 --version; g++ --version | head -1
INC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
PYB=$(python3 -c "import pybind11; print(pybind11.get_include())")
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ ! -f "$INC/Python.h" ]; then  # look for 3.12 headers elsewhere
  H=$(find /usr /opt -name Python.h -path "*3.12*" 2>/dev/null | head -1); [ -n "$H" ] && INC=$(dirname "$H")
fi
echo "Python.h: $(ls $INC/Python.h 2>&1)  pybind11: $PYB"
mkdir -p mod/safeckpt && cp python/safeckpt/*.py mod/safeckpt/
echo "== build"
time g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -DSAFECKPT_PYTHON_CUDA=1 -DSAFECKPT_HAVE_CUDA=1 -I"$INC" -I"$PYB" \
  -Iinclude -Iscanner/include -Igen python/src/module.cpp -o mod/safeckpt/_safeckpt$EXT \
  -Wl,--start-group libs/*.a -Wl,--end-group -Lso -l:libz.so.1 -l:libcrypto.so.3 -Wl,-rpath,$R/so \
  -lpthread -ldl -lrt 2>&1 | tail -20
ls -la mod/safeckpt/ | grep _safeckpt || { echo "BUILD FAILED"; exit 3; }
export PYTHONPATH=$R/mod:$R/tests/python SAFECKPT_TEST_DATA=$R/data PYTHONDONTWRITEBYTECODE=1
python3 -c "import safeckpt, torch; print('safeckpt', safeckpt.__version__, 'cuda', safeckpt.HAS_CUDA, 'torch', torch.__version__)"
echo "== gpu_check"; timeout 60 python3 tests/python/device/gpu_check.py data/corpus/torch-2.11 2>&1 | tee $OUT/gpu_check.txt
echo "== bench"; nproc; free -g | head -2
timeout 60 python3 bench/python_load_bench.py make /dev/shm/b --gib 2 --tensors 32 2>&1 | tail -2
(timeout 40 python3 bench/python_load_bench.py run /dev/shm/b --device cuda --repeat 3
 timeout 45 python3 bench/python_load_bench.py run /dev/shm/b --device cpu --repeat 2) 2>&1 | tee $OUT/bench.txt
echo "== pytest (torch 2.11; the safetensors test needs the CLI, not carried)"
(cd tests/python && timeout 40 python3 -m pytest -q -p no:cacheprovider . \
   --deselect test_save_open.py::test_safe_open_safetensors_and_load 2>&1 | tail -15) | tee $OUT/pytest.txt
