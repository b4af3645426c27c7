"""A checkpoint holding a torch.Tensor subclass, made by real PyTorch 1.13.

Run with Debian's PyTorch 1.13, from this directory:
    /usr/bin/python3 gen_tensor_subclass.py
Writes my_tensor.pt ({"t": MyTensor [[1, 2, 3], [4, 5, 6]] float32 with the
attribute tag="calibrated", "plain": a torch.Tensor}) and observed.txt: the
globals the pickle imports (pickletools), what torch.load reads back, and
whether 1.13's weights_only=True loads it.
"""
import io
import pickletools
import sys
import zipfile

import torch

from mytensors import MyTensor

t = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).as_subclass(MyTensor)
t.tag = "calibrated"
torch.save({"t": t, "plain": torch.arange(4, dtype=torch.int64)}, "my_tensor.pt")

lines = ["# torch %s, python %s" % (torch.__version__, sys.version.split()[0])]
pkl = zipfile.ZipFile("my_tensor.pt").read("my_tensor/data.pkl")
out = io.StringIO()
pickletools.dis(pkl, out)
lines += ["GLOBAL " + l.split("GLOBAL", 1)[1].strip() for l in out.getvalue().splitlines() if "GLOBAL" in l]
d = torch.load("my_tensor.pt")
lines.append("t: type %s.%s dtype %s shape %s values %s tag %r dict %r" % (
    type(d["t"]).__module__, type(d["t"]).__qualname__, d["t"].dtype, list(d["t"].shape),
    d["t"].tolist(), d["t"].tag, d["t"].__dict__))
lines.append("plain: %s %s" % (d["plain"].dtype, d["plain"].tolist()))
try:
    torch.load("my_tensor.pt", weights_only=True)
    lines.append("weights_only=True: loads")
except Exception as e:  # noqa: BLE001 - record what 1.13 says
    lines.append("weights_only=True: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:200]))
open("observed.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
