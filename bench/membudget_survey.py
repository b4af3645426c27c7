#!/usr/bin/python3
"""Survey for Limits::max_pickle_record_bytes / max_memory_bytes (helper membudget).

Writes big but realistic checkpoints with Debian's PyTorch 1.13 (/usr/bin/python3)
and prints the size of each archive's data.pkl, its opcode count and memo puts.
Usage: /usr/bin/python3 bench/membudget_survey.py OUTDIR
"""
import io, pickletools, sys, zipfile
import torch

out = sys.argv[1]


def report(path):
    with zipfile.ZipFile(path) as z:
        name = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        data = z.read(name)
    ops = puts = 0
    for op, _, _ in pickletools.genops(io.BytesIO(data)):
        ops += 1
        if "PUT" in op.name or op.name == "MEMOIZE":
            puts += 1
    print(f"{path}: data.pkl {len(data)} bytes, {ops} opcodes, {puts} memo puts", flush=True)


# 1. A 100,000-tensor state_dict (long dotted names like a deep transformer).
sd = {f"model.layers.{i // 10}.block.sublayer_{i % 10}.weight": torch.zeros(1) for i in range(100_000)}
torch.save(sd, f"{out}/sd_100k.pt")
report(f"{out}/sd_100k.pt")

# 2. Adam optimizer state for 50,000 parameters (state + param_groups), with the model.
params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(50_000)]
opt = torch.optim.Adam(params)
for p in params:
    p.grad = torch.zeros(1)
opt.step()
torch.save({"model": {f"p.{i}": p for i, p in enumerate(params)}, "optimizer": opt.state_dict(), "epoch": 3},
           f"{out}/adam_50k.pt")
report(f"{out}/adam_50k.pt")
