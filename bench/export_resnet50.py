#!/usr/bin/env python3
"""Exports torchvision's ResNet-50 (random seeded weights, eval mode) as PT2 archives
(torch.export.save) for `safeckpt bench-engine` and the engine's GPU test, with PyTorch's inputs
and eager outputs. Run on the GPU machine with PyTorch 2.11 + torchvision:

  python3 bench/export_resnet50.py OUTDIR [--dtype float32|bfloat16|both] [--batch N]

Writes per dtype (not committed: ~100 MB each):
  OUTDIR/resnet50_<dtype>.train.pt2   torch.export.export (training IR: conv2d, batch_norm, max_pool2d,
                                      adaptive_avg_pool2d, relu_, add_, flatten, linear)
  OUTDIR/resnet50_<dtype>.core.pt2    ep.run_decompositions() (core IR: convolution,
                                      _native_batch_norm_legit_no_training, max_pool2d_with_indices, mean.dim, ...)
  OUTDIR/resnet50_<dtype>.io.safetensors  input.x [2, 3, 224, 224] (<dtype>), output.0.cuda (CUDA eager,
                                      TF32 off for matmul and cuDNN, as float32), output.0.cpu (CPU eager, float32)
  OUTDIR/resnet50_<dtype>.json        tolerance for the engine test (atol/rtol: pass if
                                      max|out-ref| <= atol + rtol*max|ref|), observed CUDA-vs-CPU difference
Batch: dynamic 1..64 by default (one archive serves --batch 1 and 32), or static N with --batch N.
Weights: torchvision's init (seed 0), then the BatchNorm running statistics calibrated on 4 random
batches in train mode (cumulative average, momentum=None) so activations stay normalized through 50
layers as in a trained network (the default mean 0 / var 1 would leave batch_norm a near-identity).

Then (see HACKING.md, GPU machine):
  SAFECKPT_RESNET50_DIR=OUTDIR build/tests/safeckpt_engine_tests -tc='*ResNet-50*'
  safeckpt bench-engine OUTDIR/resnet50_float32.train.pt2 --batch 32 \\
      --baselines "python3 bench/engine_baselines.py OUTDIR/resnet50_float32.train.pt2 --batch 32"
"""
import argparse, json, os, time
import torch
import torchvision


def build(dtype):
    torch.manual_seed(0)
    m = torchvision.models.resnet50(weights=None)
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None  # cumulative moving average over the calibration batches
            mod.reset_running_stats()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m.to(dev).train()
    with torch.no_grad():
        for _ in range(4):
            m(torch.randn(16, 3, 224, 224, generator=g).to(dev))
    m.eval()
    return m.cpu().to(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--dtype", default="both", choices=["float32", "bfloat16", "both"])
    ap.add_argument("--batch", type=int, default=0, help="static batch (default: dynamic 1..64)")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    from safetensors.torch import save_file
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name in (["float32", "bfloat16"] if a.dtype == "both" else [a.dtype]):
        dtype = getattr(torch, name)
        m = build(dtype)
        b = a.batch or 2
        x = (torch.rand(b, 3, 224, 224, generator=torch.Generator().manual_seed(2)) * 2 - 1).to(dtype)
        dyn = None if a.batch else ({0: torch.export.Dim("batch", min=1, max=64)},)
        t0 = time.time()
        ep = torch.export.export(m, (x,), dynamic_shapes=dyn)
        base = os.path.join(a.outdir, f"resnet50_{name}")
        torch.export.save(ep, base + ".train.pt2")
        core = ep.run_decompositions()
        torch.export.save(core, base + ".core.pt2")
        print(f"exported {base}.train.pt2 / .core.pt2 in {time.time() - t0:.1f} s "
              f"({os.path.getsize(base + '.train.pt2') / 2**20:.0f} MiB)")
        with torch.no_grad():
            cpu = m(x).float()
            cuda = m.cuda()(x.cuda()).float().cpu()
        diff = (cuda - cpu).abs().max().item()
        ref = cuda.abs().max().item()
        # The engine is compared with PyTorch's CUDA output: allow 4x what PyTorch's own CUDA and CPU
        # kernels differ by (as a fraction of max|ref|), at least the corpus's 1e-4 (float32) or 1e-2.
        floor = 1e-4 if name == "float32" else 1e-2
        rel = max(floor, 4 * diff / max(ref, 1e-30))
        save_file({"input.x": x.contiguous(), "output.0.cuda": cuda.contiguous(), "output.0.cpu": cpu.contiguous()},
                  base + ".io.safetensors")
        meta = {"model": "torchvision resnet50", "dtype": name, "batch": b, "dynamic_batch": not a.batch,
                "torch": torch.__version__, "torchvision": torchvision.__version__,
                "eager_cuda_vs_cpu_maxdiff": diff, "max_abs_ref": ref,
                "tolerance": {"atol": 0.0, "rtol": rel,
                              "note": "pass if max|out-ref| <= atol + rtol*max|ref|; ref = CUDA eager, TF32 off"}}
        with open(base + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        print(f"{name}: max|cuda-cpu| {diff:.3g} of max|ref| {ref:.3g}; engine tolerance rtol {rel:.3g}")


if __name__ == "__main__":
    main()
