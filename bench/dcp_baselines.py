"""PyTorch's rows for safeckpt_dcp_bench (bench/dcp_bench.cpp), on the same DCP directory.

    python3 bench/dcp_baselines.py DIR [--runs R] [--out-dir D]

Prints ROW lines in the format `safeckpt bench --baselines` and safeckpt_dcp_bench read
(cli/probes.hpp run_baseline_command):
ROW<TAB>what<TAB>mode<TAB>seconds<TAB>GB/s<TAB>first_tensor_ms<TAB>rss_growth_MiB<TAB>device_overhead_MiB<TAB>note
(-1 = not measured). Median of R runs after one untimed warm-up, page cache warm:
  - consolidation: torch.distributed.checkpoint.format_utils.dcp_to_torch_save(DIR, tmp.pt),
    torch.load(tmp.pt, weights_only=True), safetensors.torch.save_file (the route PyTorch users
    take to a safetensors file; GB/s over the directory's bytes);
  - dcp.load (one process, no process group) into a state dict of CUDA tensors allocated from
    the directory's metadata (when CUDA is available; GB/s over the tensor bytes).
"""
import os
import statistics
import sys
import time


def median_time(fn, runs):
    fn()  # warm-up
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def row(what, mode, seconds, nbytes, note=""):
    gbps = nbytes / seconds / 1e9 if seconds > 0 else -1
    print("ROW\t%s\t%s\t%.6f\t%.3f\t-1\t-1\t-1\t%s" % (what, mode, seconds, gbps, note), flush=True)


def main(argv):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    d = argv[0]
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 3
    out_dir = argv[argv.index("--out-dir") + 1] if "--out-dir" in argv else os.path.dirname(os.path.abspath(d))
    dir_bytes = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    pt = os.path.join(out_dir, "dcp_baselines.pt")
    st = os.path.join(out_dir, "dcp_baselines.safetensors")

    def consolidate():
        from safetensors.torch import save_file
        dcp_to_torch_save(d, pt)
        sd = torch.load(pt, weights_only=True)
        save_file({k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}, st)
        os.remove(pt)
        os.remove(st)

    try:
        row("dcp_to_torch_save + safetensors save_file", "host", median_time(consolidate, runs), dir_bytes,
            "torch " + torch.__version__)
    except Exception as e:  # noqa: BLE001
        print("consolidation failed: %s: %s" % (type(e).__name__, e), file=sys.stderr)

    if torch.cuda.is_available():
        md = dcp.FileSystemReader(d).read_metadata()
        tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
        nbytes = sum(v.size.numel() * v.properties.dtype.itemsize for v in tensors.values())

        def load_cuda():
            target = {k: torch.empty(v.size, dtype=v.properties.dtype, device="cuda") for k, v in tensors.items()}
            dcp.load(target, checkpoint_id=d)
            torch.cuda.synchronize()

        try:
            row("dcp.load into CUDA tensors", "cuda", median_time(load_cuda, runs), nbytes,
                "1 process, no process group; flat FQN keys")
        except Exception as e:  # noqa: BLE001
            print("dcp.load failed: %s: %s" % (type(e).__name__, e), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
