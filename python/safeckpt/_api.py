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

_UNTYPED_STORAGE = getattr(_torch, "UntypedStorage", None) if _torch is not None else None


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


_TARGET_RE = re.compile(r"cpu|meta|cuda(:[0-9]+)?")


def _cuda_unavailable_message():
    return ("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. "
            "If you are running on a CPU-only machine, please use safeckpt.load with "
            "map_location=torch.device('cpu') to map your storages to the CPU.")


def _resolve_cuda(target):
    """"cuda" / "cuda:N" -> "cuda:N" on a device torch sees, as torch's
    validate_cuda_device checks it (RuntimeError otherwise)."""
    if _torch is None or not _torch.cuda.is_available():
        raise RuntimeError(_cuda_unavailable_message())
    index = _torch.cuda.current_device() if target == "cuda" else int(target[5:])
    count = _torch.cuda.device_count()
    if index >= count:
        raise RuntimeError(f"Attempting to deserialize object on CUDA device {index} but "
                           f"torch.cuda.device_count() is {count}. Please use safeckpt.load with "
                           "map_location to map your storages to an existing device.")
    return f"cuda:{index}"


def _location_text(v, what):
    if isinstance(v, str):
        return v
    if _torch is not None and isinstance(v, _torch.device):
        return str(v)
    raise TypeError(f"map_location: {what} must be a str or torch.device, not {type(v).__name__}")


class _LocationMap:
    """torch.load's map_location (torch/serialization.py, _get_restore_location):
    None: every storage goes where the file recorded it ("cpu", "cuda:1", ...);
    a str or torch.device: every storage goes there; a dict: recorded location
    -> target, a location not in it stays where it was recorded; a callable:
    called as fn(storage, location) per storage (see load()). Targets safeckpt
    restores: "cpu", "meta", "cuda" (torch's current device) and "cuda:N"."""

    def __init__(self, map_location):
        self.fn = None
        self.constant = None
        self.table = None
        if map_location is None:
            pass
        elif isinstance(map_location, dict):
            self.table = {_location_text(k, "a dict key"): _location_text(v, "a dict value")
                          for k, v in map_location.items()}
            for k, v in self.table.items():
                if not _TARGET_RE.fullmatch(v):
                    raise ValueError(f"map_location[{k!r}] = {v!r}: safeckpt maps to 'cpu', 'meta' or 'cuda[:N]'")
        elif isinstance(map_location, str) or (_torch is not None and isinstance(map_location, _torch.device)):
            self.constant = _location_text(map_location, "map_location")
            if not _TARGET_RE.fullmatch(self.constant):
                raise ValueError(f"map_location {self.constant!r}: safeckpt maps to 'cpu', 'meta' or 'cuda[:N]'")
        elif callable(map_location):
            self.fn = map_location
        else:
            raise TypeError("map_location must be None, a str, a torch.device, a dict or a callable, not "
                            f"{type(map_location).__name__}")

    def target(self, location):
        """Where a storage recorded at `location` goes (cuda resolved to
        "cuda:N"); not for callables. A recorded location safeckpt does not
        restore raises UnsupportedCheckpointError."""
        if self.constant is not None:
            t = self.constant
        elif self.table is not None:
            t = self.table.get(location, location)
        else:
            t = location
        if not _TARGET_RE.fullmatch(t):
            raise UnsupportedCheckpointError(
                f"a storage is recorded at location {location!r}, which safeckpt does not restore "
                "('cpu', 'meta', 'cuda[:N]'); map it with map_location (e.g. {" + repr(location) + ": 'cpu'})",
                code="unsupported")
        return _resolve_cuda(t) if t.startswith("cuda") else t


def _restore_to(storage, target):
    """A CPU UntypedStorage moved to `target` ("cpu", "meta", "cuda:N"), as
    torch's default_restore_location does it."""
    if target == "cpu":
        return storage
    if target == "meta":
        return _torch.UntypedStorage(storage.nbytes(), device="meta")
    return storage.cuda(int(target[5:]))


def _callable_restore(fn, locations, default):
    """The restore step of a callable map_location: fn(storage, location) with
    the CPU UntypedStorage of the record and the location string the file
    recorded (text from the file, never resolved to code by safeckpt); None ->
    default (the recorded location); else an UntypedStorage / TypedStorage of
    the same byte size, used as the storage."""

    def restore(storage, i):
        result = fn(storage, locations[i])
        if result is None:
            return _restore_to(storage, default.target(locations[i]))
        if isinstance(result, _torch.storage.TypedStorage):
            result = result._untyped_storage if hasattr(result, "_untyped_storage") else result.untyped()
        if not isinstance(result, _UNTYPED_STORAGE):
            raise TypeError(f"map_location callable returned {type(result).__name__} for a storage recorded at "
                            f"{locations[i]!r}: return a torch.UntypedStorage (or TypedStorage) or None")
        if result.nbytes() != storage.nbytes():
            raise ValueError(f"map_location callable returned a storage of {result.nbytes()} bytes for one of "
                             f"{storage.nbytes()} bytes (recorded at {locations[i]!r})")
        return result

    return restore


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

    def __init__(self, ck, framework, zero_copy, scalars, restore=None):
        self.ck = ck
        self.restore = restore  # None, or restore(cpu UntypedStorage, storage index) -> UntypedStorage
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
        if self.restore is not None and self.device < 0:
            s = self.restore(s, i)
        self._storages[i] = s
        return s

    def _np_storage(self, i):
        s = self._storages.get(i)
        if s is None:
            if self.zero_copy and self.ck.storage_in_file(i):
                s = self.ck.storage_buffer(i, True)
            elif self.ck.storage_in_file(i):
                # The default copies, as for torch tensors (review 2026-12-06: numpy
                # arrays were views of the mapped file: SIGBUS after a truncation),
                # read from the file (copy_storage_to: a truncated file is an OSError).
                s = bytearray(self.sinfo[i]["nbytes"])
                self.ck.copy_storage_to(i, _np.frombuffer(s, dtype=_np.uint8).ctypes.data)
            else:
                s = self.ck.storage_buffer(i, False)  # owned by the checkpoint; read-only: numpy refuses writes
            self._storages[i] = s
        return s

    def _strided_torch(self, t, dt):
        st = self._untyped(t["storage"])
        dev = st.device
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
            # Indices within the shape, checked here: torch >= 2.1's constructor
            # skips it by default and torch.load validates after loading
            # (_validate_loaded_sparse_tensors); an index out of range writes out
            # of bounds in to_dense(). RuntimeError, as torch.load's.
            _torch._validate_sparse_coo_tensor_args(idx, vals, t["shape"])
            try:
                r = _torch.sparse_coo_tensor(idx, vals, t["shape"], is_coalesced=t["coalesced"])
            except TypeError:  # torch < 2.1 has no is_coalesced
                r = _torch.sparse_coo_tensor(idx, vals, t["shape"])
                if t["coalesced"]:
                    r = r._coalesced_(True)
        elif layout != "strided":
            ci, pi, vals = (self.tensor(p) for p in t["sparse_parts"])
            _torch._validate_sparse_compressed_tensor_args(ci, pi, vals, t["shape"], getattr(_torch, layout))
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
        if t.get("dtensor"):
            # One rank's piece of a sharded tensor: returning it as a plain tensor would pass it
            # off as the whole (PyTorch returns a DTensor, which needs a process group here).
            raise UnsupportedCheckpointError(
                "the file holds DTensors (a torch.save of one rank's sharded state_dict); each tensor "
                "is that rank's local shard. Gather the ranks' files with `safeckpt convert --rank "
                "R0.pt --rank R1.pt ... OUT` and load OUT, or save with torch.distributed.checkpoint "
                "and use safeckpt.load_dcp", code="unsupported")
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


def _open_native(f, allow_pairs, cuda_target=None):
    """A host _Checkpoint of f, or with cuda_target ("cuda:N") and a path, the
    C++ GPU loader's (file opened once, storages streamed to the device)."""
    with native_errors():
        if isinstance(f, (str, os.PathLike)):
            # Bytes, as the OS names it: a name that is not UTF-8 (os.fsdecode's
            # surrogates) cannot cross into C++ as str (review 2026-12-06).
            path = os.fsencode(f)
            if cuda_target is not None:
                return _native.load_cuda(path, allow_pairs, cuda_target)
            return _native.load_path(path, allow_pairs)
        if isinstance(f, memoryview) and not f.c_contiguous:
            f = f.tobytes()  # a strided view: its bytes in order (the native side takes flat buffers only)
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
    map_location: as torch.load's (torch/serialization.py):
      None: each storage goes to the location the file recorded ("cpu",
        "cuda:1", ...; a CUDA location needs a GPU, as in torch);
      "cpu" / "meta" / "cuda" / "cuda:N" or a torch.device of those: every
        storage goes there;
      a dict {recorded location: target} (str or torch.device), e.g.
        {"cuda:1": "cuda:0"} or {"cpu": "cuda:0"}: recorded locations not in
        it stay where they were recorded;
      a callable fn(storage, location): called once per storage with the
        record's bytes as a CPU torch.UntypedStorage (a copy-on-write view
        of the file, or a copy with mmap=False / deflated records) and the
        location string the file recorded (data, never turned into code by
        safeckpt); it returns an UntypedStorage/TypedStorage of the same
        byte size on any device, which is used as the storage, or None for
        the recorded location. Only your callable runs: nothing from the
        file chooses code.
      Where every storage goes to one CUDA device, the C++ GPU loader
      streams the storages there and hands them to torch through DLPack, no
      host copy of the tensor bytes (a str/torch.device target with a path:
      the file is opened once by the GPU loader; otherwise the file or bytes
      are parsed on the host first, then streamed). Storages bound for
      several devices, or a module built without CUDA, go through torch's
      storage.cuda(N) copies. "cuda" with no GPU: RuntimeError as torch's.
      Locations other than cpu/meta/cuda[:N]: ValueError for an argument,
      UnsupportedCheckpointError for a location the file recorded.
    weights_only: must be True (or None): safeckpt never executes a file;
    False raises ValueError.
    mmap: None or False (torch.load's default): each storage is copied into
    memory the process owns, so nothing done to the file afterwards (a
    torch.save to the same path truncates it) can change or fault the
    tensors; True (as torch.load(mmap=True)): tensors are zero-copy views
    of a private copy-on-write mapping of the file. Writes through them stay
    in this process, but another writer's changes to pages not yet written
    here show through, and touching a tensor after the file was truncated
    kills the process with SIGBUS, as with torch's mmap=True. Deflated and
    byte-swapped records are always copies.
    allow: extra safe globals for this call only (as add_safe_globals).
    framework: "pt" (torch.Tensor), "np" (numpy arrays; dtypes numpy lacks
    come back as RawBitsArray; storages must map to "cpu"), or None: "pt"
    when torch imports.

    Raises UnsafeGlobalError (disallowed global/operation; the message names
    them), MalformedCheckpointError, UnsupportedCheckpointError (all
    pickle.UnpicklingError), OSError, RuntimeError (no such CUDA device),
    ValueError, TypeError.
    """
    if weights_only is False:
        raise ValueError("safeckpt.load(weights_only=False) is refused: safeckpt never executes code from a file. "
                         "Allow the globals the file needs with allow=[...] or safeckpt.add_safe_globals([...]) "
                         "(only for data classes you trust), or use torch.load(weights_only=False) yourself "
                         "on a file you fully trust.")
    fw = _framework(framework)
    where = _LocationMap(map_location)
    if fw != "pt" and (where.fn is not None or where.constant not in (None, "cpu")):
        raise ValueError("map_location other than 'cpu' needs framework='pt' (torch)")
    pairs, names = _globals.current(allow)
    zero_copy = bool(mmap)  # torch.load: `if mmap:`
    if (where.constant is not None and where.constant.startswith("cuda") and _native.has_cuda
            and isinstance(f, (str, os.PathLike))):
        ck = _open_native(f, pairs, _resolve_cuda(where.constant))
        return _materialize(ck, fw, zero_copy, names)
    ck = _open_native(f, pairs)
    with native_errors():
        locations = [s["location"] for s in ck.storages()]
    restore = None
    if where.fn is not None:
        restore = _callable_restore(where.fn, locations, _LocationMap(None))
    else:
        targets = [where.target(loc) for loc in locations]
        devices = set(targets)
        if devices - {"cpu"} and fw != "pt":
            raise ValueError(f"storages recorded at {sorted(set(locations))} go to {sorted(devices)}: "
                             "framework='np' reads to the CPU only (map_location='cpu')")
        if len(devices) == 1 and next(iter(devices)).startswith("cuda") and _native.has_cuda:
            with native_errors():
                ck = ck.to_device(targets[0])
        elif devices - {"cpu"}:
            restore = lambda storage, i: _restore_to(storage, targets[i])  # noqa: E731
    return _materialize(ck, fw, zero_copy, names, restore)


def _materialize(ck, fw, zero_copy, names, restore=None):
    with native_errors():
        nodes = ck.nodes()
        tensors = ck.tensors()
    scalars = _Scalars(fw, names, tensors)
    m = _Materializer(ck, fw, zero_copy, scalars, restore)
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
            rep = _native.scan_path(os.fsencode(path), pairs)
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
        return Report(_native.scan_path(os.fsencode(path), pairs))


def _safe_open_device(device, fw):
    """safe_open's device argument -> "cpu" or "cuda:N" (checked against the
    GPUs torch sees)."""
    if device is None:
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}"
    text = _location_text(device, "safe_open's device")
    if text == "cpu":
        return "cpu"
    if not re.fullmatch(r"cuda(:[0-9]+)?", text):
        raise ValueError(f"safe_open device {text!r}: safeckpt reads to 'cpu', 'cuda' or 'cuda:N'")
    if fw != "pt":
        raise ValueError(f"safe_open device {text!r} needs framework='pt' (torch)")
    return _resolve_cuda(text)


class safe_open:
    """safetensors-style lazy access to .pt and .safetensors files alike:

        with safeckpt.safe_open("model.pt", framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)

    The file is mapped and its metadata validated once (the pickle is parsed
    with every safeckpt.load rule); a tensor's bytes are touched only when
    get_tensor() asks for it (its storage copied out of the mapping). keys(): the
    state_dict names of every tensor (nested dicts joined with '.').
    metadata(): safetensors' __metadata__ dict, or None (always None for
    PyTorch files). device: "cpu" (default), "cuda", "cuda:N", an int N (=
    "cuda:N", as safetensors takes it) or a torch.device of those:
    get_tensor() builds the host tensor (a copy of its storage read from the
    open file with pread, so it never depends on the file afterwards; a file
    truncated while open is an OSError naming the storage, where safetensors'
    safe_open dies of SIGBUS) and copies just that
    tensor to the device (framework="pt" only; no GPU: RuntimeError as
    torch.load's). For a whole checkpoint on the GPU, load(path,
    map_location="cuda") streams every storage at once."""

    def __init__(self, filename, framework="pt", device="cpu", *, allow=None):
        self._fw = _framework(framework)
        self._device = _safe_open_device(device, self._fw)
        pairs, names = _globals.current(allow)
        self._ck = _open_native(filename, pairs)
        with native_errors():
            self._names = dict(self._ck.named_tensors())
            tensors = self._ck.tensors()
        # Copies (review 2026-12-06): a zero-copy tensor outlived a truncation
        # of the file as SIGBUS. The file stays open; each get_tensor reads
        # the storage it needs from it (pread: a truncation is an OSError).
        self._m = _Materializer(self._ck, self._fw, False, _Scalars(self._fw, names, tensors))

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
            t = self._m.tensor(index)
        return t if self._device == "cpu" else t.to(self._device)

    def __contains__(self, name):
        return name in self._names

    def __len__(self):
        return len(self._names)
