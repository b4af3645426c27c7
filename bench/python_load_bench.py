#!/usr/bin/env python3
"""safeckpt.load vs torch.load(weights_only=True) vs safetensors.torch.load_file
on one multi-GB checkpoint, host or GPU, in one table (issue 16).

  make DIR [--gib 4] [--tensors 64]
      DIR/model.pt: torch.save of a state_dict of random bf16 tensors;
      DIR/model.safetensors: the same tensors (safetensors.torch.save_file
      when importable, else `safeckpt convert` from $SAFECKPT_CLI).
  run DIR [--device cpu|cuda] [--repeat 3]
      Warm runs (each file read once before): the best of --repeat. Rows:
        safeckpt.load mmap=True    (zero-copy, copy-on-write map; cpu only)
        safeckpt.load              (default, as torch.load: every storage copied into
                                    owned memory; cuda: GPU loader + DLPack)
        torch.load weights_only    (cuda: map_location="cuda")
        torch.load weights_only mmap=True  (cpu only)
        safetensors load_file      (device=cpu|cuda; when the package imports)
        safeckpt.load .safetensors
      Columns: seconds to return, GB/s (tensor bytes / 1e9 / seconds), and on
      cpu the seconds to then touch one byte per 4 KiB page of every tensor
      (a lazy mapping pays its page faults there; loaders that copied already
      paid them). cuda times end with torch.cuda.synchronize().
  rows FILE... [--device cuda[:N]] [--repeat 3] [--no-cold] [--no-torch]
      The companion of `safeckpt bench --baselines` (which appends the files it
      benchmarks and --no-cold): prints one tab-separated line per measurement,
        ROW what mode seconds GB/s first_tensor_ms rss_growth_MiB device_overhead_MiB note
      (cli/probes.hpp reads them; note = "FILE; ..."), so the table of
      `safeckpt bench` shows the Python package next to the C++ loader:
        safeckpt.load(map_location=cuda) [python]   warm (best of --repeat) and cold
        safeckpt.load(cpu, mmap=True) [python]      zero-copy; the note has the touch time
        safeckpt.load(cpu) [python]                 every storage copied (the default)
        torch.load(cpu) / torch.load(mmap=True, cpu) / safetensors load_file(cpu)
      then, unless --no-torch, bench/torch_baselines.py's CUDA rows for the same
      files (torch.load(map_location=cuda), torch.load(mmap=True)+.cuda(),
      safetensors load_file(cuda)). One PyTorch file and/or one .safetensors file.
      Example (GPU machine):
        safeckpt bench --baselines "python3 bench/python_load_bench.py rows"
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
        cases.append(("safeckpt.load mmap=True (zero-copy)", lambda: safeckpt.load(pt, mmap=True)))
        cases.append(("safeckpt.load (copies, the default)", lambda: safeckpt.load(pt)))
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
        cases.append(("safeckpt.load .safetensors mmap=True", lambda: safeckpt.load(st, mmap=True)))
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


def rows(files, device, repeat, no_cold, no_torch):
    import inspect

    import torch
    import safeckpt
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_baselines as tb

    pts = [f for f in files if not f.endswith(".safetensors")]
    sts = [f for f in files if f.endswith(".safetensors")]
    if len(pts) > 1 or len(sts) > 1:
        raise SystemExit("rows: at most one PyTorch file and one .safetensors file")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.zeros(1, device=device)  # CUDA context outside every row
        torch.cuda.synchronize()
    print(f"python rows: safeckpt {safeckpt.__version__} (HAS_CUDA={safeckpt.HAS_CUDA}), torch {torch.__version__}, "
          f"python {sys.version.split()[0]}, device {torch.cuda.get_device_name() if cuda else 'none'}", flush=True)

    def measure(fn, on_device):
        """(seconds, tensor bytes, peak RSS growth MiB, device overhead MiB or -1, touch seconds or None)."""
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            free0 = torch.cuda.mem_get_info()[0]
        rss0 = tb.reset_peak_rss()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rss = (tb.status_kib("VmHWM:") - rss0) / 1024
        nbytes = sum(t.numel() * t.element_size() for t in out.values())
        dev_over = (free0 - torch.cuda.mem_get_info()[0] - nbytes) / tb.MiB if on_device else -1
        touched = None
        if not on_device:
            t1 = time.perf_counter()
            touch(out.values())
            touched = time.perf_counter() - t1
        del out
        gc.collect()
        return dt, nbytes, rss, dev_over, touched

    def row(what, mode, m, path, note):
        dt, nbytes, rss, dev_over, touched = m
        if touched is not None:
            note += f"; then touching one byte per 4 KiB page {touched:.3f} s"
        print(f"ROW\t{what}\t{mode}\t{dt:.3f}\t{nbytes / dt / 1e9:.2f}\t{dt * 1e3:.1f}\t{rss:.0f}\t{dev_over:.0f}\t"
              f"{os.path.basename(path)}; {note}", flush=True)

    try:
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    has_mmap = "mmap" in inspect.signature(torch.load).parameters
    for path in pts + sts:
        is_st = path.endswith(".safetensors")
        cases = []
        if cuda:
            cases.append(("safeckpt.load(map_location=cuda) [python]", True,
                          lambda: safeckpt.load(path, map_location=device),
                          "C++ GPU loader, storages handed to torch through DLPack", True))
        cases.append(("safeckpt.load(cpu, mmap=True) [python]", False, lambda: safeckpt.load(path, mmap=True),
                      "zero-copy views of a copy-on-write map" + ("" if is_st else "; CRC-32 of every record checked"),
                      False))
        if not is_st:
            cases.append(("safeckpt.load(cpu) [python]", False, lambda: safeckpt.load(path),
                          "the default: every storage copied into owned memory", False))
            cases.append(("torch.load(cpu)", False, lambda: torch.load(path, weights_only=True),
                          "weights_only=True", False))
            if has_mmap:
                cases.append(("torch.load(mmap=True, cpu)", False,
                              lambda: torch.load(path, weights_only=True, mmap=True), "weights_only=True", False))
        elif load_file is not None:
            cases.append(("safetensors load_file(cpu)", False, lambda: load_file(path), "", False))
        for what, cold_too, fn, note, on_device in cases:
            tb.warm_page_cache(path)
            runs = [measure(fn, on_device) for _ in range(repeat)]
            row(what, "warm", min(runs, key=lambda m: m[0]), path, f"{note}; best of {repeat}")
            if cold_too and not no_cold:
                how = tb.drop_page_cache([path])
                row(what, "cold", measure(fn, on_device), path, f"{note}; cache dropped via {how}")
    if cuda and not no_torch:
        args = argparse.Namespace(repeat=repeat, no_cold=no_cold)
        tb.run_baselines(pts[0] if pts else None, sts[0] if sts else None, args)


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
    w = sub.add_parser("rows")
    w.add_argument("files", nargs="+")
    w.add_argument("--device", default="cuda")
    w.add_argument("--repeat", type=int, default=3)
    w.add_argument("--no-cold", action="store_true")
    w.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.dir, a.gib, a.tensors)
    elif a.cmd == "rows":
        rows(a.files, a.device, a.repeat, a.no_cold, a.no_torch)
    else:
        run(a.dir, a.device, a.repeat)


if __name__ == "__main__":
    main()
