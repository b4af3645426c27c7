"""Does PyTorch read the DCP directories `safeckpt convert IN --to-dcp OUT` writes?

Run on the GPU machine (PyTorch 2.11, CPU only, gloo):

    python3 check_to_dcp.py WORK

WORK holds what tests/gen/make_to_dcp.sh made here: `WORK/<case>/dcp` (written by
safeckpt) and the reference it came from: `WORK/<case>/full.safetensors` + `expected.json`
(a tests/data/dcp-2.11 case, references PyTorch made) or `WORK/<case>/source.pt` (a
tests/data/corpus/torch-2.11 file, reference = torch.load(weights_only=True) of it).

Per case, three readers:
  1. `dcp.load` in one process without a process group into a state dict shaped like the
     reference (tensors zero-filled), then every tensor compared bit for bit (as bytes) and
     every non-tensor value compared with ==;
  2. `format_utils.dcp_to_torch_save` then `torch.load(weights_only=False)`, compared the same way;
  3. `dcp.load` with gloo ranks into DTensors (Shard(0) on a 1-D mesh, Replicate for
     0-dim tensors) of another world size than the one we wrote: 2 ranks for the
     world-size-1 directories, 2 and 4 ranks for the `*-ws3` ones (written by
     `--world-size 3`, a .metadata naming __0_0 .. __2_0.distcp); full_tensor() compared.
Prints one JSON object on stdout (the result recorded in tests/data/dcp-2.11/README.md),
then one line `SUMMARY: ...` on stderr; exits 1 when any reader failed or any item differs
(a resharded target PyTorch itself cannot build — gloo's "Invalid scalar type" for dtypes it
does not carry — is counted as skipped, not as a mismatch), 0 otherwise.
"""
import json
import os
import socket
import subprocess
import sys
import traceback


def flat_reference(case_dir):
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    if os.path.exists(os.path.join(case_dir, "source.pt")):
        sd = torch.load(os.path.join(case_dir, "source.pt"), weights_only=True)
        flat, mapping = flatten_state_dict(sd)
        return sd, flat, mapping
    from safetensors.torch import load_file
    full = load_file(os.path.join(case_dir, "full.safetensors"))
    with open(os.path.join(case_dir, "expected.json")) as f:
        expected = json.load(f)
    flat = {}
    for fqn, item in expected["items"].items():
        flat[fqn] = full[fqn] if item["kind"] != "bytes" else ("json", item["value"])
    # Nest it as DCP's planner_data says (expected["mapping"]).
    sd = {}
    for fqn, path in expected["mapping"].items():
        cur = sd
        for i, k in enumerate(path):
            last = i == len(path) - 1
            nxt = path[i + 1] if not last else None
            if isinstance(cur, list):
                while len(cur) <= k:
                    cur.append(None)
                if last:
                    cur[k] = flat[fqn]
                else:
                    if cur[k] is None:
                        cur[k] = [] if isinstance(nxt, int) else {}
                    cur = cur[k]
            else:
                if last:
                    cur[k] = flat[fqn]
                else:
                    cur = cur.setdefault(k, [] if isinstance(nxt, int) else {})
    return sd, flat, expected["mapping"]


def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return {"repr": repr(v)}
    return v


def same(ref, got):
    import torch
    if isinstance(ref, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.dtype != ref.dtype or got.shape != ref.shape:
            return False
        a = ref.detach().contiguous().reshape(-1).view(torch.uint8) if ref.numel() else ref
        b = got.detach().contiguous().reshape(-1).view(torch.uint8) if got.numel() else got
        return ref.numel() == 0 or torch.equal(a, b)
    if isinstance(ref, tuple) and len(ref) == 2 and ref[0] == "json":
        return jsonable(got) == ref[1]
    return got == ref


def blank(sd, flat, mapping, make_tensor):
    """A load target shaped like sd: new containers, tensors from make_tensor(ref),
    every non-tensor item None (so dcp.load must supply it)."""
    import torch
    from torch.distributed.checkpoint._traverse import set_element

    def copy(v):
        if isinstance(v, dict):
            return {k: copy(x) for k, x in v.items()}
        if isinstance(v, list):
            return [copy(x) for x in v]
        if isinstance(v, torch.Tensor):
            return make_tensor(v)
        return None
    target = copy(sd)
    for fqn, v in flat.items():
        if not isinstance(v, torch.Tensor):
            set_element(target, tuple(mapping[fqn]), None)
    return target


def compare(flat_ref, flat_got):
    bad = []
    for fqn, ref in flat_ref.items():
        if fqn not in flat_got:
            bad.append(fqn + ": missing")
        elif not same(ref, flat_got[fqn]):
            bad.append(fqn + ": differs")
    return {"items": len(flat_ref), "tensors": sum(1 for v in flat_ref.values() if hasattr(v, "dtype")),
            "equal": len(flat_ref) - len(bad), "bad": bad[:10]}


def single(case_dir):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    sd, flat_ref, mapping = flat_reference(case_dir)
    out = {}
    try:
        target = blank(sd, flat_ref, mapping, torch.zeros_like)
        dcp.load(target, checkpoint_id=os.path.join(case_dir, "dcp"))
        got, _ = flatten_state_dict(target)
        out["dcp.load"] = compare(flat_ref, got)
    except Exception as e:  # noqa: BLE001
        out["dcp.load"] = {"error": type(e).__name__ + ": " + str(e)[:800]}
    try:
        pt = os.path.join(case_dir, "roundtrip.pt")
        dcp_to_torch_save(os.path.join(case_dir, "dcp"), pt)
        got, _ = flatten_state_dict(torch.load(pt, weights_only=False))
        out["dcp_to_torch_save"] = compare(flat_ref, got)
    except Exception as e:  # noqa: BLE001
        out["dcp_to_torch_save"] = {"error": type(e).__name__ + ": " + str(e)[:800]}
    return out


def resharded_worker(case_dir, rank, ws, port, result_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,))
    sd, flat_ref, mapping = flat_reference(case_dir)

    def to_dtensor(v):
        z = torch.zeros_like(v)
        return distribute_tensor(z, mesh, [Shard(0)] if z.dim() > 0 else [Replicate()])

    target = blank(sd, flat_ref, mapping, to_dtensor)
    dcp.load(target, checkpoint_id=os.path.join(case_dir, "dcp"))
    got, _ = flatten_state_dict(target)
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in got.items()}
    res = compare(flat_ref, full)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def resharded(case_dir, ws=2):
    result_path = os.path.join(case_dir, "resharded.json")
    if os.path.exists(result_path):
        os.remove(result_path)  # a previous world size's result must not be read as this one's
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", case_dir, str(r), str(ws), str(port), result_path],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(ws)]
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
            o = "TIMEOUT " + (o or "")
        outs.append((p.returncode, (o or "")[-600:]))
    if all(rc == 0 for rc, _ in outs) and os.path.exists(result_path):
        with open(result_path) as f:
            r = json.load(f)
        r["world_size"] = ws
        return r
    return {"error": [o for rc, o in outs if rc != 0][:1]}


def written_world_size(case_dir):
    return len([n for n in os.listdir(os.path.join(case_dir, "dcp")) if n.endswith(".distcp")])


def verdict(r):
    """'ok', 'skipped' (PyTorch cannot build the target) or 'bad' for one reader's result."""
    if "error" in r:
        text = json.dumps(r["error"])
        return "skipped" if "Invalid scalar type" in text else "bad"
    return "ok" if not r.get("bad") and r.get("equal") == r.get("items") else "bad"


def main(work):
    import torch
    res = {"torch": torch.__version__, "cases": {}}
    counts = {"ok": 0, "skipped": 0, "bad": 0}
    bad = []
    for name in sorted(os.listdir(work)):
        case_dir = os.path.join(work, name)
        if not os.path.isdir(os.path.join(case_dir, "dcp")):
            continue
        try:
            r = single(case_dir)
            r["written_world_size"] = written_world_size(case_dir)
            if r["written_world_size"] == 1:
                r["dcp.load resharded"] = resharded(case_dir, 2)
            else:
                for ws in (2, 4):
                    r["dcp.load resharded ws%d" % ws] = resharded(case_dir, ws)
        except Exception:  # noqa: BLE001
            r = {"error": traceback.format_exc()[-1500:]}
        res["cases"][name] = r
        readers = {k: v for k, v in r.items() if k.startswith("dcp")} if "error" not in r else {"case": r}
        for reader, v in readers.items():
            c = verdict(v)
            counts[c] += 1
            if c == "bad":
                bad.append(name + "/" + reader)
        print(name, json.dumps(r), file=sys.stderr, flush=True)
    print(json.dumps(res, indent=1, sort_keys=True))
    print("SUMMARY: torch %s, %d directories, reader checks: %d equal, %d skipped (PyTorch cannot build the "
          "target), %d failed%s" % (torch.__version__, len(res["cases"]), counts["ok"], counts["skipped"],
                                    counts["bad"], (": " + ", ".join(bad[:8])) if bad else ""),
          file=sys.stderr, flush=True)
    return 1 if counts["bad"] or not res["cases"] else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        try:
            resharded_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            sys.exit(1)
    else:
        sys.exit(main(sys.argv[1]))
