"""safeckpt.save read back by torch 1.13; safe_open and scan on .pt and .safetensors."""
import collections
import subprocess
import sys

import pytest
import torch

import safeckpt
from conftest import CORPUS, DATA
from helpers import assert_same_as_torch, storage_ptr


def test_save_roundtrip_through_torch(tmp_path):
    # the values torch 1.13's weights-only unpickler reads (it lacks BINFLOAT,
    # _codecs.encode, set, bytearray, Counter, torch.device and dtypes: those
    # are checked with our own loader in test_save_other_values_roundtrip)
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    obj = collections.OrderedDict(
        base=base, row=base[2], t=base.t(), half=torch.ones(3, dtype=torch.float16),
        bf=torch.arange(4, dtype=torch.bfloat16), p=torch.nn.Parameter(torch.randn(2, 2)), i=torch.tensor(7),
        big=2**80, neg=-5, s="é", l=[1, (2, 3)], d={"k": None, 3: True}, size=torch.Size([2, 3]))
    obj._metadata = collections.OrderedDict({"": {"version": 1}})
    p = tmp_path / "saved.pt"
    safeckpt.save(obj, p)
    ref = torch.load(p, weights_only=True)  # Debian's torch reads our file
    assert_same_as_torch(obj, ref)
    assert storage_ptr(ref["base"]) == storage_ptr(ref["row"])
    assert ref._metadata == obj._metadata
    assert_same_as_torch(ref, safeckpt.load(p))


def test_save_other_values_roundtrip(tmp_path):
    obj = {"f": 0.1, "nan": float("nan"), "c": 1 + 2j, "t": torch.zeros(2), "b": b"\x00\x01",
           "ba": bytearray(b"x"), "st": {1, 2}, "cnt": collections.Counter(a=2), "dev": torch.device("cpu"),
           "dt": torch.bfloat16}
    p = tmp_path / "floats.pt"
    safeckpt.save(obj, p)
    got = safeckpt.load(p)
    assert got["f"] == 0.1 and got["c"] == 1 + 2j and got["nan"] != got["nan"]
    assert torch.equal(got["t"], obj["t"])
    for k in ("b", "ba", "st", "cnt", "dev", "dt"):
        assert got[k] == obj[k] and type(got[k]) is type(obj[k]), k


def test_save_corpus_state_dict_and_file_object(tmp_path):
    sd = safeckpt.load(CORPUS / "views_shared_storage.pt")
    p = tmp_path / "copy.pt"
    with open(p, "wb") as f:
        safeckpt.save(sd, f)
    assert_same_as_torch(sd, torch.load(p, weights_only=True))


def test_save_refuses_objects(tmp_path):
    with pytest.raises(TypeError):
        safeckpt.save({"x": object()}, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
    p = tmp_path / "keep.pt"
    p.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        safeckpt.save({}, p, overwrite=False)
    assert p.read_bytes() == b"old"


def test_safe_open_pt():
    ref = torch.load(CORPUS / "mlp_state_dict.pt", weights_only=True)
    with safeckpt.safe_open(CORPUS / "mlp_state_dict.pt", framework="pt") as f:
        assert f.keys() == list(ref.keys())
        assert f.metadata() is None
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), ref[k])
        with pytest.raises(KeyError):
            f.get_tensor("nope")


def _safetensors_file(tmp_path):
    # written by our C++ converter (the CLI), from a real torch file
    st = tmp_path / "mlp.safetensors"
    cli = DATA.parents[1] / "build" / "cli" / "safeckpt"
    import os
    cli = os.environ.get("SAFECKPT_CLI", str(cli))
    subprocess.run([cli, "convert", str(CORPUS / "mlp_state_dict.pt"), str(st)], check=True)
    return st


def test_safe_open_safetensors_and_load(tmp_path):
    st = _safetensors_file(tmp_path)
    ref = torch.load(CORPUS / "mlp_state_dict.pt", weights_only=True)
    with safeckpt.safe_open(st, framework="np") as f:
        assert sorted(f.keys()) == sorted(ref.keys())
        for k in f.keys():
            assert (f.get_tensor(k) == ref[k].numpy()).all()
    sd = safeckpt.load(st)
    assert isinstance(sd, collections.OrderedDict)
    for k in ref:
        assert torch.equal(sd[k], ref[k])


def test_scan():
    clean = safeckpt.scan(CORPUS / "mlp_state_dict.pt")
    assert clean.clean and clean.verdict == "clean"
    bad = safeckpt.scan(CORPUS / "mal_os_system.pt")
    assert bad.verdict == "unsafe" and not bad.clean
    assert "os.system" in bad.globals
    assert any(f["global"] == "os.system" for f in bad.findings)


def test_module_is_importable_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import safeckpt\n"
            f"sd = safeckpt.load({str(CORPUS / 'mlp_state_dict.pt')!r})\n"
            "import numpy; assert all(isinstance(v, numpy.ndarray) for v in sd.values())\n")
    subprocess.run([sys.executable, "-c", code], check=True)
