"""Device-side proof for issue 5, run on the GPU machine (PyTorch 2.11, CuPy):
for every checkpoint given, load it with safeckpt::cuda::load_to_device (through
tests/cuda/dlpack_shim.cpp), import every tensor into PyTorch with
torch.from_dlpack (DLPack 1.x versioned capsules, and the legacy form) and into
CuPy, and compare with torch.load(weights_only=True, map_location="cuda") of the
same file: same bytes, shape, strides and storage offset, no copies (the
imported tensor's data_ptr is our device pointer).

usage: python3 check_dlpack.py LIBSHIM.so [--allow FILE] CKPT...
Prints one line per file and a summary 'N passed, N failed'.
"""
import ctypes, sys, collections

import torch

try:
    import cupy
except Exception:  # CuPy is optional
    cupy = None

lib = ctypes.CDLL(sys.argv[1])
lib.sck_open.restype = ctypes.c_void_p
lib.sck_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
lib.sck_count.argtypes = [ctypes.c_void_p]
lib.sck_name.restype = ctypes.c_char_p
lib.sck_name.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.sck_dlpack.restype = ctypes.c_void_p
lib.sck_dlpack.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
lib.sck_close.argtypes = [ctypes.c_void_p]
PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Exported:
    """An object speaking the DLPack protocol over one of our capsules."""

    def __init__(self, ptr, versioned, device):
        self.ptr, self.versioned, self.device = ptr, versioned, device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        name = b"dltensor_versioned" if self.versioned else b"dltensor"
        return PyCapsule_New(self.ptr, name, None)

    def __dlpack_device__(self):
        return (2, self.device)  # kDLCUDA


def flatten(obj, prefix="", out=None, seen=None):
    out = collections.OrderedDict() if out is None else out
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out[prefix] = obj
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, (str, int)) and not isinstance(k, bool):
                flatten(v, f"{prefix}.{k}" if prefix else str(k), out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}.{i}" if prefix else str(i), out, seen)
    return out


def raw(t):
    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    return t.contiguous().view(-1).view(torch.uint8) if t.numel() else t.contiguous().view(-1)


args = sys.argv[2:]
allow = b""
if args and args[0] == "--allow":
    allow = args[1].encode()
    args = args[2:]
passed = failed = 0
for path in args:
    err = ctypes.create_string_buffer(4096)
    h = lib.sck_open(path.encode(), allow, err, 4096)
    try:
        ref = torch.load(path, weights_only=True, map_location="cuda")
        ref_err = None
    except Exception as e:  # noqa: BLE001
        ref, ref_err = None, e
    if not h:
        ok = ref is None
        print(f"{'ok  ' if ok else 'FAIL'} {path}: refused by safeckpt ({err.value.decode()[:120]})"
              f"{'' if ok else ' but torch loads it'}")
        passed += ok
        failed += not ok
        continue
    if ref is None:
        print(f"note {path}: torch refused ({type(ref_err).__name__}) but safeckpt loads it (intended: {allow.decode()})")
        ref_tensors = None
    else:
        ref_tensors = flatten(ref)
    problems = []
    n = lib.sck_count(h)
    for i in range(n):
        name = lib.sck_name(h, i).decode()
        for versioned in (1, 0):
            p = lib.sck_dlpack(h, i, versioned, err, 4096)
            if not p:
                problems.append(f"{name}: no DLPack ({err.value.decode()[:80]})")
                break
            ours = torch.from_dlpack(Exported(p, versioned, torch.cuda.current_device()))
            if ref_tensors is not None:
                r = ref_tensors.get(name)
                if r is None or r.layout != torch.strided or r.is_quantized:
                    continue
                if (tuple(ours.shape) != tuple(r.shape) or ours.dtype != r.dtype
                        or (ours.numel() and tuple(ours.stride()) != tuple(r.stride()))):
                    problems.append(f"{name}: shape/dtype/stride {tuple(ours.shape)} {ours.dtype} {ours.stride()} "
                                    f"vs {tuple(r.shape)} {r.dtype} {r.stride()}")
                elif not torch.equal(raw(ours), raw(r)):
                    problems.append(f"{name}: bytes differ")
            if versioned and cupy is not None and ours.numel() and ours.dtype in (
                    torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool):
                p2 = lib.sck_dlpack(h, i, 1, err, 4096)
                c = cupy.from_dlpack(Exported(p2, 1, torch.cuda.current_device()))
                if c.data.ptr != ours.data_ptr():
                    problems.append(f"{name}: CuPy got another pointer (a copy?)")
                elif not bool((cupy.asarray(ours) == c).all()) and ours.dtype not in (torch.float32, torch.float64, torch.float16):
                    problems.append(f"{name}: CuPy values differ")
    lib.sck_close(h)
    ok = not problems
    passed += ok
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {path}: {n} tensors via DLPack (versioned + legacy)"
          + ("" if ok else "; " + "; ".join(problems[:5])))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
