"""safeckpt.load_dcp on the DCP directories PyTorch 2.11 wrote (tests/data/dcp-2.11).

References are PyTorch's: full.safetensors (DTensor.full_tensor() of every tensor, read
here with json + numpy, not with safeckpt), expected.json (non-tensor values, DCP's
flattening mapping); the resharded slices are torch.chunk of the full tensors (the split
DTensor's Shard uses), computed by the installed torch.
"""
import json
import os
import pickle
import shutil
import struct

import numpy as np
import pytest
import torch

import safeckpt
from conftest import DATA

DCP = DATA / "dcp-2.11"
CASES = ["placements-ws2", "placements-ws3", "placements-ws4", "uneven-ws4", "mesh2d-ws4", "fsdp2-adamw-ws2"]
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def full_tensors(case):
    """full.safetensors parsed by hand: 8-byte header length, JSON header, data."""
    raw = (DCP / case / "full.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = _ST_DTYPES[info["dtype"]]
        buf = bytearray(data[b:e])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dt).reshape(info["shape"])
    return out


def expected(case):
    return json.loads((DCP / case / "expected.json").read_text())


def as_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def get_path(tree, path):
    for k in path:
        tree = tree[int(k)] if isinstance(tree, list) else tree[k]
    return tree


def jsonable(v):
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return {"repr": repr(v)}
    return v


@pytest.mark.parametrize("case", CASES)
def test_whole_model_equals_pytorch(case):
    sd = safeckpt.load_dcp(DCP / case / "dcp")
    full = full_tensors(case)
    exp = expected(case)
    n_tensors = n_values = 0
    for fqn, item in exp["items"].items():
        got = get_path(sd, exp["mapping"][fqn])
        if item["kind"] == "bytes":
            assert jsonable(got) == item["value"], fqn
            n_values += 1
        else:
            assert isinstance(got, torch.Tensor), fqn
            assert got.dtype == full[fqn].dtype and got.shape == full[fqn].shape, fqn
            assert as_bytes(got) == as_bytes(full[fqn]), fqn
            n_tensors += 1
    assert n_tensors == len(full)
    assert n_tensors > 0


@pytest.mark.parametrize("case", ["placements-ws3", "uneven-ws4", "fsdp2-adamw-ws2"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_resharded_equals_torch_chunk(case, world_size):
    full = full_tensors(case)
    for shard_dim in (0, 1, None):
        for rank in range(world_size):
            got = safeckpt.load_dcp(DCP / case / "dcp", rank=rank, world_size=world_size, shard_dim=shard_dim)
            assert set(got) == set(full)
            for fqn, t in full.items():
                if shard_dim is None or t.dim() <= shard_dim:
                    want = t
                else:
                    pieces = torch.chunk(t, world_size, dim=shard_dim) if t.shape[shard_dim] else ()
                    if rank < len(pieces):
                        want = pieces[rank]
                    else:
                        shape = list(t.shape)
                        shape[shard_dim] = 0
                        want = t.new_empty(shape)
                assert got[fqn].dtype == want.dtype, (fqn, rank)
                assert list(got[fqn].shape) == list(want.shape), (fqn, rank, shard_dim)
                assert as_bytes(got[fqn]) == as_bytes(want), (fqn, rank, shard_dim)


def test_boxes_and_numpy():
    full = full_tensors("mesh2d-ws4")
    fqn, t = next((k, v) for k, v in full.items() if v.dim() == 2 and v.shape[0] > 1 and v.shape[1] > 1)
    got = safeckpt.load_dcp(DCP / "mesh2d-ws4" / "dcp", boxes={fqn: ((1, 1), (t.shape[0] - 1, t.shape[1] - 1))})
    assert list(got) == [fqn]
    assert as_bytes(got[fqn]) == as_bytes(t[1:, 1:])
    got = safeckpt.load_dcp(DCP / "placements-ws2" / "dcp", rank=1, world_size=2, framework="np")
    a = got["model.a"]
    assert isinstance(a, np.ndarray)
    assert a.tobytes() == as_bytes(torch.chunk(full_tensors("placements-ws2")["model.a"], 2, dim=0)[1])
    assert got["model.b"].torch_dtype == "bfloat16"  # numpy lacks it: raw bits


def test_refusals(tmp_path):
    src = DCP / "placements-ws2" / "dcp"
    with pytest.raises(ValueError):
        safeckpt.load_dcp(src, rank=2, world_size=2)
    with pytest.raises(ValueError):
        safeckpt.load_dcp(src, boxes={"model.a": ((0, 0), (13, 5))})  # past the end of [12, 5]
    with pytest.raises(ValueError):
        safeckpt.load_dcp(src, boxes={"nope": ((0,), (1,))})
    # A .metadata naming a foreign global: refused, nothing called.
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    (bad / ".metadata").write_bytes(pickle.dumps({"x": os.system}, protocol=2))
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load_dcp(bad, rank=0, world_size=2)
    # A truncated data file: a clear error naming it.
    cut = tmp_path / "cut"
    shutil.copytree(src, cut)
    data = cut / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(safeckpt.MalformedCheckpointError, match="__0_0.distcp"):
        safeckpt.load_dcp(cut, rank=0, world_size=1)


DTENSOR_GLOBALS = [
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Partial",
]


def test_dtensor_rank_file_is_not_passed_off_as_whole_tensors():
    # ranks/rank0.pt: torch.save of one rank's DTensor state_dict (PyTorch 2.11, gen_dcp.py).
    # With the DTensor classes allowed the file parses, but its tensors are local shards:
    # safeckpt.load refuses to hand them out as plain tensors.
    path = DATA / "dcp-2.11" / "placements-ws2" / "ranks" / "rank0.pt"
    with pytest.raises(safeckpt.UnsupportedCheckpointError, match="local shard"):
        safeckpt.load(path, allow=DTENSOR_GLOBALS)
    with pytest.raises(safeckpt.UnsafeGlobalError, match="is part of a DTensor"):
        safeckpt.load(path)


def test_scan_reports_a_dcp_directory_as_one_checkpoint(tmp_path):
    """safeckpt.scan(DIR) is `safeckpt scan DIR`: the DCP reader decides; a .metadata that
    imports os.system (PyTorch unpickles it with weights_only=False) is unsafe."""
    rep = safeckpt.scan(DCP / "placements-ws2" / "dcp")
    assert rep.format == "dcp_directory"
    assert rep.verdict == "clean"
    bad = tmp_path / "dcp"
    shutil.copytree(DCP / "placements-ws2" / "dcp", bad)
    shutil.copyfile(DATA / "corpus" / "torch-2.11" / "mal_raw_pickle.pkl", bad / ".metadata")
    rep = safeckpt.scan(bad)
    assert rep.verdict == "unsafe"
    assert "os.system" in rep.globals
    # A pickle beside an intact checkpoint is part of what scan(DIR) reports, as with the CLI.
    stray = tmp_path / "stray"
    shutil.copytree(DCP / "placements-ws2" / "dcp", stray)
    shutil.copyfile(DATA / "corpus" / "torch-2.11" / "mal_os_system.pt", stray / "evil.pt")
    rep = safeckpt.scan(stray)
    assert rep.format == "dcp_directory"
    assert rep.verdict == "unsafe"
    assert any(f["member"].startswith("evil.pt") for f in rep.findings)
    assert "os.system" in rep.globals


def _dcp_metadata(tensors):
    """A hand-written DCP .metadata pickle, the shape PyTorch 2.11 writes (a port
    of tests/support/dcp_metadata.hpp by the 2026-12-06 review). tensors: a list
    of (fqn, shape, [(offsets, sizes, file, byte offset, byte length)])."""
    md = b"torch.distributed.checkpoint.metadata"
    out = bytearray(b"\x80\x02")

    def glob(m, n):
        out.extend(b"c" + m + b"\n" + n + b"\n")

    def text(v):
        v = v.encode()
        out.extend(b"X" + struct.pack("<I", len(v)) + v)

    def integer(v):
        out.extend(b"J" + struct.pack("<i", v))

    def size(v):
        glob(b"torch", b"Size")
        out.extend(b"(")
        for x in v:
            integer(x)
        out.extend(b"t\x85R")

    def dataclass(mod, cls, fields):
        glob(mod, cls)
        out.extend(b")\x81}(")
        fields()
        out.extend(b"ub")

    def props():
        glob(md, b"TensorProperties")
        out.extend(b")\x81(")
        glob(b"torch", b"float32")
        glob(b"torch.serialization", b"_get_layout")
        text("torch.strided")
        out.extend(b"\x85R\x89")
        glob(md, b"_MEM_FORMAT_ENCODING")
        integer(0)
        out.extend(b"\x85R\x89tb")

    def top():
        text("state_dict_metadata")
        out.extend(b"}(")
        for fqn, shape, chunks in tensors:
            text(fqn)

            def tsm(shape=shape, chunks=chunks):
                text("properties")
                props()
                text("size")
                size(shape)
                text("chunks")
                out.extend(b"](")
                for c in chunks:
                    dataclass(md, b"ChunkStorageMetadata",
                              lambda c=c: (text("offsets"), size(c[0]), text("sizes"), size(c[1])))
                out.extend(b"e")
            dataclass(md, b"TensorStorageMetadata", tsm)
        out.extend(b"u")
        text("storage_data")
        out.extend(b"}(")
        for fqn, _, chunks in tensors:
            for c in chunks:
                dataclass(md, b"MetadataIndex",
                          lambda fqn=fqn, c=c: (text("fqn"), text(fqn), text("offset"), size(c[0]), text("index"),
                                                out.extend(b"N")))
                dataclass(b"torch.distributed.checkpoint.filesystem", b"_StorageInfo",
                          lambda c=c: (text("relative_path"), text(c[2]), text("offset"), integer(c[3]),
                                       text("length"), integer(c[4])))
        out.extend(b"u")
    dataclass(md, b"Metadata", top)
    out.extend(b".")
    return bytes(out)


def test_scan_reads_a_data_file_whole_as_torch_load_would(tmp_path):
    """Review 2026-12-06: a data file of two items (a torch.save zip, then a legacy
    torch.save of a float tensor) whose last zip end record lies in the second
    item's raw storage and points, with absolute offsets, at an os.system
    data.pkl also inside it. Every item loads and scans clean on its own;
    torch.load of the file reads that hidden archive."""
    mal = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", 4) + b"true\x85R."
    zb = __import__("io").BytesIO()
    with __import__("zipfile").ZipFile(zb, "w") as z:
        z.writestr("archive/data.pkl", mal)
        z.writestr("archive/version", "3\n")
    hidden = zb.getvalue()

    def shifted(zipbytes, q):  # every offset of the zip moved by q: absolute in the whole file
        b = bytearray(zipbytes)
        e = b.rfind(b"PK\x05\x06")
        n = struct.unpack_from("<H", b, e + 10)[0]
        cdo = struct.unpack_from("<I", b, e + 16)[0]
        p = cdo
        for _ in range(n):
            lho = struct.unpack_from("<I", b, p + 42)[0]
            struct.pack_into("<I", b, p + 42, lho + q)
            nl, xl, cl = struct.unpack_from("<HHH", b, p + 28)
            p += 46 + nl + xl + cl
        struct.pack_into("<I", b, e + 16, cdo + q)
        return bytes(b)

    def torch_save(t, legacy):
        bio = __import__("io").BytesIO()
        torch.save(t, bio, _use_new_zipfile_serialization=not legacy)
        return bio.getvalue()

    first = torch_save(torch.arange(12, dtype=torch.float32).reshape(4, 3).clone(), False)
    pad = -len(hidden) % 4
    as_floats = lambda raw: torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()  # noqa: E731
    probe = torch_save(as_floats(b"\0" * pad + b"\xee" * len(hidden)), True)
    at = len(first) + probe.find(b"\xee" * len(hidden))
    second = torch_save(as_floats(b"\0" * pad + shifted(hidden, at)), True)
    assert len(second) == len(probe)
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(first + second)
    nv = (pad + len(hidden)) // 4
    (d / ".metadata").write_bytes(_dcp_metadata([
        ("w", [4, 3], [([0, 0], [4, 3], "__0_0.distcp", 0, len(first))]),
        ("v", [nv], [([0], [nv], "__0_0.distcp", len(first), len(second))])]))
    # The reader accepts it: each item is a tensor of the metadata's dtype and shape.
    assert set(safeckpt.load_dcp(d)) == {"w", "v"}
    rep = safeckpt.scan(d)
    assert rep.verdict == "unsafe"
    assert "os.system" in rep.globals or any("os.system" in f["global"] for f in rep.findings)
    assert any(f["member"].startswith("__0_0.distcp (read whole)") for f in rep.findings)
    # An intact PyTorch directory with several items per file gets no such finding.
    clean = safeckpt.scan(DCP / "placements-ws2" / "dcp")
    assert clean.verdict == "clean"
