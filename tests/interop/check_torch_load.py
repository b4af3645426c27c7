#!/usr/bin/env python3
"""Load files written by safeckpt with real PyTorch / safetensors and describe them.

    check_torch_load.py [--out RESULT.json] [--require-weights-only] FILE...

For each FILE:
  *.safetensors  read with safetensors.torch.load_file when the `safetensors` package is
                 installed, else with a small independent reader (json header +
                 torch.frombuffer); "reader" says which.
  anything else  torch.load(FILE, weights_only=True). PyTorch 1.13's restricted unpickler
                 cannot read BINFLOAT (any Python float) nor torch.device/dtype objects, so on
                 torch < 2 a refusal is retried with weights_only=False (our own files, trusted)
                 and "weights_only" records which mode loaded it. With --require-weights-only
                 (use it on PyTorch >= 2.6) there is no fallback: a refusal is a failure.

Prints (and with --out writes) a JSON object {file: result}; result has "ok", "error",
"weights_only", "torch_version", and "tree": the loaded object as the typed tree of
tests/data/corpus/README.md (tensors with sha256 of their row-major bytes, storage ids,
storage_sha256, ...), the schema safeckpt::to_json emits. Exit status 0 when every file
loaded, 1 otherwise.

With --check-offsets (PyTorch >= 2.7) every .pt file is also loaded with
TORCH_SERIALIZATION_DEBUG=1 (torch then asserts that the storage offsets it pre-computes from
.format_version's miniz layout equal the real record offsets) and once more with
torch.utils.serialization.config.load.calculate_storage_offsets = True and mmap=True, whose
tree must equal the plain load's.

Runs on Debian's PyTorch 1.13 (/usr/bin/python3 here) and on the GPU machine's PyTorch 2.11:
    python3 tests/interop/check_torch_load.py --require-weights-only --check-offsets \
        --out result.json out/*.pt out/*.safetensors
"""
import argparse
import collections
import hashlib
import json
import os
import struct
import sys
import traceback
import warnings

import torch

warnings.filterwarnings("ignore")


# The corpus typed tree is defined once, by the corpus generator.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from gen_torch113 import dt_name, enc, tensor_bytes  # noqa: E402


ST_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
             "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64",
             "I64": "int64", "U64": "uint64", "C64": "complex64", "F8_E5M2": "float8_e5m2",
             "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
             "F8_E5M2FNUZ": "float8_e5m2fnuz", "F4": "float4_e2m1fn_x2"}


def read_safetensors(path):
    """(tensors dict in file order, metadata, reader name)."""
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file
        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            md = f.metadata()
        return tensors, md, "safetensors"
    except ImportError:
        pass
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n], object_pairs_hook=collections.OrderedDict)
    md = header.pop("__metadata__", None)
    base = 8 + n
    tensors = collections.OrderedDict()
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = getattr(torch, ST_DTYPES[info["dtype"]])
        shape = list(info["shape"])
        if info["dtype"] == "F4":
            shape[-1] //= 2
        raw = bytearray(data[base + b:base + e])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        tensors[name] = t.view(dt).reshape(shape)
    return tensors, md, "fallback"


def describe(path, require_weights_only, check_offsets=False):
    res = {"torch_version": torch.__version__}
    if path.endswith(".safetensors"):
        tensors, md, reader = read_safetensors(path)
        res.update(ok=True, reader=reader, metadata=md,
                   tensors={k: {"dtype": dt_name(t.dtype), "shape": list(t.shape),
                                "sha256": hashlib.sha256(tensor_bytes(t)).hexdigest()} for k, t in tensors.items()})
        return res
    try:
        obj = torch.load(path, weights_only=True)
        res["weights_only"] = True
    except Exception as e:  # noqa: BLE001 - recorded
        old_torch = int(torch.__version__.split(".")[0]) < 2
        if require_weights_only or not old_torch:
            raise
        res["weights_only_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        obj = torch.load(path, weights_only=False)
        res["weights_only"] = False
    res["ok"] = True
    res["tree"] = enc(obj, {})
    if check_offsets:
        from torch.utils.serialization import config
        config.load.calculate_storage_offsets = True
        try:
            obj2 = torch.load(path, weights_only=True, mmap=True)
        finally:
            config.load.calculate_storage_offsets = False
        res["offsets_checked"] = enc(obj2, {}) == res["tree"]
        if not res["offsets_checked"]:
            raise RuntimeError("calculate_storage_offsets + mmap load differs from the plain load")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--require-weights-only", action="store_true")
    ap.add_argument("--check-offsets", action="store_true")
    a = ap.parse_args()
    if a.check_offsets:
        os.environ["TORCH_SERIALIZATION_DEBUG"] = "1"
    results, ok = {}, True
    for f in a.files:
        try:
            import zipfile  # offsets are a zip matter; legacy-format files have none
            results[f] = describe(f, a.require_weights_only,
                                  a.check_offsets and not f.endswith(".safetensors") and zipfile.is_zipfile(f))
        except Exception as e:  # noqa: BLE001 - reported per file
            ok = False
            results[f] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                          "trace": traceback.format_exc()[-2000:], "torch_version": torch.__version__}
    text = json.dumps(results, indent=1, sort_keys=True)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    else:
        print(text)
    if not a.out:
        return 0 if ok else 1
    print(f"{sum(1 for r in results.values() if r.get('ok'))}/{len(results)} files loaded", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
