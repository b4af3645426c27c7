#!/usr/bin/env python3
"""Baselines for `safeckpt bench` and safeckpt_gpu_bench: PyTorch and safetensors loading the same
checkpoint into GPU memory, measured in the same run (issue 5).

  make DIR [--tensors 96] [--mib 64]
      Writes DIR/model.pt (torch.save of a state_dict of random bf16 tensors),
      DIR/model.safetensors (the same tensors) and DIR/model.pt.ranges: one
      line "offset nbytes crc32" per storage record of model.pt, read from its
      zip central directory, so safeckpt_gpu_bench --file DIR/model.pt
      --ranges DIR/model.pt.ranges moves exactly the bytes torch.load reads.
  files FILE... [--repeat 2] [--no-cold]
      The same rows for the given files (one PyTorch checkpoint and/or one
      .safetensors file): the companion of `safeckpt bench --baselines`, which
      appends the files it benchmarks to the command.
  run DIR [--repeat 2] [--no-cold]
      Times, on DIR/model.pt and DIR/model.safetensors:
        torch.load(weights_only=True, map_location="cuda")
        torch.load(weights_only=True, mmap=True), then .cuda() per tensor
        safetensors.torch.load_file(device="cuda")
      warm (file read once before) and cold (page cache dropped through
      /proc/sys/vm/drop_caches, else posix_fadvise DONTNEED), and prints one
      tab-separated "ROW" line per measurement for gpu_bench's table:
        ROW what mode seconds GB/s first_tensor_ms rss_growth_MiB device_overhead_MiB note
      GB/s counts tensor bytes (1e9). These loaders hand back every tensor at
      once, so time to first tensor = total time. Peak RSS growth = VmHWM
      after minus VmRSS before (peak reset via /proc/self/clear_refs).
"""
import argparse
import gc
import os
import struct
import sys
import time
import zipfile

MiB = 1 << 20


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return status_kib("VmRSS:")


def drop_page_cache(paths):
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return "drop_caches"
    except OSError:
        pass
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def warm_page_cache(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(64 * MiB):
            pass


def storage_ranges(pt_path):
    """(offset, nbytes, crc32) of each stored data record of a torch.save zip."""
    out = []
    with zipfile.ZipFile(pt_path) as z, open(pt_path, "rb") as raw:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) < 3 or parts[-2] != "data" or not parts[-1].isdigit():
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise SystemExit(f"{info.filename} is compressed; the bench needs stored records")
            raw.seek(info.header_offset)
            hdr = raw.read(30)
            if hdr[:4] != b"PK\x03\x04":
                raise SystemExit(f"bad local header for {info.filename}")
            name_len, extra_len = struct.unpack("<HH", hdr[26:30])
            out.append((info.header_offset + 30 + name_len + extra_len, info.file_size, info.CRC))
    out.sort()
    return out


def cmd_make(args):
    import torch
    from safetensors.torch import save_file

    os.makedirs(args.dir, exist_ok=True)
    numel = args.mib * MiB // 2
    cols = 8192 if numel % 8192 == 0 else 1
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    sd = {}
    for i in range(args.tensors):
        g = torch.Generator(device=dev).manual_seed(i)
        sd[f"layers.{i}.weight"] = torch.randn(numel // cols, cols, dtype=torch.bfloat16, device=dev, generator=g).cpu()
    t1 = time.perf_counter()
    pt = os.path.join(args.dir, "model.pt")
    torch.save(sd, pt)
    t2 = time.perf_counter()
    save_file(sd, os.path.join(args.dir, "model.safetensors"))
    t3 = time.perf_counter()
    ranges = storage_ranges(pt)
    with open(pt + ".ranges", "w") as f:
        f.write(f"# {pt}: {len(ranges)} storage records (offset nbytes crc32), torch {torch.__version__}\n")
        for off, n, crc in ranges:
            f.write(f"{off} {n} {crc:08x}\n")
    os.sync()
    print(f"make: {args.tensors} x {args.mib} MiB bf16; generate {t1 - t0:.1f} s, torch.save {t2 - t1:.1f} s, "
          f"safetensors save {t3 - t2:.1f} s, sync {time.perf_counter() - t3:.1f} s", flush=True)


def cmd_run(args):
    run_baselines(os.path.join(args.dir, "model.pt"), os.path.join(args.dir, "model.safetensors"), args)


def cmd_files(args):
    pts = [f for f in args.files if not f.endswith(".safetensors")]
    sts = [f for f in args.files if f.endswith(".safetensors")]
    if len(pts) > 1 or len(sts) > 1:
        raise SystemExit("files: at most one PyTorch file and one .safetensors file")
    run_baselines(pts[0] if pts else None, sts[0] if sts else None, args)


def run_baselines(pt, st, args):
    """Rows for the PyTorch loaders on `pt` and safetensors on `st` (either may be None)."""
    import torch
    import safetensors
    from safetensors.torch import load_file

    torch.zeros(1, device="cuda")  # CUDA context outside every row
    torch.cuda.synchronize()
    print(f"baselines: torch {torch.__version__}, safetensors {safetensors.__version__}, "
          f"device {torch.cuda.get_device_name()}", flush=True)

    def tensor_bytes(obj):
        return sum(t.numel() * t.element_size() for t in obj.values())

    def measure(what, mode, fn, note):
        gc.collect()
        torch.cuda.empty_cache()
        rss0 = reset_peak_rss()
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        nbytes = tensor_bytes(out)
        free1 = torch.cuda.mem_get_info()[0]
        rss = (status_kib("VmHWM:") - rss0) / 1024
        dev_over = (free0 - free1 - nbytes) / MiB
        del out
        gc.collect()
        torch.cuda.empty_cache()
        print(f"ROW\t{what}\t{mode}\t{dt:.3f}\t{nbytes / dt / 1e9:.2f}\t{dt * 1e3:.1f}\t{rss:.0f}\t{dev_over:.0f}\t{note}",
              flush=True)

    def torch_cuda():
        return torch.load(pt, weights_only=True, map_location="cuda")

    def torch_mmap():
        sd = torch.load(pt, weights_only=True, mmap=True)
        return {k: v.cuda() for k, v in sd.items()}

    def st_cuda():
        return load_file(st, device="cuda")

    loaders = []
    if pt:
        loaders += [("torch.load(map_location=cuda)", "warm", torch_cuda, pt, 1),
                    ("torch.load(mmap=True)+.cuda()", "warm", torch_mmap, pt, args.repeat)]
    if st:
        loaders += [("safetensors load_file(cuda)", "warm", st_cuda, st, args.repeat)]
    for what, mode, fn, path, n in loaders:
        warm_page_cache(path)
        for _ in range(n):
            measure(what, mode, fn, f"{os.path.basename(path)}; all tensors at once")
    if not args.no_cold:
        cold = []
        if pt:
            cold.append(("torch.load(map_location=cuda)", torch_cuda, pt))
        if st:
            cold.append(("safetensors load_file(cuda)", st_cuda, st))
        for what, fn, path in cold:
            how = drop_page_cache([p for p in (pt, st) if p])
            measure(what, "cold", fn, f"{os.path.basename(path)}; cache dropped via {how}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--tensors", type=int, default=96)
    m.add_argument("--mib", type=int, default=64)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--repeat", type=int, default=2)
    r.add_argument("--no-cold", action="store_true")
    f = sub.add_parser("files")
    f.add_argument("files", nargs="+")
    f.add_argument("--repeat", type=int, default=2)
    f.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    {"make": cmd_make, "run": cmd_run, "files": cmd_files}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
