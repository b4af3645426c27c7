#!/usr/bin/env python3
"""Generate real torch.distributed.checkpoint (DCP) directories with PyTorch 2.11.

Run on a machine with PyTorch >= 2.6 (CPU ranks over gloo; no GPU needed):

    python3 gen_dcp.py OUTDIR            # every case, each in its own subprocess
    python3 gen_dcp.py OUTDIR --case NAME

Per case OUTDIR/NAME/ holds:
  dcp/                 what dcp.save wrote (.metadata + __<rank>_0.distcp)
  full.safetensors     every tensor of the flattened state dict as PyTorch gathers it
                       (DTensor.full_tensor(); plain tensors as they are), key = DCP's FQN
  expected.json        per FQN: kind (dtensor/tensor/bytes), global shape, dtype, mesh shape,
                       placements, and for non-tensor items repr() and a JSON value
  consolidated.pt      torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dcp, ...)
  metadata_repr.txt    repr() of the unpickled .metadata (weights_only=False, on the generator)
  ranks/rank<r>.pt     (dtensor cases) torch.save of this rank's state dict holding DTensors
  weights_only.json    what torch.load(weights_only=True) does with ranks/rank0.pt, in a fresh
                       interpreter, before and after importing torch.distributed.tensor
Also OUTDIR/versions.json and OUTDIR/torchsrc/ (the PyTorch source files the reader follows).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import traceback

CASES = {
    # name: world size
    "placements-ws2": 2,
    "placements-ws3": 3,
    "placements-ws4": 4,
    "uneven-ws4": 4,
    "mesh2d-ws4": 4,
    "fsdp2-adamw-ws2": 2,
    # Only run when FSDP2 refuses CPU (see driver): one GPU, world size 1, NCCL.
    "fsdp2-adamw-cuda-ws1": 1,
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def jsonable(v):
    import torch
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, torch.Tensor):
        return {"tensor": list(v.shape), "dtype": str(v.dtype)}
    return {"repr": repr(v)}


def build_placements(ws, mesh):
    import torch
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    g = torch.Generator().manual_seed(1234 + ws)
    a = torch.randn(12, 5, generator=g)
    b = torch.randn(4, 12, generator=g).to(torch.bfloat16)
    c = torch.randn(3, 3, generator=g)
    d = torch.arange(9, dtype=torch.int64) * 3 - 7
    e = torch.randn(6, 4, generator=g).to(torch.float16)
    plain = torch.linspace(-1.0, 1.0, 5)
    return {
        "model": {
            "a": distribute_tensor(a, mesh, [Shard(0)]),
            "b": distribute_tensor(b, mesh, [Shard(1)]),
            "c": distribute_tensor(c, mesh, [Replicate()]),
            "layers": [distribute_tensor(d, mesh, [Shard(0)]), distribute_tensor(e, mesh, [Shard(1)])],
        },
        "plain": plain,
        "step": 7,
        "config": {"name": "toy", "lr": 0.5, "betas": (0.9, 0.99), "flags": [True, False, None]},
        "blob": b"\x00\x01binary",
    }


def build_uneven(ws, mesh):
    import torch
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    g = torch.Generator().manual_seed(99)
    return {
        "rows10": distribute_tensor(torch.randn(10, 7, generator=g), mesh, [Shard(0)]),   # 3,3,3,1
        "cols5": distribute_tensor(torch.randn(3, 5, generator=g), mesh, [Shard(1)]),     # torch.chunk: 2,2,1,0
        "two": distribute_tensor(torch.tensor([1.5, -2.5]), mesh, [Shard(0)]),            # 1,1,0,0
        "scalar_rep": distribute_tensor(torch.tensor(3.25), mesh, [Replicate()]),
        "empty": distribute_tensor(torch.zeros(0, 4), mesh, [Shard(0)]),
        "big_cols": distribute_tensor(torch.randn(3, 17, generator=g).double(), mesh, [Shard(1)]),
    }


def build_mesh2d(ws, _mesh):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    g = torch.Generator().manual_seed(7)
    return {
        "s0s1": distribute_tensor(torch.randn(8, 6, generator=g), mesh, [Shard(0), Shard(1)]),
        "s0r": distribute_tensor(torch.randn(6, 5, generator=g), mesh, [Shard(0), Replicate()]),
        "rs1": distribute_tensor(torch.randn(4, 10, generator=g), mesh, [Replicate(), Shard(1)]),
        "s0s0": distribute_tensor(torch.randn(9, 3, generator=g), mesh, [Shard(0), Shard(0)]),
    }


def build_fsdp2(ws, mesh, device="cpu"):
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_state_dict
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5, bias=False), nn.LayerNorm(5)).to(device)
    for m in model:
        if isinstance(m, (nn.Linear, nn.LayerNorm)):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    torch.manual_seed(1)
    for _ in range(2):
        x = torch.randn(4, 8).to(device)
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}, model


def run_case(name, out, rank, ws, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    torch.set_num_threads(1)
    device = "cuda" if "cuda" in name else "cpu"
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=ws)
    mesh = init_device_mesh(device, (ws,))
    case_dir = os.path.join(out, name)
    model = None
    if name.startswith("placements"):
        sd = build_placements(ws, mesh)
    elif name.startswith("uneven"):
        sd = build_uneven(ws, mesh)
    elif name.startswith("mesh2d"):
        sd = build_mesh2d(ws, mesh)
    elif name.startswith("fsdp2"):
        sd, model = build_fsdp2(ws, mesh, device)
    else:
        raise SystemExit("unknown case " + name)
    dcp.save(sd, checkpoint_id=os.path.join(case_dir, "dcp"))

    # Per-rank torch.save files holding DTensors.
    os.makedirs(os.path.join(case_dir, "ranks"), exist_ok=True)
    if model is not None:
        torch.save(model.state_dict(), os.path.join(case_dir, "ranks", "rank%d.pt" % rank))
    else:
        flat_local = sd["model"] if "model" in sd else sd
        torch.save(flat_local, os.path.join(case_dir, "ranks", "rank%d.pt" % rank))

    # Reference values: DCP's own flattening, then full_tensor() (a collective: every rank).
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    flat, mapping = flatten_state_dict(sd)
    full = {}
    expected = {}
    for fqn in sorted(flat):
        v = flat[fqn]
        if isinstance(v, DTensor):
            t = v.full_tensor()
            full[fqn] = t.detach().cpu().clone().contiguous()
            expected[fqn] = {"kind": "dtensor", "shape": list(v.shape), "dtype": str(v.dtype),
                             "mesh": list(v.device_mesh.shape), "placements": [repr(p) for p in v.placements],
                             "local_shape": list(v.to_local().shape)}
        elif isinstance(v, torch.Tensor):
            full[fqn] = v.detach().cpu().clone().contiguous()
            expected[fqn] = {"kind": "tensor", "shape": list(v.shape), "dtype": str(v.dtype)}
        else:
            expected[fqn] = {"kind": "bytes", "repr": repr(v), "value": jsonable(v), "type": type(v).__name__}
    # Local shapes per rank of the per-rank files.
    local = {}
    src = model.state_dict() if model is not None else (sd["model"] if "model" in sd else sd)
    for k, v in (src.items() if isinstance(src, dict) else []):
        if isinstance(v, DTensor):
            local[k] = {"local_shape": list(v.to_local().shape), "shape": list(v.shape),
                        "placements": [repr(p) for p in v.placements], "mesh": v.device_mesh.mesh.tolist()}
    with open(os.path.join(case_dir, "ranks", "rank%d.local.json" % rank), "w") as f:
        json.dump(local, f, indent=1, sort_keys=True)
    dist.barrier()
    if rank == 0:
        from safetensors.torch import save_file
        save_file(full, os.path.join(case_dir, "full.safetensors"))
        with open(os.path.join(case_dir, "expected.json"), "w") as f:
            json.dump({"world_size": ws, "items": expected, "mapping": {k: list(map(str, p)) for k, p in mapping.items()}},
                      f, indent=1, sort_keys=True)
        import pickle
        with open(os.path.join(case_dir, "dcp", ".metadata"), "rb") as f:
            md = pickle.load(f)
        with open(os.path.join(case_dir, "metadata_repr.txt"), "w") as f:
            f.write(repr(md) + "\n")
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save(os.path.join(case_dir, "dcp"), os.path.join(case_dir, "consolidated.pt"))
    dist.barrier()
    dist.destroy_process_group()


WO_PROBE = r"""
import json, sys, torch
path = sys.argv[1]
res = {}
def attempt(tag):
    try:
        sd = torch.load(path, weights_only=True)
        res[tag] = {"ok": True, "types": {k: type(v).__module__ + "." + type(v).__qualname__ for k, v in sd.items()},
                    "repr": {k: repr(v)[:300] for k, v in sd.items()}}
    except Exception as e:
        res[tag] = {"ok": False, "error": type(e).__name__ + ": " + str(e)[:3000]}
attempt("import_torch_only")
import torch.distributed.tensor
attempt("after_import_torch_distributed_tensor")
try:
    sd = torch.load(path, weights_only=False)
    res["weights_only_false"] = {"ok": True, "repr": {k: repr(v)[:300] for k, v in sd.items()}}
except Exception as e:
    res["weights_only_false"] = {"ok": False, "error": type(e).__name__ + ": " + str(e)[:3000]}
print(json.dumps(res, indent=1, sort_keys=True))
"""


def driver(out, only):
    import torch
    os.makedirs(out, exist_ok=True)
    vers = {"torch": torch.__version__, "python": sys.version, "cuda": torch.version.cuda}
    try:
        import safetensors
        vers["safetensors"] = safetensors.__version__
    except Exception as e:  # noqa: BLE001
        vers["safetensors"] = repr(e)
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(vers, f, indent=1)
    log = {}
    status = {}
    for name, ws in CASES.items():
        if only and name != only:
            continue
        if name == "fsdp2-adamw-cuda-ws1" and status.get("fsdp2-adamw-ws2", False) and not only:
            continue
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        port = free_port()
        procs = [subprocess.Popen([sys.executable, __file__, out, "--worker", name, str(r), str(ws), str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(ws)]
        outs = []
        for p in procs:
            try:
                o, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                o, _ = p.communicate()
                o = "TIMEOUT\n" + (o or "")
            outs.append((p.returncode, o[-4000:]))
        log[name] = outs
        ok = all(rc == 0 for rc, _ in outs)
        status[name] = ok
        print(name, "ok" if ok else "FAILED", flush=True)
        if not ok:
            for rc, o in outs:
                print("  rc", rc, o[-1500:])
        r0 = os.path.join(out, name, "ranks", "rank0.pt")
        if os.path.exists(r0):
            pr = subprocess.run([sys.executable, "-c", WO_PROBE, r0], capture_output=True, text=True, timeout=60)
            with open(os.path.join(out, name, "weights_only.json"), "w") as f:
                f.write(pr.stdout if pr.returncode == 0 else json.dumps({"probe_failed": pr.stderr[-3000:]}))
    with open(os.path.join(out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    # The PyTorch source files the C++ reader follows.
    root = os.path.dirname(torch.__file__)
    dst = os.path.join(out, "torchsrc")
    for rel in ["distributed/checkpoint", "distributed/tensor/__init__.py", "distributed/tensor/_api.py",
                "distributed/tensor/placement_types.py", "distributed/tensor/_dtensor_spec.py",
                "distributed/device_mesh.py", "serialization.py", "_weights_only_unpickler.py"]:
        s = os.path.join(root, rel)
        d = os.path.join(dst, rel)
        if os.path.isdir(s):
            shutil.copytree(s, d, ignore=shutil.ignore_patterns("__pycache__"))
        elif os.path.exists(s):
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy(s, d)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if len(sys.argv) > 2 and sys.argv[2] == "--worker":
        try:
            run_case(sys.argv[3], sys.argv[1], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        except Exception:
            traceback.print_exc()
            sys.exit(1)
    else:
        only = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--case" else None
        driver(sys.argv[1], only)
