"""safeckpt.save: the value kinds the C++ writer supports (include/safeckpt/save.hpp).

Written with the C++ writer (atomic: temp file + fsync + rename), read back by
torch.load(weights_only=True) on PyTorch 1.13 and 2.x. Accepted values: None,
bool, int (any size), float, complex, str, bytes, bytearray, list, tuple, set,
dict, collections.OrderedDict (with its ``_metadata``), collections.Counter,
torch.Size, torch.dtype, torch.device, and dense strided torch tensors and
nn.Parameters of any device (saved with that device as their location; views
keep their storage, offset and strides; tensors over one storage share it in
the file). Refused (TypeError): anything else — quantized, sparse and meta
tensors, numpy arrays, arbitrary objects, frozenset and slice (not in torch's
default weights-only set). Memo sharing is kept: one Python object saved
twice is one value in the file; a list that contains itself stays a cycle.
"""
import collections
import os

from . import _safeckpt as _native
from ._errors import native_errors

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

_INT64 = (-(1 << 63), (1 << 63) - 1)


def _dtype_name(dt):
    return str(dt).rsplit(".", 1)[-1]


def _untyped(t):
    """The tensor's UntypedStorage (torch >= 2.0: untyped_storage(); 1.13: storage().untyped())."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage().untyped()


class _Writer:
    def __init__(self):
        self.b = _native._Builder()
        self.memo = {}  # id(obj) -> node
        self.keep = []  # objects whose id() is in memo
        self.storages = {}  # (device, data_ptr) -> storage index
        self.storage_dtype = {}  # (device, data_ptr) -> dtype name or "uint8" (mixed)

    def _plan_storages(self, root):
        # first pass, iterative: which dtype each storage is viewed as
        stack, seen = [root], set()
        while stack:
            o = stack.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            if _torch is not None and isinstance(o, _torch.Tensor):
                if o.layout == _torch.strided and not o.is_quantized and o.device.type != "meta":
                    key = (str(o.device), _untyped(o).data_ptr())
                    name = _dtype_name(o.dtype)
                    prev = self.storage_dtype.get(key)
                    self.storage_dtype[key] = name if prev in (None, name) else "uint8"
            elif isinstance(o, dict):
                stack.extend(o.keys())
                stack.extend(o.values())
                md = getattr(o, "_metadata", None)
                if md is not None:
                    stack.append(md)
            elif isinstance(o, (list, tuple, set, frozenset)):
                stack.extend(o)

    def _storage(self, t):
        dev = str(t.device)
        st = _untyped(t)
        key = (dev, st.data_ptr())
        idx = self.storages.get(key)
        if idx is None:
            flat = _torch.empty((0,), dtype=_torch.uint8, device=t.device).set_(st)
            data = flat.detach().cpu().contiguous().numpy()
            location = "cpu" if dev == "cpu" else dev
            idx = self.b.add_storage(self.storage_dtype.get(key, "uint8"), data, location)
            self.storages[key] = idx
        return idx

    def _tensor(self, t):
        if t.layout != _torch.strided or t.is_quantized or t.device.type == "meta":
            raise TypeError(f"safeckpt.save writes dense strided tensors only, not {t.layout} "
                            f"{'quantized ' if t.is_quantized else ''}{t.device.type} tensors")
        if type(t) not in (_torch.Tensor, _torch.nn.Parameter):
            raise TypeError(f"safeckpt.save does not write tensor subclass {type(t).__qualname__}")
        if t.is_conj() or t.is_neg():
            # Its storage holds the values before conjugation / negation: written
            # as is they would read back as other numbers (review 2026-12-06).
            raise TypeError("safeckpt.save does not write conjugate or negative views (x.conj(), "
                            "torch._neg_view); save x.resolve_conj().resolve_neg() instead")
        s = self._storage(t)
        offset = t.storage_offset()  # in elements of the tensor's dtype, as TensorInfo
        return self.b.add_tensor(_dtype_name(t.dtype), list(t.shape), list(t.stride()), offset, s,
                                 bool(t.requires_grad), isinstance(t, _torch.nn.Parameter))

    def node(self, root):
        self._plan_storages(root)
        b = self.b
        out = {}
        stack = [(root, False)]
        while stack:
            o, finish = stack.pop()
            oid = id(o)
            if not finish:
                if oid in self.memo:
                    continue
                leaf = self._leaf(o)
                if leaf is not None:
                    self.memo[oid] = leaf
                    self.keep.append(o)
                    continue
                kind, children = self._container(o)
                if kind in ("list", "dict", "ordered_dict", "counter"):
                    self.memo[oid] = b.container(kind, [])  # placeholder: filled at finish
                    self.keep.append(o)
                stack.append((o, True))
                for c in reversed(children):
                    if id(c) not in self.memo:
                        stack.append((c, False))
                continue
            kind, children = self._container(o)
            missing = [c for c in children if id(c) not in self.memo]
            if missing:
                raise TypeError("safeckpt.save: a cycle through a tuple/set cannot be written "
                                "(torch's weights-only unpickler cannot read it either)")
            items = [self.memo[id(c)] for c in children]
            if kind in ("list", "dict", "ordered_dict", "counter"):
                node = self.memo[oid]
                b.set_items(node, items)
                md = getattr(o, "_metadata", None) if kind == "ordered_dict" else None
                if md is not None:
                    b.set_attrs(node, b.container("dict", [b.str("_metadata"), self.memo[id(md)]]))
            else:
                if oid in self.memo:
                    continue
                self.memo[oid] = b.container(kind, items)
                self.keep.append(o)
        return self.memo[id(root)]

    def _leaf(self, o):
        b = self.b
        if o is None:
            return b.none()
        if isinstance(o, bool):
            return b.boolean(o)
        if isinstance(o, int):
            return b.integer(o) if _INT64[0] <= o <= _INT64[1] else b.big_integer(str(o))
        if isinstance(o, float):
            return b.floating(o)
        if isinstance(o, complex):
            return b.complex(o.real, o.imag)
        if isinstance(o, str):
            return b.str(o)
        if isinstance(o, bytes):
            return b.bytes(o, False)
        if isinstance(o, bytearray):
            return b.bytes(bytes(o), True)
        if _torch is not None:
            if isinstance(o, _torch.dtype):
                return b.dtype(_dtype_name(o))
            if isinstance(o, _torch.device):
                return b.device(str(o))
            if isinstance(o, _torch.Tensor):
                return self._tensor(o)
        return None

    def _container(self, o):
        if _torch is not None and isinstance(o, _torch.Size):
            return "size", list(o)
        if isinstance(o, collections.OrderedDict):
            kids = [x for kv in o.items() for x in kv]
            md = getattr(o, "_metadata", None)
            return "ordered_dict", kids + ([md] if md is not None else [])
        if isinstance(o, collections.Counter):
            return "counter", [x for kv in o.items() for x in kv]
        if type(o) is dict:
            return "dict", [x for kv in o.items() for x in kv]
        if type(o) is list:
            return "list", list(o)
        if type(o) is tuple:
            return "tuple", list(o)
        if type(o) is set:
            return "set", list(o)
        raise TypeError(f"safeckpt.save cannot write a {type(o).__module__}.{type(o).__qualname__} "
                        "(torch.load(weights_only=True) would refuse it)")


def save(obj, f, *, overwrite=True):
    """Writes ``obj`` like torch.save(obj, f) for the values listed in this
    module's docstring. f: a path (written atomically: temp file, fsync,
    rename; an existing file is replaced unless overwrite=False, then
    FileExistsError) or a binary file-like object with write(). Raises
    TypeError for a value it cannot write, OSError for I/O."""
    if _torch is None:
        raise ImportError("safeckpt.save needs torch")
    w = _Writer()
    # children of an OrderedDict's _metadata are saved too (in _container)
    root = w.node(obj)
    w.b.set_root(root)
    with native_errors():
        if isinstance(f, (str, os.PathLike)):
            w.b.save(os.fspath(f), overwrite)
        else:
            f.write(w.b.save_to_bytes())
