"""Comparison helpers: safeckpt.load results vs torch.load and the corpus JSON."""
import collections
import hashlib
import math

import numpy as np
import torch

import safeckpt


def untyped(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


def element_bytes(t):
    """Row-major little-endian bytes of a tensor's elements (quantized: the
    integer representation; sparse: densified), as the corpus JSON hashes them."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).tobytes()
    if t.is_quantized:
        t = t.int_repr()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    c = t.detach().cpu().contiguous()
    n = c.numel() * c.element_size()
    if n == 0:
        return b""
    flat = torch.empty((0,), dtype=torch.uint8).set_(untyped(c))
    start = c.storage_offset() * c.element_size()
    return flat.numpy()[start:start + n].tobytes()


def storage_ptr(t):
    if isinstance(t, np.ndarray):
        base = t
        while isinstance(base.base, np.ndarray):
            base = base.base
        return id(base.base)
    return untyped(t).data_ptr()


def walk_pairs(a, b, path="root"):
    """Yields (path, a, b) for every pair of corresponding leaves; asserts the
    containers agree in type, length and keys."""
    stack = [(path, a, b)]
    seen = set()
    while stack:
        p, x, y = stack.pop()
        if (id(x), id(y)) in seen:
            continue
        seen.add((id(x), id(y)))
        if isinstance(x, torch.Tensor):
            yield p, x, y
            continue
        assert type(x) is type(y), f"{p}: {type(x)} vs {type(y)}"
        if isinstance(x, dict):
            assert list(x.keys()) == list(y.keys()), f"{p}: keys differ"
            for k in x:
                stack.append((f"{p}[{k!r}]", x[k], y[k]))
            if hasattr(x, "_metadata") or hasattr(y, "_metadata"):
                stack.append((f"{p}._metadata", getattr(x, "_metadata", None), getattr(y, "_metadata", None)))
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), f"{p}: length {len(x)} vs {len(y)}"
            for i, (u, v) in enumerate(zip(x, y)):
                stack.append((f"{p}[{i}]", u, v))
        elif isinstance(x, (set, frozenset)):
            assert x == y, p
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y), p
        else:
            assert x == y, f"{p}: {x!r} vs {y!r}"


def assert_same_as_torch(ref, ours):
    """ours (safeckpt.load) equals ref (torch.load): values, dtypes, shapes,
    strides, offsets, Parameter/requires_grad, and storage sharing both ways."""
    ref_groups, our_groups = collections.defaultdict(set), collections.defaultdict(set)
    n = 0
    for p, r, o in walk_pairs(ref, ours):
        n += 1
        assert isinstance(o, torch.Tensor), f"{p}: not a tensor: {type(o)}"
        assert type(r) is type(o), f"{p}: {type(r)} vs {type(o)}"
        assert r.dtype == o.dtype and r.layout == o.layout, p
        assert tuple(r.shape) == tuple(o.shape), p
        assert r.requires_grad == o.requires_grad, p
        if r.layout == torch.strided:
            assert r.stride() == o.stride(), p
            assert r.storage_offset() == o.storage_offset(), p
            if r.is_quantized:
                assert r.qscheme() == o.qscheme(), p
            ref_groups[storage_ptr(r)].add(p)
            our_groups[storage_ptr(o)].add(p)
        assert element_bytes(r) == element_bytes(o), f"{p}: values differ"
    assert sorted(map(sorted, ref_groups.values())) == sorted(map(sorted, our_groups.values())), \
        "storage sharing differs"
    return n


def _sha(b):
    return hashlib.sha256(b).hexdigest()


def _scalar(t):
    """A hashable JSON leaf as Python (set members, slice bounds)."""
    if t is None or isinstance(t, (bool, str)):
        return t
    (key, val), = t.items()
    if key == "$int":
        return int(val)
    if key == "$float":
        return float(val)
    if key == "$bytes":
        return bytes.fromhex(val)
    if key == "$tuple":
        return tuple(_scalar(x) for x in val)
    raise AssertionError(f"set member kind {key} not handled by the test")


def assert_matches_json(obj, tree):
    """obj equals the corpus typed tree (tests/data/corpus/README.md)."""
    groups_json, groups_ours = collections.defaultdict(set), collections.defaultdict(set)
    stack = [("root", obj, tree)]
    while stack:
        p, o, t = stack.pop()
        if t is None or isinstance(t, (bool, str)):
            assert o == t and type(o) is type(t), f"{p}: {o!r} vs {t!r}"
            continue
        (key, val), = [(k, v) for k, v in t.items() if k.startswith("$")]
        if key == "$int":
            assert type(o) is int and o == int(val), p
        elif key == "$float":
            assert type(o) is float and repr(o) == val, f"{p}: {o!r} vs {val}"
        elif key == "$complex":
            assert complex(o) == complex(float(val[0]), float(val[1])), p
        elif key in ("$bytes", "$bytearray"):
            assert bytes(o) == bytes.fromhex(val), p
        elif key in ("$list", "$tuple"):
            assert type(o) is (list if key == "$list" else tuple) and len(o) == len(val), p
            stack.extend((f"{p}[{i}]", x, y) for i, (x, y) in enumerate(zip(o, val)))
        elif key in ("$dict", "$odict"):
            assert isinstance(o, dict) and len(o) == len(val), p
            assert isinstance(o, collections.OrderedDict) == (key == "$odict"), p
            for (k, v), (ok, ov) in zip(val, o.items()):
                stack.append((f"{p}.key", ok, k))
                stack.append((f"{p}[{ok!r}]", ov, v))
            if "_metadata" in t:
                stack.append((f"{p}._metadata", getattr(o, "_metadata", None), t["_metadata"]))
        elif key == "$size":
            assert isinstance(o, torch.Size) and list(o) == val, p
        elif key == "$dtype":
            assert o == getattr(torch, val, val), p
        elif key == "$device":
            assert str(o) == val, p
        elif key == "$tensor":
            dtype = getattr(o, "torch_dtype", None) or str(o.dtype).replace("torch.", "")
            assert dtype == val["dtype"], f"{p}: {dtype} vs {val['dtype']}"
            assert list(o.shape) == val["shape"], p
            if isinstance(o, torch.Tensor):
                assert o.requires_grad == val["requires_grad"], p
                assert isinstance(o, torch.nn.Parameter) == val["parameter"], p
                assert str(o.layout).replace("torch.", "") == val["layout"], p
            if val["layout"] == "strided":
                stride = list(o.stride()) if isinstance(o, torch.Tensor) else [s // o.itemsize for s in o.strides]
                assert stride == val["stride"], p
                if isinstance(o, torch.Tensor):
                    assert o.storage_offset() == val["storage_offset"], p
                assert _sha(element_bytes(o)) == val["sha256"], f"{p}: values differ"
                if val.get("storage_nbytes"):
                    groups_json[val["storage_id"]].add(p)
                    groups_ours[storage_ptr(o)].add(p)
            else:
                assert _sha(element_bytes(o)) == val["dense_sha256"], f"{p}: dense values differ"
        elif key in ("$set", "$frozenset"):
            assert type(o) is (set if key == "$set" else frozenset), p
            assert o == {_scalar(x) for x in val}, p
        elif key == "$slice":
            assert type(o) is slice and (o.start, o.stop, o.step) == tuple(_scalar(x) for x in val), p
        elif key == "$object":
            assert isinstance(o, (safeckpt.SafeGlobalObject, safeckpt.GlobalRef)) and o.name == val, p
        else:
            raise AssertionError(f"{p}: JSON kind {key} not handled by the test")
    assert sorted(map(sorted, groups_json.values())) == sorted(map(sorted, groups_ours.values())), \
        "storage sharing differs"
