#!/usr/bin/python3
"""Real files for tests/open/test_open.cpp (the format dispatcher, safeckpt::open).

Run with Debian's Python (3.11, PyTorch 1.13 installed as python3-torch):
    /usr/bin/python3 tests/data/gen_open.py
Writes tests/data/open/bare_pickle.pkl: what `pickle.dump` of plain Python
values gives (no torch.save container), the "bare pickle" format that
torch.load(weights_only=True) also unpickles.
"""
import os
import pickle

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "open")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "bare_pickle.pkl"), "wb") as f:
    pickle.dump({"epoch": 3, "lr": 0.5, "names": ["encoder", "decoder"], "done": True}, f, protocol=2)
