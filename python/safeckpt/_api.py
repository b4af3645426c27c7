"""load / safe_open / scan / get_unsafe_globals_in_checkpoint."""
import io
import os
import re

from . import _globals
from . import _safeckpt as _native
from . import _tree
from ._errors import UnsupportedCheckpointError, native_errors

# Cap on what load() reads from a file-like object into memory (bytes).
# A path is mapped instead and has no such cap (the C++ Limits apply).
MAX_FILELIKE_BYTES = 64 << 30

_DTYPE_NAMES = _native.dtype_names()
_NP_RAW = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_NP_NATIVE = {"float64": "float64", "float32": "float32", "float16": "float16", "int64": "int64",
              "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
              "complex128": "complex128", "complex64": "complex64", "uint16": "uint16", "uint32": "uint32",
              "uint64": "uint64"}

try:  # torch is optional: numpy arrays without it
    import torch as _torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    _torch = None

import numpy as _np


class RawBitsArray(_np.ndarray):
    """A numpy array holding the raw bits of a dtype numpy (or the installed
    torch) lacks: bfloat16 and complex32 as uint16/uint32, float8/float4
    kinds and bits* as uint8, quantized tensors as their integer
    representation (qint8 int8, quint8 uint8, qint32 int32, quint4x2/quint2x4
    packed uint8). ``torch_dtype`` names the real dtype ("bfloat16")."""

    torch_dtype = None

    def __array_finalize__(self, obj):
        self.torch_dtype = getattr(obj, "torch_dtype", None)


def _raw_np_dtype(name):
    if name in ("qint8",):
        return "int8"
    if name in ("qint32",):
        return "int32"
    return _NP_RAW[_native.dtype_size(name)]


def _torch_dtype(name):
    return getattr(_torch, name, None) if _torch is not None else None


def _parse_map_location(map_location):
    """None, "cpu" or "cuda[:N]" (str or torch.device)."""
    if map_location is None:
        return "cpu"
    if _torch is not None and isinstance(map_location, _torch.device):
        map_location = str(map_location)
    if isinstance(map_location, str):
        if map_location == "cpu" or re.fullmatch(r"cuda(:[0-9]+)?", map_location):
            return map_location
        raise ValueError(f"map_location {map_location!r}: safeckpt maps to 'cpu' or 'cuda[:N]' only")
    raise TypeError("map_location must be None, 'cpu', 'cuda[:N]' or a torch.device of those "
                    "(callables and dicts are not supported: nothing from the file picks code to run)")


def _untyped(t):
    """The tensor's UntypedStorage (torch >= 2.0: untyped_storage(); 1.13: storage().untyped())."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage().untyped()


class _Scalars:
    """Python values of the torch-specific nodes, for one framework."""

    def __init__(self, framework, names, tensors):
        self.pt = framework == "pt"
        self.names = names
        self.tensors = tensors

    def tensor_deps(self, index):
        t = self.tensors[index]
        deps = []
        if t["python_state"] >= 0:
            deps.append(t["python_state"])
        return deps

    def size(self, items):
        return _torch.Size(items) if self.pt else tuple(items)

    def dtype(self, i):
        name = _DTYPE_NAMES[i]
        d = _torch_dtype(name) if self.pt else None
        return d if d is not None else name

    def device(self, text):
        return _torch.device(text) if self.pt else text

    def layout(self, text):
        return getattr(_torch, text, text) if self.pt else text

    def qscheme(self, text):
        return getattr(_torch, text, text) if self.pt else text

    def global_value(self, name):
        obj = self.names.get(name)
        if obj is not None and not isinstance(obj, str):
            return obj
        return _tree.GlobalRef(name)


class _Materializer:
    """Makes tensors and storages of one checkpoint, each storage once (so
    views of one storage share memory, as torch.load's)."""

    def __init__(self, ck, framework, zero_copy, scalars):
        self.ck = ck
        self.framework = framework
        self.zero_copy = zero_copy
        self.scalars = scalars
        self.tinfo = ck.tensors()
        self.sinfo = ck.storages()
        self.device = ck.device
        self._storages = {}
        self._tensors = {}

    # ---- torch ----
    def _untyped(self, i):
        s = self._storages.get(i)
        if s is not None:
            return s
        nbytes = self.sinfo[i]["nbytes"]
        if self.device >= 0:
            from torch.utils import dlpack
            flat = dlpack.from_dlpack(self.ck.storage_dlpack(i)) if nbytes else _torch.empty(
                0, dtype=_torch.uint8, device=f"cuda:{self.device}")
        elif nbytes == 0:
            flat = _torch.empty(0, dtype=_torch.uint8)
        elif self.zero_copy and self.ck.storage_in_file(i):
            # a copy-on-write view of the mapped file: writes stay private
            flat = _torch.frombuffer(self.ck.storage_buffer(i, True), dtype=_torch.uint8)
        else:
            flat = _torch.empty(nbytes, dtype=_torch.uint8)
            self.ck.copy_storage_to(i, flat.data_ptr())
        s = _untyped(flat)
        self._storages[i] = s
        return s

    def _np_storage(self, i):
        s = self._storages.get(i)
        if s is None:
            if self.zero_copy and self.ck.storage_in_file(i):
                s = self.ck.storage_buffer(i, True)
            else:
                s = self.ck.storage_buffer(i, False)  # read-only view: numpy refuses writes
            self._storages[i] = s
        return s

    def _strided_torch(self, t, dt):
        dev = f"cuda:{self.device}" if self.device >= 0 else "cpu"
        st = self._untyped(t["storage"])
        if t["qscheme"] in ("per_tensor_affine", "per_tensor_symmetric"):
            base = _torch._empty_affine_quantized(t["shape"], scale=t["q_scale"], zero_point=t["q_zero_point"],
                                                  dtype=dt, device=dev)
        elif t["qscheme"] in ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"):
            scales = self.tensor(t["q_scales"])
            zps = self.tensor(t["q_zero_points"])
            base = _torch._empty_per_channel_affine_quantized(t["shape"], scales=scales, zero_points=zps,
                                                              axis=t["q_axis"], dtype=dt, device=dev)
        else:
            base = _torch.empty((0,), dtype=dt, device=dev)
        return base.set_(st, t["storage_offset"], t["shape"], t["stride"])

    def _torch_tensor(self, t):
        name = t["dtype"]
        dt = _torch_dtype(name)
        if dt is None:
            return None  # the installed torch lacks it: raw bits (numpy)
        layout = t["layout"]
        if t["is_meta"]:
            r = _torch.empty_strided(t["shape"], t["stride"], dtype=dt, device="meta")
        elif layout == "sparse_coo":
            idx, vals = (self.tensor(p) for p in t["sparse_parts"])
            try:
                r = _torch.sparse_coo_tensor(idx, vals, t["shape"], is_coalesced=t["coalesced"])
            except TypeError:  # torch < 2.1 has no is_coalesced
                r = _torch.sparse_coo_tensor(idx, vals, t["shape"])
                if t["coalesced"]:
                    r = r._coalesced_(True)
        elif layout != "strided":
            ci, pi, vals = (self.tensor(p) for p in t["sparse_parts"])
            r = _torch.sparse_compressed_tensor(ci, pi, vals, t["shape"], layout=getattr(_torch, layout))
        else:
            r = self._strided_torch(t, dt)
        if t["conj"]:
            _torch._C._set_conj(r, True)
        if t["neg"]:
            _torch._C._set_neg(r, True)
        if t["is_parameter"]:
            r = _torch.nn.Parameter(r, requires_grad=t["requires_grad"])
        elif t["requires_grad"]:
            r.requires_grad_(True)
        sub = t["subclass"]
        if sub:
            cls = self.scalars.names.get(sub)
            if isinstance(cls, type):
                r = r.as_subclass(cls)
        return r

    def _np_tensor(self, t):
        name = t["dtype"]
        if t["layout"] != "strided" or t["is_meta"]:
            raise UnsupportedCheckpointError(f"a {t['layout']}{' meta' if t['is_meta'] else ''} tensor needs "
                                             "torch (framework='pt')", code="unsupported")
        raw = name not in _NP_NATIVE
        npdt = _np.dtype(_raw_np_dtype(name) if raw else _NP_NATIVE[name])
        buf = self._np_storage(t["storage"])
        item = npdt.itemsize
        arr = _np.ndarray(tuple(t["shape"]), dtype=npdt, buffer=buf if len(buf) else b"",
                          offset=t["storage_offset"] * item if len(buf) else 0,
                          strides=tuple(s * item for s in t["stride"]))
        if raw:
            arr = arr.view(RawBitsArray)
            arr.torch_dtype = name
        return arr

    def tensor(self, index, _out=None):
        r = self._tensors.get(index)
        if r is not None:
            return r
        t = self.tinfo[index]
        r = self._torch_tensor(t) if self.framework == "pt" else None
        if r is None:
            r = self._np_tensor(t)
        self._tensors[index] = r
        if _out is not None and t["python_state"] >= 0:
            _apply_state(r, _out[t["python_state"]])
        return r

    def storage(self, index):
        if self.framework != "pt":
            return _np.frombuffer(self._np_storage(index), dtype=_np.uint8)
        st = self._untyped(index)
        dt = _torch_dtype(self.sinfo[index]["dtype"])
        try:
            return _torch.storage.TypedStorage(wrap_storage=st, dtype=dt, _internal=True)
        except TypeError:  # torch < 2.0
            return _torch.storage.TypedStorage(wrap_storage=st, dtype=dt)


def _apply_state(obj, state):
    """Parameter / tensor-subclass Python state: a dict of attributes, or
    (dict, slots dict), as torch._utils._set_obj_state applies it."""
    if isinstance(state, tuple) and len(state) == 2:
        dict_state, slots = state
    else:
        dict_state, slots = state, None
    for d in (dict_state, slots):
        if isinstance(d, dict):
            for k, v in d.items():
                if isinstance(k, str):
                    setattr(obj, k, v)


def _framework(framework):
    if framework is None:
        return "pt" if _torch is not None else "np"
    if framework in ("pt", "torch"):
        if _torch is None:
            raise ImportError("framework='pt' needs torch")
        return "pt"
    if framework in ("np", "numpy"):
        return "np"
    raise ValueError(f"framework must be 'pt' or 'np', not {framework!r}")


def _read_capped(f):
    """Everything f.read() gives, in chunks, refusing more than
    MAX_FILELIKE_BYTES (read once more than the cap to tell)."""
    cap = MAX_FILELIKE_BYTES
    buf = bytearray()
    while True:
        chunk = f.read(min(64 << 20, cap + 1 - len(buf)))
        if not isinstance(chunk, (bytes, bytearray)):
            raise TypeError("f.read() must return bytes (open the file in binary mode)")
        if not chunk:
            return buf
        buf += chunk
        if len(buf) > cap:
            raise MemoryError(f"file-like object larger than safeckpt.MAX_FILELIKE_BYTES ({cap}); "
                              "pass a path (mapped, not read)")


def _open_native(f, allow_pairs, map_location):
    with native_errors():
        if isinstance(f, (str, os.PathLike)):
            path = os.fspath(f)
            if map_location.startswith("cuda"):
                if not _native.has_cuda:
                    raise RuntimeError("map_location='cuda': this safeckpt module was built without CUDA "
                                       "(build with -DSAFECKPT_CUDA=ON and nvcc), so it cannot load to the GPU")
                return _native.load_cuda(path, allow_pairs, map_location)
            return _native.load_path(path, allow_pairs)
        if map_location.startswith("cuda"):
            raise ValueError("map_location='cuda' needs a path (the GPU path reads the file directly)")
        if isinstance(f, (bytes, bytearray, memoryview)):
            return _native.load_bytes(f, allow_pairs)
        read = getattr(f, "read", None)
        if read is None:
            raise TypeError("f must be a path or a binary file-like object with read()")
        return _native.load_bytes(_read_capped(f), allow_pairs)


def load(f, map_location=None, weights_only=True, mmap=None, *, allow=None, framework=None):
    """Loads a checkpoint like ``torch.load(f, weights_only=True)``, without
    running anything from it.

    f: a path (mapped), or bytes / a binary file-like object (read into
    memory, at most MAX_FILELIKE_BYTES). Any format safeckpt reads, by
    content: torch.save zip, legacy (< 1.6), bare pickle, safetensors (an
    OrderedDict name -> tensor), sharded safetensors index.
    map_location: None / "cpu", or "cuda[:N]" (a path only; the C++ GPU
    loader streams storages to the device and hands them to torch through
    DLPack, no host copy of the tensor bytes; needs a module built with CUDA,
    else RuntimeError).
    weights_only: must be True (or None): safeckpt never executes a file;
    False raises ValueError.
    mmap: None or True: tensors are zero-copy views of a copy-on-write
    private mapping of the file (writes stay in this process); False: each
    storage is copied into memory the process owns. Deflated and
    byte-swapped records are always copies.
    allow: extra safe globals for this call only (as add_safe_globals).
    framework: "pt" (torch.Tensor), "np" (numpy arrays; dtypes numpy lacks
    come back as RawBitsArray), or None: "pt" when torch imports.

    Raises UnsafeGlobalError (disallowed global/operation; the message names
    them), MalformedCheckpointError, UnsupportedCheckpointError (all
    pickle.UnpicklingError), OSError, ValueError, TypeError.
    """
    if weights_only is False:
        raise ValueError("safeckpt.load(weights_only=False) is refused: safeckpt never executes code from a file. "
                         "Allow the globals the file needs with allow=[...] or safeckpt.add_safe_globals([...]) "
                         "(only for data classes you trust), or use torch.load(weights_only=False) yourself "
                         "on a file you fully trust.")
    fw = _framework(framework)
    loc = _parse_map_location(map_location)
    if loc.startswith("cuda") and fw != "pt":
        raise ValueError("map_location='cuda' needs framework='pt' (torch)")
    pairs, names = _globals.current(allow)
    ck = _open_native(f, pairs, loc)
    return _materialize(ck, fw, mmap is not False, names)


def _materialize(ck, fw, zero_copy, names):
    with native_errors():
        nodes = ck.nodes()
        tensors = ck.tensors()
    scalars = _Scalars(fw, names, tensors)
    m = _Materializer(ck, fw, zero_copy, scalars)
    with native_errors():
        return _tree.build(nodes, ck.root, m.tensor, m.storage, scalars)


def get_unsafe_globals_in_checkpoint(f):
    """Globals the file imports that are not safe now (PyTorch's default set
    plus add_safe_globals), sorted, without loading or running anything
    (torch.serialization.get_unsafe_globals_in_checkpoint; that one reads zip
    files only, this one every format the scanner reads). Hard-blocked
    globals are always listed."""
    pairs, _ = _globals.current()
    path, tmp = _as_path(f)
    try:
        with native_errors():
            rep = _native.scan_path(path, pairs)
    finally:
        if tmp:
            os.unlink(tmp)
    return sorted({name for (etype, name, allowed, _m, _o) in rep["events"]
                   if etype == "import" and not allowed and not name.startswith("<")})


def _as_path(f):
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f), None
    import tempfile
    data = _read_capped(f) if hasattr(f, "read") else bytes(f)
    fd, tmp = tempfile.mkstemp(prefix="safeckpt-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return tmp, tmp


class Report:
    """What safeckpt.scan found (the JSON report of `safeckpt scan`, as
    attributes): ``verdict`` ("clean", "unsafe", "incomplete",
    "unscannable", "not_model", "error"), ``clean``, ``format``, ``complete``,
    ``findings`` (dicts: rule, severity, member, offset, opcode, global,
    category, message, why), ``events`` ((type, name, allowed, member,
    offset) tuples: every import/call), ``loader`` (what safeckpt.load said)."""

    def __init__(self, d):
        self.path = d["path"]
        self.size = d["size"]
        self.format = d["format"]
        self.verdict = d["verdict"]
        self.complete = d["complete"]
        self.loader = d["loader"]
        self.findings = d["findings"]
        self.events = d["events"]

    @property
    def clean(self):
        return self.verdict == "clean"

    @property
    def globals(self):
        """Every global imported, sorted."""
        return sorted({e[1] for e in self.events if e[0] == "import"})

    def __repr__(self):
        return f"safeckpt.Report({self.path!r}, verdict={self.verdict!r}, findings={len(self.findings)})"


def scan(path, *, allow=None):
    """Audits a file without running it (``safeckpt scan``): a Report.
    Clean exactly when safeckpt.load accepts the file and nothing else was
    found in any pickle it holds."""
    pairs, _ = _globals.current(allow)
    with native_errors():
        return Report(_native.scan_path(os.fspath(path), pairs))


class safe_open:
    """safetensors-style lazy access to .pt and .safetensors files alike:

        with safeckpt.safe_open("model.pt", framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)

    The file is mapped and its metadata validated once (the pickle is parsed
    with every safeckpt.load rule); a tensor's bytes are touched only when
    get_tensor() asks for it (zero-copy, copy-on-write). keys(): the
    state_dict names of every tensor (nested dicts joined with '.').
    metadata(): safetensors' __metadata__ dict, or None (always None for
    PyTorch files). device: "cpu" only (use load(map_location="cuda") for the
    GPU)."""

    def __init__(self, filename, framework="pt", device="cpu", *, allow=None):
        if device not in ("cpu", None) and not (_torch is not None and isinstance(device, _torch.device)
                                                 and device.type == "cpu"):
            raise ValueError("safeckpt.safe_open reads to 'cpu'; use safeckpt.load(path, map_location='cuda')")
        self._fw = _framework(framework)
        pairs, names = _globals.current(allow)
        self._ck = _open_native(filename, pairs, "cpu")
        with native_errors():
            self._names = dict(self._ck.named_tensors())
            tensors = self._ck.tensors()
        self._m = _Materializer(self._ck, self._fw, True, _Scalars(self._fw, names, tensors))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def keys(self):
        return list(self._names)

    def metadata(self):
        with native_errors():
            return self._ck.safetensors_metadata()

    def get_tensor(self, name):
        try:
            index = self._names[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r}") from None
        with native_errors():
            return self._m.tensor(index)

    def __contains__(self, name):
        return name in self._names

    def __len__(self):
        return len(self._names)
