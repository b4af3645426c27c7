#!/usr/bin/env python3
"""Write reference safetensors files with the safetensors reference implementation.

The `safetensors` package is not installable on the development machine (no PyPI), so run
this where it is (the GPU machine: PyTorch 2.11 + safetensors), then copy OUTDIR into the
repository as tests/data/safetensors-ref/:

    python3 tests/interop/make_safetensors.py OUTDIR

Writes, with safetensors.torch.save_file (its Rust core orders tensors and pads the header):
  basic.safetensors       one tensor per common dtype, a 0-d scalar, an empty tensor; metadata
                          {"format": "pt"}
  new_dtypes.safetensors  uint16/32/64, float8 (e4m3fn, e5m2, e8m0fnu, fnuz), complex64,
                          float4_e2m1fn_x2 -- whichever this torch and safetensors support
  names.safetensors       names that sort and escape interestingly (unicode, quotes, tab)
  multi_meta.safetensors  several __metadata__ keys (the reference orders them by hash: only
                          the parse is compared, not the bytes)
  model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json   a sharded checkpoint
  expected.json           for every file: tensors {name: {dtype, shape, sha256}} and metadata,
                          plus the versions used
tests/safetensors/test_safetensors.cpp reads the directory when present: every file must parse, give
these tensors, and re-serialize byte-identically with our writer (metadata kept in file order).
"""
import hashlib
import json
import os
import sys

import torch
import safetensors
from safetensors.torch import save_file, load_file


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def gen(seed, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        if dtype.is_complex:
            return torch.complex(t, t * 2).to(dtype)
        return t.to(dtype)
    # integers: raw random bytes viewed as the dtype
    n = 1
    for d in shape:
        n *= d
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def try_save(path, tensors, metadata, expected):
    save_file(tensors, path, metadata=metadata)
    back = load_file(path)
    entry = {"tensors": {}, "metadata": metadata}
    for k, t in back.items():
        entry["tensors"][k] = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                               "sha256": hashlib.sha256(tensor_bytes(t)).hexdigest()}
    expected[os.path.basename(path)] = entry


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "safetensors-ref"
    os.makedirs(out, exist_ok=True)
    expected = {"torch_version": torch.__version__, "safetensors_version": safetensors.__version__}

    basic = {}
    for i, dt in enumerate([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                            torch.int16, torch.int8, torch.uint8, torch.bool]):
        basic[f"t.{str(dt).replace('torch.', '')}"] = gen(i, (3, 5), dt)
    basic["scalar"] = torch.tensor(1.5)
    basic["empty"] = torch.zeros((0, 3))
    basic["layer.0.weight"] = gen(99, (8, 4), torch.float32)
    try_save(os.path.join(out, "basic.safetensors"), basic, {"format": "pt"}, expected)

    new = {}
    for name in ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
                 "float8_e4m3fnuz", "float8_e5m2fnuz", "complex64", "float4_e2m1fn_x2"]:
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        try:
            if name == "float4_e2m1fn_x2":
                t = torch.randint(0, 256, (4, 3), dtype=torch.uint8).view(dt)
            elif name.startswith("float8"):
                t = torch.randint(0, 120, (4, 3), dtype=torch.uint8).view(dt)
            else:
                t = gen(7, (4, 3), dt)
            save_file({"x": t}, os.path.join(out, "_probe.safetensors"))  # supported by this safetensors?
            new[name] = t
        except Exception as e:  # noqa: BLE001 - unsupported here; listed in expected.json
            expected.setdefault("unsupported", {})[name] = f"{type(e).__name__}: {e}"[:200]
    if os.path.exists(os.path.join(out, "_probe.safetensors")):
        os.remove(os.path.join(out, "_probe.safetensors"))
    try_save(os.path.join(out, "new_dtypes.safetensors"), new, {"format": "pt"}, expected)

    names = {n: gen(i, (2,), torch.float32) for i, n in enumerate(
        ["b", "a", "A", "a.b", "a_b", "\u00e9t\u00e9", "quote\"d", "back\\slash", "tab\there", "z" * 200])}
    names["u8"] = gen(1, (3,), torch.uint8)
    try_save(os.path.join(out, "names.safetensors"), names, {"format": "pt"}, expected)

    try_save(os.path.join(out, "multi_meta.safetensors"), {"w": gen(5, (2, 2), torch.float16)},
             {"format": "pt", "epoch": "3", "note": "h\u00e9llo \"quoted\""}, expected)

    shard1 = {"model.embed.weight": gen(11, (16, 8), torch.bfloat16), "model.norm.weight": gen(12, (8,), torch.float32)}
    shard2 = {"lm_head.weight": gen(13, (16, 8), torch.bfloat16)}
    try_save(os.path.join(out, "model-00001-of-00002.safetensors"), shard1, {"format": "pt"}, expected)
    try_save(os.path.join(out, "model-00002-of-00002.safetensors"), shard2, {"format": "pt"}, expected)
    weight_map = {k: "model-00001-of-00002.safetensors" for k in shard1}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in shard2})
    total = sum(t.numel() * t.element_size() for t in list(shard1.values()) + list(shard2.values()))
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True, ensure_ascii=False)
    print(f"wrote {out} with safetensors {safetensors.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
