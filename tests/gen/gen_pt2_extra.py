#!/usr/bin/env python3
"""Makes tests/data/pt2-2.11-extra/: more torch.export programs written by real PyTorch (2.11).

Run on a machine with PyTorch 2.11, CUDA, transformers and safetensors:

    python3 gen_pt2_extra.py OUTDIR [--seed 0]

Per model it writes <m>.train.pt2 (torch.export.export), <m>.core.pt2 (run_decompositions()),
<m>.io.safetensors (input.<name>, output.<i>.cpu, output.<i>.cuda: eager, TF32 off) and <m>.json
(shapes, tolerances, op sets read from the archive JSON, records, configs, reload results), in the
format of tests/data/pt2-2.11. Extra outputs:
  - <m>.flat.pt2: the same program serialized by 2.11's torch._export.serde.serialize.serialize()
    and written into the zip layout of torch 2.6's torch.export.save() (serialized_exported_program.json,
    serialized_state_dict.pt, serialized_constants.pt, serialized_example_inputs.pt, version).
  - bert_base.skeleton.train.pt2: a BERT-base-sized program without its weight records (timing only;
    the weights are filled with seeded random bytes of the recorded sizes where it is used).
Weights are random and seeded. Every step runs under try/except; failures are recorded in the JSON
(and in gen.log) instead of stopping the run.
"""
import argparse
import copy
import hashlib
import io
import json
import os
import sys
import time
import traceback
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

LOG = []


def log(msg):
    LOG.append(msg)
    print(msg, flush=True)


# ---------------------------------------------------------------- models
class RMSNorm(nn.Module):
    """LLaMA's RMSNorm (HF LlamaRMSNorm without the dtype round trip: the model is float32)."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d, n_heads, n_kv, ffn):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, d // n_heads
        self.attn_norm = RMSNorm(d)
        self.q_proj = nn.Linear(d, n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(n_heads * self.hd, d, bias=False)
        self.ffn_norm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        # HF repeat_kv: expand + reshape (grouped-query attention)
        k = k[:, :, None, :, :].expand(b, self.n_kv, rep, t, self.hd).reshape(b, self.n_heads, t, self.hd)
        v = v[:, :, None, :, :].expand(b, self.n_kv, rep, t, self.hd).reshape(b, self.n_heads, t, self.hd)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, self.n_heads * self.hd)
        x = x + self.o_proj(a)
        h = self.ffn_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab=256, d=64, n_heads=4, n_kv=2, ffn=128, n_layers=2, max_t=32, theta=10000.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([LlamaBlock(d, n_heads, n_kv, ffn) for _ in range(n_layers)])
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        hd = d // n_heads
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        f = torch.outer(torch.arange(max_t, dtype=torch.float32), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed(idx)
        cos = self.cos_cached[:t]
        sin = self.sin_cached[:t]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


class BertWrap(nn.Module):
    """HF BertModel returning (last_hidden_state, pooler_output) as a tuple."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        o = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return o.last_hidden_state, o.pooler_output


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TinyBlock(nn.Module):
    """torchvision's BasicBlock (conv3x3-BN-ReLU-conv3x3-BN, += identity or a 1x1 downsample, ReLU inplace),
    with groups / dilation on the first conv to exercise them."""

    def __init__(self, cin, cout, stride=1, groups=1, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, groups=groups, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNetTiny(nn.Module):
    """A torchvision-ResNet-shaped CNN small enough to commit: 7x7/2 conv with bias, BN, ReLU, max_pool2d
    3/2/1, three BasicBlocks (a grouped strided one with a downsample, a dilated one), max_pool2d 2/2 with
    ceil_mode on the odd 7x7 map, adaptive average pool to 1x1, flatten, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 7, 2, 3, bias=True)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = TinyBlock(16, 16)
        self.layer2 = TinyBlock(16, 32, stride=2, groups=2)
        self.layer3 = TinyBlock(32, 32, dilation=2)
        self.pool2 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool2(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def calibrate_bn(m, g, shape, batches=4):
    """BatchNorm running statistics of a few random batches (train mode, cumulative average), so eval-mode
    batch_norm is not the identity of fresh statistics."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.momentum = None
            mod.reset_running_stats()
    m.train()
    with torch.no_grad():
        for _ in range(batches):
            m(torch.randn(shape, generator=g))
    perturb_norms(m, g)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.add_(0.1 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.add_(0.1 * torch.randn(mod.bias.shape, generator=g))
    return m.eval()


def perturb_norms(m, g):
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name.lower() and p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def make_bert(cfg_kw, seed, attn):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(**cfg_kw)
    cfg._attn_implementation = attn
    return BertModel(cfg)


# ---------------------------------------------------------------- helpers
def flat_outputs(o):
    if isinstance(o, torch.Tensor):
        return [o]
    out = []
    for x in o:
        out += flat_outputs(x)
    return out


def cmp(outs, refs):
    res = []
    for o, r in zip(outs, refs):
        o = o.detach().float().cpu()
        r = r.detach().float().cpu()
        res.append({"max_abs": float((o - r).abs().max()), "ref_abs_max": float(r.abs().max())})
    return res


def within(c, tol):
    return all(x["max_abs"] <= tol["atol"] + tol["rtol"] * x["ref_abs_max"] for x in c)


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def read_archive(path):
    info = {"records": [], "configs": {}}
    with zipfile.ZipFile(path) as z:
        for zi in z.infolist():
            info["records"].append({"name": zi.filename, "size": zi.file_size, "compress_type": zi.compress_type})
        js = [n for n in z.namelist() if ("/models/" in n and n.endswith(".json")) or n.endswith("serialized_exported_program.json")]
        info["model_json"] = js
        for n in z.namelist():
            if n.endswith("_config.json"):
                info["configs"][n] = json.loads(z.read(n))
            if n.endswith("/version") or n == "version":
                info.setdefault("version_records", {})[n] = z.read(n).decode("utf-8", "replace")
        if js:
            j = json.loads(z.read(js[0]))
            info["json_top_keys"] = sorted(j.keys())
            info["schema_version"] = j.get("schema_version")
            info["opset_version"] = j.get("opset_version")
            info["torch_version_field"] = j.get("torch_version")
            g = j["graph_module"]["graph"]
            ops = {}
            kinds = {}
            for n in g["nodes"]:
                ops[n["target"]] = ops.get(n["target"], 0) + 1
                for a in n["inputs"]:
                    for k in a["arg"]:
                        kinds[k] = kinds.get(k, 0) + 1
            info["ops_json"] = dict(sorted(ops.items()))
            info["arg_kinds"] = dict(sorted(kinds.items()))
            info["n_nodes"] = len(g["nodes"])
    return info


def ops_inmemory(ep):
    ops = {}
    for n in ep.graph.nodes:
        if n.op == "call_function":
            k = str(n.target)
            ops[k] = ops.get(k, 0) + 1
    return dict(sorted(ops.items()))


def signature(ep):
    sig = ep.graph_signature
    ins = []
    for s in sig.input_specs:
        ins.append({"kind": s.kind.name, "arg": getattr(s.arg, "name", str(s.arg)), "target": s.target,
                    "persistent": s.persistent})
    outs = [{"kind": s.kind.name, "arg": getattr(s.arg, "name", str(s.arg)), "target": s.target}
            for s in sig.output_specs]
    rc = {str(k): {"min_val": str(v.lower), "max_val": str(v.upper)} for k, v in ep.range_constraints.items()}
    return {"input_specs": ins, "output_specs": outs, "range_constraints": rc}


def save_flat(ep, path):
    """torch 2.6's torch.export.save() zip layout, filled by 2.11's serialize()."""
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    artifact = serialize(ep)
    with zipfile.ZipFile(path, "w") as zipf:
        assert isinstance(artifact.exported_program, bytes)
        zipf.writestr("serialized_exported_program.json", artifact.exported_program)
        zipf.writestr("serialized_state_dict.pt", artifact.state_dict)
        zipf.writestr("serialized_constants.pt", artifact.constants)
        zipf.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        zipf.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
    return {"schema_version_const": list(SCHEMA_VERSION)}


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# ---------------------------------------------------------------- one model
def emit(outdir, name, model, inputs, desc, tol, export_device="cpu", flat=False, dtype=torch.float32,
         extra_inputs=None):
    """inputs: list of (argname, cpu tensor) in forward order."""
    t0 = time.time()
    meta = {"model": name, "description": desc, "export_device": export_device, "dtype": dtype_name(dtype),
            "inputs": [{"name": n, "shape": list(t.shape), "dtype": dtype_name(t.dtype)} for n, t in inputs],
            "tolerance": {"program_vs_eager_cpu": tol, "eager_cuda_vs_cpu": tol,
                          "note": "pass if max|out-ref| <= atol + rtol*max|ref| per output; CUDA references made "
                                  "with TF32 off (cuda.matmul.allow_tf32=False, cudnn.allow_tf32=False)"},
            "programs": {}, "errors": []}
    model = model.to(dtype).eval()
    args_cpu = tuple(t for _, t in inputs)
    io_t = {f"input.{n}": t.contiguous() for n, t in inputs}
    with torch.no_grad():
        ref_cpu = [o.detach().contiguous() for o in flat_outputs(model(*args_cpu))]
    meta["outputs"] = [{"shape": list(o.shape), "dtype": dtype_name(o.dtype)} for o in ref_cpu]
    for i, o in enumerate(ref_cpu):
        io_t[f"output.{i}.cpu"] = o
    mc = copy.deepcopy(model).cuda()
    args_cuda = tuple(t.cuda() for t in args_cpu)
    with torch.no_grad():
        ref_cuda = [o.detach().cpu().contiguous() for o in flat_outputs(mc(*args_cuda))]
    for i, o in enumerate(ref_cuda):
        io_t[f"output.{i}.cuda"] = o
    meta["eager_cuda_vs_cpu"] = cmp(ref_cuda, ref_cpu)
    meta["eager_cuda_within_tol"] = within(meta["eager_cuda_vs_cpu"], tol)
    cases = {}
    for tag, ins in (extra_inputs or {}).items():
        a = tuple(t for _, t in ins)
        with torch.no_grad():
            rc = flat_outputs(model(*a))
            rg = flat_outputs(mc(*tuple(t.cuda() for t in a)))
        for n, t in ins:
            io_t[f"extra.{tag}.input.{n}"] = t.contiguous()
        for i, o in enumerate(rc):
            io_t[f"extra.{tag}.output.{i}.cpu"] = o.contiguous()
        for i, o in enumerate(rg):
            io_t[f"extra.{tag}.output.{i}.cuda"] = o.cpu().contiguous()
        cases[tag] = {"inputs": [{"shape": list(t.shape), "dtype": dtype_name(t.dtype)} for _, t in ins]}
    meta["extra_cases"] = cases

    em = mc if export_device == "cuda" else model
    ea = args_cuda if export_device == "cuda" else args_cpu
    ep = torch.export.export(em, ea)
    meta["export_s"] = time.time() - t0
    core = ep.run_decompositions()
    for ir, prog in (("train", ep), ("core", core)):
        fn = f"{name}.{ir}.pt2"
        p = os.path.join(outdir, fn)
        rec = {"file": fn, "ops_inmemory": ops_inmemory(prog), "signature": signature(prog)}
        try:
            torch.export.save(prog, p)
            rec.update(read_archive(p))
            rec["bytes"] = os.path.getsize(p)
            rec["sha256"] = sha(p)
            ep2 = torch.export.load(p)
            with torch.no_grad():
                outs = flat_outputs(ep2.module()(*ea))
            rec["reloaded_vs_eager_cpu"] = cmp(outs, ref_cpu)
            rec["reloaded_within_tol"] = within(rec["reloaded_vs_eager_cpu"], tol)
            if export_device == "cuda":
                rec["reloaded_vs_eager_cuda"] = cmp(outs, ref_cuda)
                try:
                    with torch.no_grad():
                        oc = flat_outputs(ep2.module()(*args_cpu))
                    rec["reloaded_run_on_cpu_inputs"] = {"ok": True, "vs_eager_cpu": cmp(oc, ref_cpu)}
                except Exception as e:  # devices are baked in
                    rec["reloaded_run_on_cpu_inputs"] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
            for tag, ins in (extra_inputs or {}).items():
                a = tuple(t.to(export_device) for _, t in ins)
                with torch.no_grad():
                    o = flat_outputs(ep2.module()(*a))
                cases[tag][f"{ir}_program_vs_eager_cpu"] = cmp(
                    o, [io_t[f"extra.{tag}.output.{i}.cpu"] for i in range(len(o))])
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:800]}"
            meta["errors"].append(f"{ir}: {rec['error']}")
            log(traceback.format_exc())
        if flat and ir == "core":
            ff = f"{name}.flat.pt2"
            fp = os.path.join(outdir, ff)
            fr = {"file": ff, "layout": "torch 2.6 torch.export.save() zip layout, 2.11 serialize() contents"}
            try:
                fr.update(save_flat(prog, fp))
                fr.update(read_archive(fp))
                fr["bytes"] = os.path.getsize(fp)
                fr["sha256"] = sha(fp)
                try:
                    ep3 = torch.export.load(fp)
                    with torch.no_grad():
                        o3 = flat_outputs(ep3.module()(*ea))
                    fr["reloads_in_2_11"] = True
                    fr["reloaded_vs_eager_cpu"] = cmp(o3, ref_cpu)
                except Exception as e:
                    fr["reloads_in_2_11"] = False
                    fr["reload_error"] = f"{type(e).__name__}: {str(e)[:800]}"
                with zipfile.ZipFile(fp) as z:
                    sd = z.read("serialized_state_dict.pt")
                    fr["state_dict_pt_head"] = sd[:4].hex()
                    try:
                        fr["state_dict_keys"] = sorted(torch.load(io.BytesIO(sd), weights_only=True).keys())
                    except Exception as e:
                        fr["state_dict_load_error"] = f"{type(e).__name__}: {str(e)[:400]}"
                    try:
                        c = torch.load(io.BytesIO(z.read("serialized_constants.pt")), weights_only=True)
                        fr["constants_keys"] = sorted(c.keys()) if isinstance(c, dict) else str(type(c))
                    except Exception as e:
                        fr["constants_load_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            except Exception as e:
                fr["error"] = f"{type(e).__name__}: {str(e)[:800]}"
                log(traceback.format_exc())
            meta["programs"]["flat"] = fr
        meta["programs"][ir] = rec
    sdpa = sorted({k for k in meta["programs"].get("core", {}).get("ops_json", {}) if "scaled_dot_product" in k})
    meta["sdpa_ops_core"] = sdpa
    save_file(io_t, os.path.join(outdir, f"{name}.io.safetensors"),
              metadata={"model": name, "torch": torch.__version__, "inputs": ",".join(n for n, _ in inputs)})
    meta["io_keys"] = {k: [dtype_name(v.dtype), list(v.shape)] for k, v in io_t.items()}
    meta["made_with"] = f"gen_pt2_extra.py OUTDIR --seed {SEED} (torch {torch.__version__})"
    meta["phase_s"] = time.time() - t0
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump(meta, f, indent=1)
    log(f"{name}: done in {meta['phase_s']:.1f}s; sdpa core {sdpa}; errors {meta['errors']}")
    return ep


def skeleton(src, dst):
    """Copies a PT2 archive without its weight records (sizes stay in the config)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        for r in zi.infolist():
            if "/data/weights/weight_" in r.filename:
                continue
            zo.writestr(r.filename, zi.read(r.filename))


SEED = 0


def main():
    global SEED
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-bert-base", action="store_true")
    ap.add_argument("--only", nargs="+", default=None,
                    help="make only these models (e.g. llama_cuda_bf16_flash); env.json/gen.log are written "
                         "as <outdir>/env.<first>.json / gen.<first>.log then")
    a = ap.parse_args()
    SEED = a.seed
    os.makedirs(a.outdir, exist_ok=True)
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0)}
    try:
        import transformers
        import safetensors

        env["transformers"] = transformers.__version__
        env["safetensors"] = safetensors.__version__
    except Exception as e:
        env["import_error"] = str(e)
    log(json.dumps(env))
    tol32 = {"atol": 1e-5, "rtol": 1e-5}
    g = torch.Generator().manual_seed(SEED)

    def job(fn):
        try:
            fn()
        except Exception:
            log(traceback.format_exc())

    def llama():
        torch.manual_seed(SEED)
        m = Llama()
        perturb_norms(m, torch.Generator().manual_seed(SEED + 10))
        idx = torch.randint(0, 256, (2, 16), generator=g)
        emit(a.outdir, "llama", m, [("idx", idx)],
             "LLaMA-style decoder: vocab 256, d 64, 4 query heads / 2 KV heads (GQA via expand+reshape), head 16, "
             "2 blocks, RMSNorm eps 1e-6, rotary embedding (non-persistent cos/sin buffers, rotate_half), causal SDPA, "
             "SwiGLU FFN 128, untied lm_head; exported on CPU inputs", tol32, flat=True)

    def llama_cuda():
        torch.manual_seed(SEED)
        m = Llama()
        perturb_norms(m, torch.Generator().manual_seed(SEED + 10))
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(SEED + 1))
        emit(a.outdir, "llama_cuda", m, [("idx", idx)],
             "the llama model (same construction and seed) exported on CUDA inputs (float32)", tol32,
             export_device="cuda")

    def llama_cuda_bf16():
        torch.manual_seed(SEED)
        m = Llama()
        perturb_norms(m, torch.Generator().manual_seed(SEED + 10))
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(SEED + 2))
        emit(a.outdir, "llama_cuda_bf16", m, [("idx", idx)],
             "the llama model in bfloat16 exported on CUDA inputs", {"atol": 5e-2, "rtol": 2e-2},
             export_device="cuda", dtype=torch.bfloat16)

    def llama_cuda_bf16_flash():
        # The same bf16 model with SDPA restricted to the flash backend (2.11 on an H200 picks cuDNN for
        # bf16 by default): the core IR then spells attention _scaled_dot_product_flash_attention.
        from torch.nn.attention import SDPBackend, sdpa_kernel

        torch.manual_seed(SEED)
        m = Llama()
        perturb_norms(m, torch.Generator().manual_seed(SEED + 10))
        idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(SEED + 2))
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            emit(a.outdir, "llama_cuda_bf16_flash", m, [("idx", idx)],
                 "the llama model in bfloat16 exported on CUDA inputs with SDPA restricted to the flash backend "
                 "(torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION]) around export and eager)",
                 {"atol": 5e-2, "rtol": 2e-2}, export_device="cuda", dtype=torch.bfloat16)

    def bert():
        cfg = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)
        last = None
        for attn in ("sdpa", "eager"):
            try:
                m = BertWrap(make_bert(cfg, SEED, attn))
                perturb_norms(m, torch.Generator().manual_seed(SEED + 10))
                ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(SEED + 3))
                mask = torch.ones(2, 16, dtype=torch.int64)
                mask[1, 10:] = 0
                emit(a.outdir, "bert", m, [("input_ids", ids), ("attention_mask", mask)],
                     f"HF transformers BertModel (random seeded config: 2 layers, hidden 64, 4 heads, intermediate "
                     f"128, vocab 512, attn_implementation={attn}) with input_ids + attention_mask (row 1 padded "
                     f"from position 10); outputs (last_hidden_state, pooler_output)", tol32, flat=False)
                return
            except Exception as e:
                last = e
                log(f"bert with attn={attn} failed: {traceback.format_exc()}")
        raise last

    def mlp_flat():
        torch.manual_seed(SEED)
        m = MLP()
        x = torch.randn(2, 32, generator=g)
        emit(a.outdir, "mlp_small", m, [("x", x)], "Linear 32-64-8 with GELU (erf); also written in the flat layout",
             tol32, flat=True)

    def bert_base():
        from transformers import BertConfig, BertModel

        torch.manual_seed(SEED)
        m = BertWrap(BertModel(BertConfig())).eval()
        ids = torch.randint(0, 30522, (1, 128), generator=torch.Generator().manual_seed(SEED + 4))
        mask = torch.ones(1, 128, dtype=torch.int64)
        t0 = time.time()
        with torch.no_grad():
            m(ids, mask)
        t1 = time.time()
        with torch.no_grad():
            m(ids, mask)
        eager_s = time.time() - t1
        ep = torch.export.export(m, (ids, mask))
        p = os.path.join(a.outdir, "bert_base.train.full.pt2")
        torch.export.save(ep, p)
        skeleton(p, os.path.join(a.outdir, "bert_base.skeleton.train.pt2"))
        info = read_archive(p)
        os.remove(p)
        info.pop("configs", None)
        info.update({"eager_cpu_s_second_call": eager_s, "eager_cpu_s_first_call": t1 - t0,
                     "cpu_threads": torch.get_num_threads(), "input_ids_seed": SEED + 4,
                     "config": "BertConfig() defaults: 12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522",
                     "shape": [1, 128]})
        with open(os.path.join(a.outdir, "bert_base.json"), "w") as f:
            json.dump(info, f, indent=1)
        log(f"bert_base: eager cpu {eager_s:.3f}s, nodes {info.get('n_nodes')}")

    def resnet_tiny():
        torch.manual_seed(SEED)
        m = calibrate_bn(ResNetTiny(), torch.Generator().manual_seed(SEED + 20), (8, 3, 56, 56))
        x = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(SEED + 5))
        emit(a.outdir, "resnet_tiny", m, [("x", x)],
             "ResNetTiny (this script): conv7x7/2+bias, BN, ReLU, max_pool2d 3/2/1, BasicBlocks 16-16, 16-32 "
             "(stride 2, groups 2, 1x1 downsample), 32-32 (dilation 2), max_pool2d 2/2 ceil_mode, adaptive avg "
             "pool 1x1, Linear(32, 10); BN statistics calibrated on random batches; input [2, 3, 56, 56]",
             {"atol": 1e-4, "rtol": 1e-4})

    jobs = {"llama": llama, "llama_cuda": llama_cuda, "bert": bert, "mlp_flat": mlp_flat, "resnet_tiny": resnet_tiny,
            "llama_cuda_bf16": llama_cuda_bf16, "llama_cuda_bf16_flash": llama_cuda_bf16_flash,
            "bert_base": bert_base}
    if a.only:
        for name in a.only:
            job(jobs[name])
        suffix = "." + a.only[0]
    else:
        for fn in (llama, llama_cuda, bert, mlp_flat, llama_cuda_bf16, resnet_tiny):
            job(fn)
        if not a.skip_bert_base:
            job(bert_base)
        suffix = ""
    with open(os.path.join(a.outdir, f"env{suffix}.json"), "w") as f:
        json.dump(env, f, indent=1)
    with open(os.path.join(a.outdir, f"gen{suffix}.log"), "w") as f:
        f.write("\n".join(LOG))


if __name__ == "__main__":
    main()
