#!/usr/bin/env python3
"""Fills tests/data/pt2-2.11-extra/bert_base.skeleton.train.pt2 with weights for a CPU timing run.

The skeleton is a real BERT-base-sized torch.export program (PyTorch 2.11, see that folder's README)
whose weight records were left out. This writes OUT.pt2 = the skeleton plus one record per
data/weights/weight_<n>, sized from the weights config (numel x element size of each entry's storage
view; tied entries share a record), filled with seeded normal(0, 0.02) float32 values (LayerNorm
weights 1; int64 buffers: position_ids = arange, token_type_ids = 0), and IN.safetensors with input_ids (seeded, [1,128] int64) and attention_mask (ones).
Needs only the Python standard library.

    python3 bench/bert_base_fill.py SKELETON.pt2 OUT.pt2 IN.safetensors
"""
import json
import random
import struct
import sys
import zipfile

skel, out_path, in_path = sys.argv[1:4]
rng = random.Random(0)
ELEM = {7: 4, 5: 8, 12: 1, 13: 2, 6: 2}  # schema.yaml ScalarType -> bytes (float, long, bool, bfloat16, half)
with zipfile.ZipFile(skel) as zi, zipfile.ZipFile(out_path, "w") as zo:
    root = zi.namelist()[0].split("/")[0]
    cfg = json.loads(zi.read(f"{root}/data/weights/model_weights_config.json"))["config"]
    need = {}
    for fqn, e in cfg.items():
        m = e["tensor_meta"]
        sizes = [s["as_int"] for s in m["sizes"]]
        strides = [s["as_int"] for s in m["strides"]]
        extent = m.get("storage_offset", {"as_int": 0})["as_int"] + 1 + sum((a - 1) * b for a, b in zip(sizes, strides))
        nbytes = extent * ELEM[m["dtype"]]
        prev = need.get(e["path_name"], (0, fqn, m["dtype"]))
        need[e["path_name"]] = (max(prev[0], nbytes), fqn, m["dtype"])
    for r in zi.infolist():
        zo.writestr(r, zi.read(r.filename))
    for path, (nbytes, fqn, dtype) in sorted(need.items()):
        if dtype == 5:  # int64 buffers: position_ids = arange, token_type_ids = zeros
            n = nbytes // 8
            data = struct.pack(f"<{n}q", *(range(n) if "position_ids" in fqn else [0] * n))
        else:
            n = nbytes // 4
            vals = [1.0] * n if "LayerNorm.weight" in fqn else [rng.gauss(0.0, 0.02) for _ in range(n)]
            data = struct.pack(f"<{n}f", *vals)
        zo.writestr(zipfile.ZipInfo(f"{root}/data/weights/{path}"), data)

ids = [rng.randrange(0, 30522) for _ in range(128)]
tensors = {"input_ids": struct.pack("<128q", *ids), "attention_mask": struct.pack("<128q", *([1] * 128))}
header, off = {}, 0
for k, b in tensors.items():
    header[k] = {"dtype": "I64", "shape": [1, 128], "data_offsets": [off, off + len(b)]}
    off += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(in_path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(tensors.values()))
