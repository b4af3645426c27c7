"""The Python API under hostile use (review 2026-12-06): files changed after
loading, strided buffers, strings with lone surrogates from the file, views
that save would write wrongly. Each case failed (or crashed) before its fix."""
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

import safeckpt
from conftest import CORPUS

# A value no other byte run of the file repeats: where the tensor's bytes lie.
# 2 MiB: files up to 1 MiB are read into memory, not mapped (mapped_file.cpp).
VALUES = torch.arange(512 * 1024, dtype=torch.float32) * 0.5 + 12345.0


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


def test_numpy_arrays_and_raw_bits_are_copies_too(tmp_path):
    # framework="np", and dtypes torch 1.13 lacks (uint16 comes back through
    # numpy): these were views of the mapping whatever mmap said.
    p = _saved(tmp_path, {"w": VALUES})
    a = safeckpt.load(p, framework="np")["w"]
    _overwrite_tensor_bytes(p)
    assert (a == VALUES.numpy()).all()
    with safeckpt.safe_open(_saved(tmp_path, {"w": VALUES}, "v.pt"), framework="np") as f:
        b = f.get_tensor("w")
    _overwrite_tensor_bytes(tmp_path / "v.pt")
    assert (b == VALUES.numpy()).all()


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


def _safetensors_file(path):
    """A safetensors file holding VALUES as "w" (written here: 2 MiB, so mapped)."""
    data = VALUES.numpy().tobytes()
    header = ('{"w":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]}}' % (VALUES.numel(), len(data))).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
@pytest.mark.parametrize("framework", ["pt", "np"])
def test_safe_open_on_a_file_truncated_while_open_is_an_oserror_not_sigbus(tmp_path, kind, framework):
    # safe_open keeps the file mapped; get_tensor copied out of the mapping, so
    # a truncation in between (torch.save to the same path truncates first)
    # killed the process with SIGBUS. In a child process: that is what died.
    p = _saved(tmp_path, {"w": VALUES}) if kind == "pt" else _safetensors_file(tmp_path / "w.safetensors")
    code = (
        "import os, sys, safeckpt\n"
        f"f = safeckpt.safe_open({str(p)!r}, framework={framework!r})\n"
        f"os.truncate({str(p)!r}, 4096)\n"
        "try:\n"
        "    f.get_tensor('w')\n"
        "except OSError as e:\n"
        "    print('OSError:', e)\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "truncated" in r.stdout and "storage" in r.stdout, r.stdout


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


def test_scan_reports_a_record_name_that_is_not_utf8(tmp_path):
    # Zip names are raw bytes: `a\xff/data.pkl` made scan() raise
    # UnicodeDecodeError instead of reporting the os.system call inside.
    p = tmp_path / "n.pt"
    _zip(p, b"\x80\x02cos\nsystem\n" + _u("echo hi") + b"\x85R.")
    raw = p.read_bytes()
    p.write_bytes(raw.replace(b"archive/", b"archiv\xff/"))  # same length: offsets hold
    rep = safeckpt.scan(p)
    assert rep.verdict == "unsafe"
    assert "os.system" in rep.globals
    with pytest.raises(__import__("pickle").UnpicklingError):
        safeckpt.load(p)


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


def _v7_tar_in_legacy_pickle(path):
    """A legacy torch.save file (magic, protocol, sys_info, one FloatStorage
    tensor) that is also an old V7 tar: the tar header's bytes 100..512 sit in
    a string the protocol pickle pushes and pops, and the tar's `storages`
    member (an os.system pickle) lies in the tensor's raw storage bytes.
    Construction by the 2026-12-06 review (mk_p1.py); the command is `true`."""
    mal = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", 4) + b"true\x85R."

    def tar_header(name, size):
        h = bytearray(512)
        h[0:len(name)] = name
        h[100:108] = b"0000644\x00"
        h[108:116] = b"0000000\x00"
        h[116:124] = b"0000000\x00"
        h[124:136] = b"%011o\x00" % size
        h[136:148] = b"00000000000\x00"
        h[156:157] = b"0"
        h[148:156] = b" " * 8
        h[148:156] = b"%06o\x00 " % sum(h)
        return bytes(h)

    magic = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19."
    sysinfo = (b"\x80\x02}q\x00(X\x10\x00\x00\x00protocol_versionq\x01M\xe9\x03X\r\x00\x00\x00little_endianq\x02"
               b"\x88X\n\x00\x00\x00type_sizesq\x03}q\x04(X\x05\x00\x00\x00shortq\x05K\x02X\x03\x00\x00\x00intq"
               b"\x06K\x04X\x04\x00\x00\x00longq\x07K\x04uu.")

    def head(first_size):
        string = b"A" * (100 - (len(magic) + 7)) + tar_header(b"x", first_size)[100:512]
        return magic + b"\x80\x02X" + struct.pack("<I", len(string)) + string + b"0M\xe9\x03." + sysinfo

    def main_pickle(pad_len, n):
        p = b"\x80\x02X" + struct.pack("<I", pad_len) + b"p" * pad_len + b"0"
        p += (b"ctorch._utils\n_rebuild_tensor_v2\nq\x04((X\x07\x00\x00\x00storageq\x05ctorch\nFloatStorage\nq\x06"
              b"X\x01\x00\x00\x000q\x07X\x03\x00\x00\x00cpuq\x08")
        p += (b"J" + struct.pack("<i", n) + b"Ntq\tQK\x00J" + struct.pack("<i", n) +
              b"\x85q\nK\x01\x85q\x0b\x89ccollections\nOrderedDict\nq\x0c)Rq\rtq\x0eRq\x0f.")
        return p

    keys = b"\x80\x02]q\x00X\x01\x00\x00\x000q\x01a."
    payload = tar_header(b"storages", len(mal)) + mal
    payload += b"\x00" * (-len(payload) % 512) + b"\x00" * 1024
    n = len(payload) // 4
    for pad_len in range(1, 2000):
        pre = len(head(0)) + len(main_pickle(pad_len, n)) + len(keys) + 8
        if pre % 512 == 0:
            break
    data = bytearray(head(pre - 512) + main_pickle(pad_len, n) + keys + struct.pack("<Q", n) + payload)
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\x00 " % sum(data[0:512])
    path.write_bytes(bytes(data))


def test_a_legacy_pickle_that_is_also_a_v7_tar_is_judged_as_the_tar_torch_reads(tmp_path):
    import tarfile
    p = tmp_path / "poly.pt"
    _v7_tar_in_legacy_pickle(p)
    # What torch.load's _legacy_load tries first on a file that is not a zip:
    with tarfile.open(p, "r:") as tar:
        assert "storages" in tar.getnames()
    rep = safeckpt.scan(p)
    assert rep.format == "legacy_tar"
    assert rep.verdict == "unsafe"
    assert "os.system" in rep.globals
    with pytest.raises(__import__("pickle").UnpicklingError):
        safeckpt.load(p)


def test_a_path_that_is_not_utf8_loads_and_scans(tmp_path):
    # A name the OS allows but that is not UTF-8: torch.load opens it; ours
    # raised TypeError at the C++ boundary, so an audit loop stopped there.
    import os
    p = os.path.join(os.fsencode(tmp_path), b"w\xff.pt")
    with open(p, "wb") as out:
        out.write((CORPUS / "mlp_state_dict.pt").read_bytes())
    name = os.fsdecode(p)  # a str with a surrogate escape, as os.listdir gives it
    ref = safeckpt.load(CORPUS / "mlp_state_dict.pt")
    got = safeckpt.load(name)
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    rep = safeckpt.scan(name)
    assert rep.verdict == "clean"
    assert os.fsencode(rep.path) == p
    assert safeckpt.get_unsafe_globals_in_checkpoint(name) == []
