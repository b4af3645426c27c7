#!/usr/bin/env python3
"""safeckpt.load vs torch.load(weights_only=True) vs safetensors.torch.load_file
on one multi-GB checkpoint, host or GPU, in one table (issue 16).

  make DIR [--gib 4] [--tensors 64]
      DIR/model.pt: torch.save of a state_dict of random bf16 tensors;
      DIR/model.safetensors: the same tensors (safetensors.torch.save_file
      when importable, else `safeckpt convert` from $SAFECKPT_CLI).
  run DIR [--device cpu|cuda] [--repeat 3]
      Warm runs (each file read once before): the best of --repeat. Rows:
        safeckpt.load              (zero-copy, copy-on-write map; cuda: GPU loader + DLPack)
        safeckpt.load mmap=False   (every storage copied into owned memory; cpu only)
        torch.load weights_only    (cuda: map_location="cuda")
        torch.load weights_only mmap=True  (cpu only)
        safetensors load_file      (device=cpu|cuda; when the package imports)
        safeckpt.load .safetensors
      Columns: seconds to return, GB/s (tensor bytes / 1e9 / seconds), and on
      cpu the seconds to then touch one byte per 4 KiB page of every tensor
      (a lazy mapping pays its page faults there; loaders that copied already
      paid them). cuda times end with torch.cuda.synchronize().
Run with PYTHONPATH=<build>/python (the package in the build tree).
"""
import argparse
import gc
import os
import subprocess
import sys
import time


def make(d, gib, tensors):
    import torch
    os.makedirs(d, exist_ok=True)
    per = int(gib * (1 << 30)) // tensors // 2  # bf16 elements per tensor
    rows = 4096
    g = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.weight": torch.randn(rows, per // rows, generator=g).to(torch.bfloat16) for i in range(tensors)}
    torch.save(sd, os.path.join(d, "model.pt"))
    st = os.path.join(d, "model.safetensors")
    try:
        from safetensors.torch import save_file
        save_file(sd, st)
    except ImportError:
        subprocess.run([os.environ.get("SAFECKPT_CLI", "safeckpt"), "convert", "--force",
                        os.path.join(d, "model.pt"), st], check=True)
    print(f"wrote {d}/model.pt and model.safetensors: {tensors} tensors, "
          f"{sum(t.numel() * 2 for t in sd.values()) / 1e9:.2f} GB")


def tensors_of(obj):
    return list(obj.values())


def touch(ts):
    import torch
    s = 0
    for t in ts:
        flat = t.reshape(-1).view(torch.uint8)
        s += int(flat[::4096].sum())
    return s


def run(d, device, repeat):
    import torch
    import safeckpt
    pt = os.path.join(d, "model.pt")
    st = os.path.join(d, "model.safetensors")
    for f in (pt, st):  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    nbytes = sum(t.numel() * t.element_size() for t in safeckpt.load(pt).values())
    rows = []
    cuda = device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    cases = []
    if cuda:
        cases.append(("safeckpt.load map_location=cuda", lambda: safeckpt.load(pt, map_location=device)))
        cases.append(("torch.load weights_only map_location=cuda",
                      lambda: torch.load(pt, weights_only=True, map_location=device)))
    else:
        cases.append(("safeckpt.load (zero-copy)", lambda: safeckpt.load(pt)))
        cases.append(("safeckpt.load mmap=False", lambda: safeckpt.load(pt, mmap=False)))
        cases.append(("torch.load weights_only", lambda: torch.load(pt, weights_only=True)))
        import inspect
        if "mmap" in inspect.signature(torch.load).parameters:
            cases.append(("torch.load weights_only mmap=True",
                          lambda: torch.load(pt, weights_only=True, mmap=True)))
        else:
            rows.append(("torch.load weights_only mmap=True", None, None, None, "no mmap= in this torch"))
    try:
        from safetensors.torch import load_file
        cases.append(("safetensors.torch.load_file", lambda: load_file(st, device=device)))
    except ImportError:
        rows.append(("safetensors.torch.load_file", None, None, None, "package not installed here"))
    if not cuda:
        cases.append(("safeckpt.load .safetensors", lambda: safeckpt.load(st)))
    if cuda:
        torch.zeros(1, device=device)  # CUDA context before timing
    for name, fn in cases:
        best, best_touch = None, None
        for _ in range(repeat):
            gc.collect()
            t0 = time.perf_counter()
            obj = fn()
            sync()
            t1 = time.perf_counter()
            tt = None
            if not cuda:
                touch(tensors_of(obj))
                tt = time.perf_counter() - t1
            del obj
            gc.collect()
            if best is None or t1 - t0 < best:
                best, best_touch = t1 - t0, tt
        rows.append((name, best, nbytes / 1e9 / best, best_touch, ""))
    print(f"file {pt}: {nbytes / 1e9:.2f} GB of tensors; device {device}; best of {repeat} warm runs; "
          f"torch {torch.__version__}; python {sys.version.split()[0]}")
    print(f"| loader | s | GB/s | touch s | note |\n|---|---|---|---|---|")
    for name, s, gbs, tt, note in rows:
        fmt = lambda v, p: "" if v is None else f"{v:.{p}f}"
        print(f"| {name} | {fmt(s, 3)} | {fmt(gbs, 2)} | {fmt(tt, 3)} | {note} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--gib", type=float, default=4)
    m.add_argument("--tensors", type=int, default=64)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--device", default="cpu")
    r.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.dir, a.gib, a.tensors)
    else:
        run(a.dir, a.device, a.repeat)


if __name__ == "__main__":
    main()
