#!/usr/bin/env python3
"""Times NVRTC on one CUDA C++ source, as the engine compiles its generated modules
(src/engine/module_cache.cpp nvrtc_options), to tell NVRTC's own time from the driver's compute
cache (bench/RESULTS.md 2026-12-05 "NVRTC").

usage: nvrtc_time.py SOURCE.cu [EXTRA NVRTC FLAGS...]

Loads libnvrtc.so.13 (/usr/local/cuda/lib64, else PyTorch's nvidia wheels), compiles a tiny kernel
once (loading NVRTC), then SOURCE three times in this process, and prints the seconds of each
nvrtcCompileProgram. Run it in several processes, with CUDA_CACHE_PATH / CUDA_CACHE_DISABLE=1, to
see what the cache keeps. SOURCE: a generated module, e.g. detail::dry_plan(...).source of a
program (what the engine tests' "planning every pt2-2.11-extra program" case compiles).
"""
import ctypes, glob, os, sys, time

BASE = ["--gpu-architecture=sm_90", "--std=c++17", "-default-device"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cands = sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so.13*")) + sorted(
        glob.glob(os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/**/libnvrtc.so.13*"), recursive=True))
    if not cands:
        sys.exit("libnvrtc.so.13 not found")
    lib = ctypes.CDLL(cands[0])

    def compile_s(src, opts):
        prog = ctypes.c_void_p()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) != 0:
            sys.exit("nvrtcCreateProgram failed")
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        t = time.time()
        rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
        dt = time.time() - t
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        if rc != 0:
            sys.exit(f"nvrtcCompileProgram failed ({rc}) with {opts}")
        return round(dt, 3)

    t0 = time.time()
    compile_s("__global__ void k() {}", BASE)
    first = round(time.time() - t0, 3)
    src = open(sys.argv[1]).read()
    opts = BASE + sys.argv[2:]
    print(os.path.basename(sys.argv[1]), sys.argv[2:], "lib", cands[0], "load+tiny", first, "compiles",
          [compile_s(src, opts) for _ in range(3)])


if __name__ == "__main__":
    main()
