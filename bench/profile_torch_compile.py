#!/usr/bin/env python3
"""Where torch.compile(mode="reduce-overhead") spends a warm call of a PT2 program, kernel by
kernel (issue 14: the rows `safeckpt bench-engine --profile` is compared with).

usage: profile_torch_compile.py PROGRAM.pt2 [--batch N] [--iters N] [--top N]

Same module, inputs and TF32 settings as bench/engine_baselines.py (its helpers are imported).
Runs torch.profiler over N warm calls and prints, per CUDA kernel name, the total device time per
call (us) and launches per call, then the same grouped into kinds by kernel name (gemm, attention,
generated = Triton, other). Device time only: the CUDA graph replay's gaps are not in it.
"""
import argparse, os, sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_baselines import cuda_module, make_inputs  # noqa: E402


def kind(name):
    n = name.lower()
    if any(k in n for k in ("fmha", "flash", "attention", "attn")):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "sgemm", "cublas", "s16816", "s1688", "nvjet")):
        return "gemm"
    if n.startswith("triton") or "triton_" in n:
        return "generated (Triton)"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    import torch
    from torch.profiler import profile, ProfilerActivity

    ep = torch.export.load(a.program)
    m = cuda_module(ep, torch)
    x = make_inputs(ep, a.batch, torch)
    cm = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(5):
            cm(*x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.iters):
                cm(*x)
            torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            if "memcpy" in e.name.lower() or "memset" in e.name.lower():
                continue
            per[e.name][0] += e.device_time_total
            per[e.name][1] += 1
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    total = sum(v[0] for v in per.values()) / a.iters
    print(f"torch.compile reduce-overhead, {os.path.basename(a.program)} batch {a.batch or 'example'}: "
          f"{total:.1f} us of kernels per call, {sum(v[1] for v in per.values()) / a.iters:.0f} launches")
    print(f"{'us/call':>9s} {'n/call':>7s}  kernel")
    for name, (us, n) in rows[: a.top]:
        print(f"{us / a.iters:9.1f} {n / a.iters:7.1f}  {name[:110]}")
    kinds = defaultdict(lambda: [0.0, 0])
    for name, (us, n) in per.items():
        kinds[kind(name)][0] += us
        kinds[kind(name)][1] += n
    print("by kind:")
    for k, (us, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"{us / a.iters:9.1f} {n / a.iters:7.1f}  {k}")


if __name__ == "__main__":
    main()
