#!/usr/bin/env python3
"""Makes tests/data/pt2-2.11-extra/misaligned_linear.*: one bfloat16 nn.Linear whose N (1025) is not a
multiple of 8, large enough (M*N*K = 1024*1025*128 >= 2^27 multiply-adds) that the engine's planner
splits it (src/engine/plan_gemm.cpp lower_gemm): the GEMM shape of GPT-2's lm_head (N = 50257) at a size a
test can carry. Run on the GPU machine (PyTorch 2.11 with CUDA):

    python3 tests/gen/gen_misaligned_linear.py OUTDIR

Writes misaligned_linear.train.pt2 (torch.export.export, training IR, exported on CPU), .io.safetensors
(input.x; output.0.cpu = eager on CPU, output.0.cuda = eager on CUDA with TF32 off) and .json (versions,
shapes, the CUDA-vs-CPU difference, the tolerance the tests use).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

M, K, N = 1024, 128, 1025


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    m = torch.nn.Sequential(torch.nn.Linear(K, N)).eval().to(torch.bfloat16)
    x = torch.randn(M, K).to(torch.bfloat16)
    ep = torch.export.export(m, (x,))
    path = os.path.join(out, "misaligned_linear.train.pt2")
    torch.export.save(ep, path)
    with torch.no_grad():
        cpu = m(x)
        cuda = m.to("cuda")(x.cuda()).cpu()
    save_file({"input.x": x.contiguous(), "output.0.cpu": cpu.contiguous(), "output.0.cuda": cuda.contiguous()},
              os.path.join(out, "misaligned_linear.io.safetensors"))
    diff = (cuda.float() - cpu.float()).abs().max().item()
    ref = cuda.float().abs().max().item()
    meta = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
        "shapes": {"x": [M, K], "weight": [N, K], "bias": [N], "out": [M, N]},
        "eager_cuda_vs_cpu": {"max_abs": diff, "ref_abs_max": ref},
        # bfloat16 outputs: one rounding of a float32 sum either way (the same rule as the other
        # bfloat16 programs here: 0.05 + 0.02 x max|ref|).
        "tolerance": {"atol": 0.05, "rtol": 0.02},
    }
    with open(os.path.join(out, "misaligned_linear.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
