#!/usr/bin/env python3
"""PyTorch rows for `safeckpt bench-engine` (issue 14), on the same PT2 program.

usage: engine_baselines.py PROGRAM.pt2 [--batch N] [--iters N] [--no-compile]

Rows (ms): PyTorch eager (the exported module, ep.module()), torch.compile(mode="reduce-overhead")
warm replay, its first call with an empty TORCHINDUCTOR_CACHE_DIR (cold) and again in a new
process with that cache (warm cache), and file -> first output (torch.export.load + .to(cuda) +
torch.compile + first call, in the cold process). Compile phases run in child processes so every
cold number starts from a fresh interpreter. Inputs as the C++ bench makes them: the program's
example shapes with dim 0 = --batch, int64 in [0, 64), floats in [-1, 1). TF32 left at PyTorch's
defaults (matmul off, cuDNN convolutions on: the engine's defaults too, safeckpt/engine.hpp).
"""
import argparse, json, os, subprocess, sys, tempfile, time


def cuda_module(ep, torch):
    """ep.module() on the GPU. Programs exported on CPU inputs bake device=cpu into factory ops
    (arange, full, scalar_tensor); those kwargs are pointed at cuda, as the C++ engine does."""
    m = ep.module()
    for n in m.graph.nodes:
        if "device" in n.kwargs and str(n.kwargs["device"]).startswith("cpu"):
            kw = dict(n.kwargs)
            kw["device"] = torch.device("cuda")
            n.kwargs = kw
    m.recompile()
    return m.to("cuda")


def make_inputs(ep, batch, torch):
    args = ep.example_inputs[0] if ep.example_inputs is not None else ()
    out = []
    g = torch.Generator().manual_seed(0)
    for a in args:
        shape = list(a.shape)
        if batch and shape:
            shape[0] = batch
        if a.dtype == torch.int64:
            out.append(torch.randint(0, 64, shape, generator=g).cuda())
        else:
            out.append((torch.rand(shape, generator=g) * 2 - 1).to(a.dtype).cuda())
    return out


def median_ms(fn, iters, torch):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def child(a):
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # CUDA context outside the timings, as in the C++ bench
    t_file = time.perf_counter()
    ep = torch.export.load(a.program)
    m = cuda_module(ep, torch)
    x = make_inputs(ep, a.batch, torch)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    t_c = time.perf_counter()
    cm = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        cm(*x)
        torch.cuda.synchronize()
    first = (time.perf_counter() - t_c) * 1e3
    file_ms = (time.perf_counter() - t_file) * 1e3
    res = {"first_ms": first, "file_ms": file_ms}
    if a.phase == "cold":
        with torch.no_grad():
            res["warm_ms"] = median_ms(lambda: cm(*x), a.iters, torch)
        torch.cuda.synchronize()
        res["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    print("RESULT " + json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--phase", default="")
    a = ap.parse_args()
    if a.phase:
        return child(a)
    import torch
    ep = torch.export.load(a.program)
    m = cuda_module(ep, torch)
    x = make_inputs(ep, a.batch, torch)
    with torch.no_grad():
        eager = median_ms(lambda: m(*x), a.iters, torch)
        # Peak device memory one eager call adds on top of weights and inputs
        # (activations, workspaces, the outputs): the caching allocator's
        # peak minus what was allocated before the call.
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = m(*x)
        torch.cuda.synchronize()
        peak_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
        del out
    print(f"torch {torch.__version__}; matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
          f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    print(f"{'PyTorch eager (ep.module(), median)':58s} {eager:12.3f}")
    print(f"{'PyTorch eager, peak memory of one call over weights+inputs (MiB)':58s} {peak_mib:12.1f}")
    if a.no_compile:
        print(f"{'torch.compile rows':58s} {'skipped':>12s}")
        return
    cache = tempfile.mkdtemp(prefix="inductor_")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    rows = {}
    for phase in ("cold", "warm"):
        r = subprocess.run([sys.executable, __file__, a.program, "--batch", str(a.batch), "--iters", str(a.iters),
                            "--phase", phase], env=env, capture_output=True, text=True)
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        if r.returncode != 0 or not line:
            print(f"torch.compile {phase} failed: {r.stderr[-600:]}")
            return
        rows[phase] = json.loads(line[0][7:])
    print(f"{'torch.compile reduce-overhead, warm (median)':58s} {rows['cold']['warm_ms']:12.3f}")
    print(f"{'torch.compile first call, empty inductor cache':58s} {rows['cold']['first_ms']:12.3f}")
    print(f"{'torch.compile first call, warm TORCHINDUCTOR_CACHE_DIR':58s} {rows['warm']['first_ms']:12.3f}")
    print(f"{'PyTorch file -> first output (export.load+compile+run)':58s} {rows['cold']['file_ms']:12.3f}")
    print(f"{'torch.compile r-o, peak memory over weights+inputs (MiB)':58s} {rows['cold']['peak_mib']:12.1f}")


if __name__ == "__main__":
    main()
