#!/usr/bin/env python3
"""GPU machine check (issue 16): safeckpt.load(map_location="cuda") equals
torch.load(weights_only=True, map_location="cuda") bit for bit on every corpus
file PyTorch loads (from the path, from a file object, and with
map_location={"cpu": "cuda:0"}), and the tensors live on the GPU (no host detour in our path:
storages come from the C++ GPU loader through DLPack).

  PYTHONPATH=<module dir>:tests/python python3 tests/python/device/gpu_check.py tests/data/corpus/torch-2.11
Prints one line per file and a summary; exit 1 on any mismatch.
"""
import json
import pathlib
import sys
import warnings

import torch

import safeckpt
from helpers import assert_same_as_torch

warnings.filterwarnings("ignore")
d = pathlib.Path(sys.argv[1])
ok = bad = skipped = 0
for j in sorted(d.glob("*.json")):
    rec = json.loads(j.read_text())
    if not rec["weights_only_ok"]:
        continue
    f = d / rec["file"]
    try:
        ref = torch.load(f, weights_only=True, map_location="cuda")
    except Exception as e:  # noqa: BLE001
        ref_err = f"{type(e).__name__}: {str(e)[:80]}"
        try:
            safeckpt.load(f, map_location="cuda")
            print(f"SKIP {rec['case']}: torch refused on cuda ({ref_err}); safeckpt loaded it")
        except Exception as e2:  # noqa: BLE001
            print(f"SKIP {rec['case']}: both refuse on cuda (torch: {ref_err}; safeckpt: {type(e2).__name__})")
        skipped += 1
        continue
    try:
        ours = safeckpt.load(f, map_location="cuda")
        devs = set()
        stack = [ours]
        while stack:
            o = stack.pop()
            if isinstance(o, torch.Tensor):
                devs.add(o.device.type)
            elif isinstance(o, dict):
                stack.extend(o.values())
            elif isinstance(o, (list, tuple)):
                stack.extend(o)
        n = assert_same_as_torch(ref, ours)
        assert devs <= {"cuda"}, devs
        # the same file as a file object: host parse, then the GPU loader over the bytes
        with open(f, "rb") as fh:
            assert_same_as_torch(ref, safeckpt.load(fh, map_location="cuda"))
        # and through a dict: recorded "cpu" -> "cuda:0"
        assert_same_as_torch(ref, safeckpt.load(f, map_location={"cpu": "cuda:0"}))
        print(f"OK   {rec['case']}: {n} tensors bit-identical (path, file object, dict), devices {sorted(devs)}")
        ok += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {rec['case']}: {type(e).__name__}: {e}")
        bad += 1
print(f"SUMMARY ok={ok} fail={bad} skipped={skipped} torch={torch.__version__} cuda_module={safeckpt.HAS_CUDA}")
sys.exit(1 if bad or ok == 0 else 0)
