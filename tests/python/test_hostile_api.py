"""The Python API under hostile use (review 2026-12-06): files changed after
loading, strided buffers, strings with lone surrogates from the file, views
that save would write wrongly. Each case failed (or crashed) before its fix."""
import struct
import zipfile

import pytest
import torch

import safeckpt
from conftest import CORPUS

# A value no other byte run of the file repeats: where the tensor's bytes lie.
VALUES = torch.arange(1024, dtype=torch.float32) * 3.25 + 12345.0


def _saved(tmp_path, obj, name="w.pt"):
    p = tmp_path / name
    torch.save(obj, p)
    return p


def _overwrite_tensor_bytes(path):
    """Zeroes VALUES' bytes in the file in place (same inode, same size)."""
    raw = path.read_bytes()
    at = raw.find(VALUES.numpy().tobytes())
    assert at > 0
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\0" * VALUES.numel() * 4)


def test_load_default_copies_so_later_writes_to_the_file_do_not_change_tensors(tmp_path):
    # torch.load's default (mmap=False) copies; ours did not, so an in-place
    # write changed accepted weights and a truncation killed the process
    # (SIGBUS) when a tensor was touched.
    p = _saved(tmp_path, {"w": VALUES})
    t = safeckpt.load(p)["w"]
    _overwrite_tensor_bytes(p)
    assert torch.equal(t, VALUES)
    with open(p, "wb"):
        pass  # what torch.save to the same path does first
    assert torch.equal(t, VALUES)


def test_load_mmap_true_is_zero_copy_as_torch_mmap(tmp_path):
    p = _saved(tmp_path, {"w": VALUES})
    t = safeckpt.load(p, mmap=True)["w"]
    _overwrite_tensor_bytes(p)  # another writer's change shows through, as with torch.load(mmap=True)
    assert float(t.sum()) == 0.0


def test_safe_open_tensors_do_not_depend_on_the_file(tmp_path):
    p = _saved(tmp_path, {"w": VALUES})
    with safeckpt.safe_open(p, framework="pt") as f:
        t = f.get_tensor("w")
    _overwrite_tensor_bytes(p)
    assert torch.equal(t, VALUES)


def test_strided_memoryview_reads_its_own_bytes():
    # memoryview(b)[::2] has no flat span at its pointer: the copy read past it.
    data = (CORPUS / "mlp_state_dict.pt").read_bytes()
    doubled = bytes(x for c in data for x in (c, 0))
    view = memoryview(doubled)[::2]
    assert not view.c_contiguous
    got = safeckpt.load(view)
    ref = safeckpt.load(data)
    assert got.keys() == ref.keys()
    for k in ref:
        assert torch.equal(got[k], ref[k])


def _u(s):
    b = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(b)) + b


def _zip(path, pkl, extra=()):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        for name, data in extra:
            z.writestr(name, data)
        z.writestr("archive/version", "3\n")


def test_scan_reports_a_global_with_a_lone_surrogate_instead_of_raising(tmp_path):
    # os.system, then STACK_GLOBAL 'x\ud800' 'y': the auditor raised
    # UnicodeDecodeError and reported nothing.
    p = tmp_path / "s.pt"
    _zip(p, b"\x80\x04cos\nsystem\n" + _u("echo hi") + b"\x85R0" + _u("x\ud800") + _u("y") + b"\x93.")
    rep = safeckpt.scan(p)
    assert rep.verdict == "unsafe"
    assert "os.system" in rep.globals
    assert "x\ud800.y" in rep.globals
    assert "os.system" in safeckpt.get_unsafe_globals_in_checkpoint(p)


def test_a_storage_location_with_a_lone_surrogate_is_a_checkpoint_error(tmp_path):
    # torch.load raises UnpicklingError; ours leaked UnicodeDecodeError.
    i32 = lambda n: b"J" + struct.pack("<i", n)  # noqa: E731
    pid = b"(" + _u("storage") + b"ctorch\nFloatStorage\n" + _u("0") + _u("cpu\ud800") + i32(1) + b"tQ"
    pkl = (b"\x80\x02}(" + _u("a") + b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + i32(0) + b"(" + i32(1) +
           b"t(" + i32(1) + b"t\x89ccollections\nOrderedDict\n)RtRu.")
    p = tmp_path / "loc.pt"
    _zip(p, pkl, [("archive/data/0", b"\0" * 4)])
    with pytest.raises(__import__("pickle").UnpicklingError):
        safeckpt.load(p)


def test_save_refuses_conjugate_and_negative_views(tmp_path):
    # Their storage holds the values before the view: written as is, they read back as other numbers.
    x = torch.tensor([1 + 2j, 3 - 4j])
    with pytest.raises(TypeError, match="resolve_conj"):
        safeckpt.save({"x": x.conj()}, tmp_path / "c.pt")
    with pytest.raises(TypeError, match="resolve_conj"):
        safeckpt.save({"y": torch._neg_view(torch.ones(3))}, tmp_path / "n.pt")
    safeckpt.save({"x": x.conj().resolve_conj()}, tmp_path / "ok.pt")
    assert torch.equal(safeckpt.load(tmp_path / "ok.pt")["x"], x.conj())
