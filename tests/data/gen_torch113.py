#!/usr/bin/python3
"""Write the PyTorch 1.13 conformance corpus: real checkpoints plus what PyTorch did with them.

Run it under Debian's PyTorch 1.13 (package python3-torch, interpreter /usr/bin/python3):

    /usr/bin/python3 tests/data/gen_torch113.py tests/data/corpus/torch-1.13

For every case it writes OUTDIR/<case>.pt (saved by this torch's own ``torch.save``) and
OUTDIR/<case>.json in the schema of the torch-2.11 corpus (see tests/data/corpus/README.md),
plus a few keys of its own:

  case, file, note, torch_version   as in the 2.11 corpus
  weights_only_ok                   whether *this* torch's ``torch.load(weights_only=True)`` loaded it
  value                             when it did: the loaded object as a typed tree
  error_type, error                 when it did not: the exception it raised
  value_unrestricted                ``torch.load(weights_only=False)`` of the (benign) file
  expect_safe                       whether a correct PyTorch-2.6+-style weights-only loader, with
                                    the default allowlist, must accept the file (decided per case
                                    below from PyTorch 2.x's allowlist and opcode set)
  value_expected                    when expect_safe: what such a loader must return (the same tree
                                    as value_unrestricted)
  pickle_protocol                   the PROTO number of the main pickle
  pickle_globals                    every GLOBAL the main pickle names, as written (``module.name``;
                                    protocol 2 writes ``__builtin__`` for ``builtins``), sorted
  zip_records                       the zip's record names in file order (null: legacy format)

1.13 has no ``get_unsafe_globals_in_checkpoint``, so ``unsafe_globals`` is never written.

The typed tree is built exactly like tools/gen_corpus.py builds it for the 2.11 corpus, except that
storages are told apart by their StorageImpl (``_cdata``) rather than by (data_ptr, nbytes), so two
distinct empty storages get distinct ``storage_id``s.  Ids are numbered in first-appearance order of
a depth-first walk (dict/list order, OrderedDict items before ``_metadata``).  For every zip file
here that is also the order in which ``torch.save`` numbered its ``data/<key>`` records, so
``storage_id`` N is record ``data/N`` (tensors the tree leaves out, such as sparse values or
per-channel scales, come after all the tensors it shows).

Each case seeds the RNG from its own name, so tensor values do not depend on which cases ran before.
Files are not byte-reproducible across runs: legacy-format storage keys are memory addresses.
"""
import argparse
import collections
import hashlib
import io
import json
import os
import pickletools
import shutil
import sys
import tempfile
import traceback
import warnings
import zipfile
import zlib

import torch

warnings.filterwarnings("ignore")

TV = torch.__version__


# ---------------------------------------------------------------------------------------------
# The typed tree (same structure as the 2.11 corpus)
# ---------------------------------------------------------------------------------------------

def dt_name(dt):
    return str(dt).replace("torch.", "")


def tensor_bytes(t):
    """The tensor's elements in row-major order as little-endian bytes (quantized: int_repr)."""
    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    if t.layout != torch.strided:
        return b""
    t = t.resolve_conj().resolve_neg().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def storage_bytes(st):
    """All bytes of an UntypedStorage (bytes(st) works too but is very slow in 1.13)."""
    if st.nbytes() == 0:
        return b""
    return torch.empty(0, dtype=torch.uint8).set_(st).numpy().tobytes()


def untyped_storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


def enc(v, storages):
    """Encode a loaded object as the corpus's typed tree. `storages` maps StorageImpl -> id."""
    if isinstance(v, torch.Tensor):
        d = {"dtype": dt_name(v.dtype), "shape": list(v.shape), "requires_grad": bool(v.requires_grad),
             "parameter": isinstance(v, torch.nn.Parameter), "layout": dt_name(v.layout)}
        if v.layout == torch.strided:
            d["stride"] = list(v.stride())
            d["storage_offset"] = int(v.storage_offset())
            try:
                st = untyped_storage(v)
                d["storage_nbytes"] = int(st.nbytes())
                key = st._cdata
                if key not in storages:
                    storages[key] = len(storages)
                d["storage_id"] = storages[key]
                d["storage_sha256"] = hashlib.sha256(storage_bytes(st)).hexdigest()
            except Exception as e:  # pragma: no cover - recorded, not hidden
                d["storage_note"] = repr(e)
            d["sha256"] = hashlib.sha256(tensor_bytes(v)).hexdigest()
            if v.is_quantized:
                d["qscheme"] = dt_name(v.qscheme())
                if v.qscheme() == torch.per_tensor_affine:
                    d["q_scale"] = float(v.q_scale())
                    d["q_zero_point"] = int(v.q_zero_point())
        else:
            d["sparse_indices"] = enc(v._indices(), storages) if v.layout == torch.sparse_coo else None
            d["dense_sha256"] = hashlib.sha256(tensor_bytes(v.to_dense())).hexdigest()
        return {"$tensor": d}
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return {"$int": str(v)}
    if isinstance(v, float):
        return {"$float": repr(v)}
    if isinstance(v, complex):
        return {"$complex": [repr(v.real), repr(v.imag)]}
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return {"$bytes" if isinstance(v, bytes) else "$bytearray": v.hex()}
    if isinstance(v, torch.Size):
        return {"$size": list(v)}
    if isinstance(v, torch.dtype):
        return {"$dtype": dt_name(v)}
    if isinstance(v, torch.device):
        return {"$device": str(v)}
    if isinstance(v, collections.OrderedDict):
        out = {"$odict": [[enc(k, storages), enc(x, storages)] for k, x in v.items()]}
        md = getattr(v, "_metadata", None)
        if md is not None:
            out["_metadata"] = enc(md, storages)
        return out
    if isinstance(v, dict):
        return {"$dict": [[enc(k, storages), enc(x, storages)] for k, x in v.items()]}
    if isinstance(v, list):
        return {"$list": [enc(x, storages) for x in v]}
    if isinstance(v, tuple):
        return {"$tuple": [enc(x, storages) for x in v]}
    if isinstance(v, (set, frozenset)):
        return {"$set" if isinstance(v, set) else "$frozenset":
                sorted([enc(x, storages) for x in v], key=json.dumps)}
    if isinstance(v, slice):
        return {"$slice": [enc(v.start, storages), enc(v.stop, storages), enc(v.step, storages)]}
    return {"$object": type(v).__module__ + "." + type(v).__qualname__, "repr": repr(v)[:200]}


# ---------------------------------------------------------------------------------------------
# What is in the file
# ---------------------------------------------------------------------------------------------

def main_pickle(path):
    """The bytes from the start of the main pickle (zip: data.pkl; legacy: after 3 header pickles)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            return z.read(name)
    with open(path, "rb") as f:
        data = f.read()
    s = io.BytesIO(data)
    for _ in range(3):  # magic number, protocol version, sys_info
        for _op in pickletools.genops(s):
            pass
    return data[s.tell():]


def pickle_facts(path):
    proto, names = None, set()
    for op, arg, _pos in pickletools.genops(io.BytesIO(main_pickle(path))):
        if op.name == "PROTO" and proto is None:
            proto = arg
        elif op.name in ("GLOBAL", "INST"):
            names.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.add("<STACK_GLOBAL>")
    return proto, sorted(names)


def zip_records(path):
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as z:
        return [i.filename for i in z.infolist()]


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------

def record(out, name, path, note, expect_safe, extra=None):
    res = {"case": name, "file": os.path.basename(path), "torch_version": TV, "note": note,
           "expect_safe": expect_safe}
    try:
        v = torch.load(path, weights_only=True, map_location="cpu")
        res["weights_only_ok"] = True
        res["value"] = enc(v, {})
    except Exception as e:
        res["weights_only_ok"] = False
        res["error_type"] = type(e).__name__
        res["error"] = str(e)[:2000]
    v = torch.load(path, weights_only=False, map_location="cpu")
    res["value_unrestricted"] = enc(v, {})
    if expect_safe:
        res["value_expected"] = res["value_unrestricted"]
    res["pickle_protocol"], res["pickle_globals"] = pickle_facts(path)
    res["zip_records"] = zip_records(path)
    if extra:
        res.update(extra)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    return res


class Corpus:
    def __init__(self, out):
        self.out = out
        self.table = []  # (case, file, expect_safe, note)

    def path(self, name):
        return os.path.join(self.out, name + ".pt")

    def save(self, name, obj, note, expect_safe, extra=None, **save_kw):
        path = self.path(name)
        torch.save(obj, path, **save_kw)
        self.add(name, path, note, expect_safe, extra)

    def add(self, name, path, note, expect_safe, extra=None):
        record(self.out, name, path, note, expect_safe, extra)
        self.table.append((name, os.path.basename(path), expect_safe, note))


CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

@case
def single_tensor(c):
    c.save("single_tensor", torch.randn(4, 5, dtype=torch.float64), "top-level object is a tensor", True)


@case
def all_dtypes(c):
    d = {}
    for n in ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64",
              "bool", "complex64", "complex128"]:
        dt = getattr(torch, n)
        if dt == torch.bool:
            d[n] = torch.rand(3, 5) > 0.5
        elif dt.is_complex:
            d[n] = torch.randn(3, 5, dtype=dt)
        elif dt.is_floating_point:
            d[n] = torch.randn(3, 5).to(dt)
        elif dt == torch.uint8:
            d[n] = torch.randint(0, 256, (3, 5)).to(dt)
        else:
            info = torch.iinfo(dt)
            t = torch.randint(-100, 100, (3, 5)).to(dt)
            t[0, 0], t[0, 1] = info.min, info.max
            d[n] = t
    c.save("all_dtypes", d, "one 3x5 tensor per dtype (integers include their min and max)", True)


@case
def scalars_and_empty(c):
    d = {"zero_d": torch.tensor(3.5), "zero_d_int": torch.tensor(7), "zero_d_bool": torch.tensor(True),
         "empty": torch.empty(0, 4), "empty3": torch.zeros(2, 0, 3), "empty_int": torch.empty(0, dtype=torch.int64),
         "one": torch.ones(1), "big_rank": torch.randn(1, 2, 1, 3, 1, 2, 1, 1)}
    c.save("scalars_and_empty", d, "0-d, zero-numel (each its own empty storage) and high-rank tensors", True)


@case
def views_shared_storage(c):
    x = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    big = torch.arange(100, dtype=torch.int32)
    d = {"base": x, "row": x[2], "col": x[:, 3], "t": x.t(), "slice": x[1:4, 2:6], "step": x[::2, ::3],
         "flat_view": x.view(-1)[5:20], "permute": x.view(2, 3, 8).permute(2, 0, 1),
         "expand": torch.ones(1, 4).expand(3, 4), "expand0d": torch.tensor(2.5).expand(2, 3),
         "only_view": big[40:44]}
    c.save("views_shared_storage", d,
           "views share one storage and keep offset/strides; expand saves stride 0; "
           "'only_view' is a 4-element view whose whole 400-byte storage is saved", True)


@case
def conj_neg_views(c):
    z = torch.randn(3, dtype=torch.complex64)
    r = torch.randn(3)
    d = {"z": z, "z_conj": z.conj(), "r_neg": r._neg_view(), "z_conj_resolved": z.conj().resolve_conj()}
    before = enc(d, {})
    c.save("conj_neg_views", d,
           "conj()/_neg_view() views: 1.13 drops the conj and neg bits on save, so 'z_conj' loads equal "
           "to 'z' (sharing its storage) and 'r_neg' loads un-negated; a loader must return the raw "
           "values; value_before_save shows the in-memory values", True,
           extra={"value_before_save": before})


@case
def parameters(c):
    p = torch.nn.Parameter(torch.randn(3, 3))
    q = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    d = {"p": p, "q": q, "in_list": [p, q], "grad_tensor": torch.randn(2, requires_grad=True),
         "p_int": torch.nn.Parameter(torch.arange(4), requires_grad=False)}
    c.save("parameters", d, "nn.Parameter with requires_grad True/False, the same Parameter twice (pickle memo), "
           "a plain tensor with requires_grad", True)


class TiedLM(torch.nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight


@case
def tied_weights(c):
    m = TiedLM()
    c.save("tied_weights", m.state_dict(),
           "state_dict with emb.weight and head.weight tied (one Parameter): two tensors, one storage", True)
    c.save("tied_weights_keep_vars", m.state_dict(keep_vars=True),
           "state_dict(keep_vars=True) of the tied model: the one Parameter is pickled once and "
           "referenced again through the pickle memo", True)


@case
def optimizer_states(c):
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    adam = torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    sgd = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(adam, step_size=10, gamma=0.5)
    for _ in range(2):
        for opt in (adam, sgd):
            opt.zero_grad()
            m(torch.randn(5, 4)).pow(2).sum().backward()
            opt.step()
        sched.step()
    d = {"model": m.state_dict(), "adam": adam.state_dict(), "sgd": sgd.state_dict(),
         "scheduler": sched.state_dict(), "epoch": 2, "best": {"loss": 0.25, "step": 2}}
    c.save("optimizer_states", d,
           "model + Adam (exp_avg, exp_avg_sq, 0-d step tensors) + SGD momentum_buffer state_dicts with "
           "param_groups, StepLR state", True)


@case
def transformer_state_dict(c):
    m = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    c.save("transformer_state_dict", m.state_dict(), "nn.TransformerEncoderLayer(32, 4, 64) state_dict", True)


@case
def small_cnn(c):
    layers, cin = [], 3
    for cout in (16, 32, 64, 128, 128):
        layers += [torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU()]
        cin = cout
    m = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10))
    with torch.no_grad():
        m.train()(torch.randn(2, 3, 8, 8))  # update BatchNorm running stats and num_batches_tracked
    c.save("small_cnn", m.state_dict(), "5-layer CNN state_dict (~1 MB): conv, BatchNorm buffers, linear", True)


def python_values_dict():
    return {
        "int_small": 5, "int_neg": -300, "int_2_31": 2 ** 31, "int_max64": 2 ** 63 - 1, "int_min64": -2 ** 63,
        "int_u64max": 2 ** 64 - 1, "int_big": 2 ** 100, "int_neg_big": -(2 ** 80) + 7,
        "float": 0.1, "neg_zero": -0.0, "nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"),
        "tiny": 5e-324, "huge": 1.7976931348623157e308,
        "str": "h\u00e9llo \u2713 \u6a21\u578b", "empty_str": "", "none": None, "t": True, "f": False,
        "bytes": b"\x00\x01abc\xff", "bytearray": bytearray(b"xyz\x00"),
        "list": [1, 2.5, "x", None, [], ()], "tuple": (1, (2, (3,))), "empty_tuple": (), "empty_dict": {},
        "nested": {"a": {"b": [{"c": 1}, (2, [3])]}},
        "int_keys": {1: "a", -2: "b", 2 ** 70: "c"}, "tuple_key": {(1, 2): "x", ("a", (3,)): "y"},
        "complex": 1 + 2j, "complex_special": complex(float("inf"), -0.0),
        "set": {1, 2, 3}, "str_set": {"b", "a"}, "empty_set": set(),
        "size": torch.Size([2, 3]), "size0": torch.Size([]),
        "dtypes": [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
                   torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128],
        "device": torch.device("cuda:1"), "device_cpu": torch.device("cpu"),
    }


@case
def python_values(c):
    c.save("python_values", python_values_dict(),
           "plain python values: ints beyond int64, nan/inf/-0.0, nested containers with int and tuple "
           "keys, set, bytes, bytearray, complex, torch.Size, dtypes, torch.device('cuda:1')", True)


@case
def python_values_unsafe(c):
    d = {"frozenset": frozenset({"a", "b"}), "slice": slice(1, 10, 2), "w": torch.randn(2)}
    c.save("python_values_unsafe", d, "frozenset and slice: builtins not in PyTorch's default allowlist", False)


@case
def empty_bytes(c):
    c.save("empty_bytes", {"w": torch.randn(2), "blob": b""},
           "b'' at protocol 2 pickles as __builtin__.bytes() (not _codecs.encode), which PyTorch 2.x's "
           "allowlist does not hold", False)


@case
def protocols(c):
    obj = {"w": torch.randn(3, 4), "b": torch.arange(3), "meta": {"lr": 0.5, "name": "p", "tup": (1, 2)},
           "big": 2 ** 40}
    for p in (2, 3):
        seed(f"protocol_{p}")
        obj["w"] = torch.randn(3, 4)
        c.save(f"protocol_{p}", obj, f"torch.save pickle_protocol={p}", True, pickle_protocol=p)
    seed("protocol_3_bytes")
    c.save("protocol_3_bytes", {"w": torch.randn(2), "blob": b"\x00\x01binary"},
           "pickle_protocol=3 with a bytes value: SHORT_BINBYTES, an opcode PyTorch 2.x's weights-only "
           "unpickler does not accept", False, pickle_protocol=3)


@case
def legacy_format(c):
    x = torch.arange(20, dtype=torch.float32)
    m = x.view(4, 5)
    d = {"base": m, "row": m[1], "col": m[:, 2], "tail": x[12:], "h": torch.randn(2).half(),
         "i": torch.arange(10)[2:5], "p": torch.nn.Parameter(torch.randn(2, 2)), "empty": torch.empty(0),
         "sd": torch.nn.Linear(3, 2).state_dict(), "n": 3}
    c.save("legacy_format", d,
           "_use_new_zipfile_serialization=False (pre-1.6 format): several storages, views into one "
           "storage, a Parameter, a nested state_dict; storage keys are decimal memory addresses",
           True, _use_new_zipfile_serialization=False)


@case
def bytesio_archive(c):
    buf = io.BytesIO()
    torch.save({"w": torch.randn(2, 3), "step": 7}, buf)
    path = c.path("bytesio_archive")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    c.add("bytesio_archive", path, "saved to an io.BytesIO: zip root folder is 'archive/'", True)


@case
def nonascii_root(c):
    # torch.save names the zip's root folder after the file (its name without extension), so a
    # file saved under a long non-ASCII name carries that name inside; it is then renamed.
    stem = "mod\u00e8le-\u043c\u043e\u0434\u0435\u043b\u044c-\u6a21\u578b-\u00fcn\u00efc\u00f8d\u00e9-" * 3 + "end"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, stem + ".pt")
        torch.save({"w": torch.randn(3), "name": stem}, src)
        shutil.copyfile(src, c.path("nonascii_root"))
    c.add("nonascii_root", c.path("nonascii_root"),
          f"saved as '{stem}.pt' ({len(stem.encode())}-byte UTF-8 name) then renamed: the zip root folder "
          "keeps the non-ASCII name", True)


@case
def sparse_coo(c):
    i = torch.tensor([[0, 1, 1, 3], [2, 0, 2, 1]])
    v = torch.tensor([3.0, 4.0, 5.0, -1.0])
    d = {"dense": torch.arange(3.0), "sparse_coo": torch.sparse_coo_tensor(i, v, (4, 3))}
    c.save("sparse_coo", d, "a dense tensor, then a sparse COO tensor (_rebuild_sparse_tensor, layout via "
           "_get_layout); the tree holds the COO indices but not its values, whose storage is data/2", True)


@case
def quantized(c):
    q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 10, torch.quint8)
    qi = torch.quantize_per_tensor(torch.randn(6), 0.05, -3, torch.qint8)
    c.save("quantized", {"q": q, "qi": qi}, "per-tensor affine quantized tensors (quint8, qint8)", True)
    seed("quantized_per_channel")
    qc = torch.quantize_per_channel(torch.randn(3, 4), torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2]),
                                    0, torch.qint8)
    c.save("quantized_per_channel", {"q": qc},
           "per-channel affine quantized tensor (scales/zero points are tensors in the pickle)", True)


@case
def numpy_values(c):
    import numpy as np
    c.save("numpy_values", {"w": torch.randn(2), "acc": np.float64(0.93), "step": np.int64(5),
                            "arr": np.arange(6, dtype=np.float32).reshape(2, 3)},
           "numpy scalars and an ndarray (numpy 1.x writes numpy.core.multiarray)", False)


@case
def custom_objects(c):
    ns = argparse.Namespace(lr=0.1, layers=4, name="exp")
    c.save("argparse_namespace", {"w": torch.randn(2), "args": ns},
           "argparse.Namespace in a checkpoint (fairseq style)", False)
    seed("whole_module")
    c.save("whole_module", torch.nn.Linear(2, 2), "whole nn.Module pickled (torch.save(model))", False)


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    c = Corpus(args.outdir)
    failed = []
    for fn in CASES:
        seed(fn.__name__)
        try:
            fn(c)
        except Exception:
            failed.append(fn.__name__)
            print("CASE FAILED", fn.__name__, file=sys.stderr)
            traceback.print_exc()
    names = sorted(row[0] for row in c.table)
    with open(os.path.join(args.outdir, "MANIFEST.txt"), "w") as f:
        f.write(f"torch {TV}\n" + "\n".join(names) + "\n")
    print("wrote", len(names), "cases to", args.outdir)
    for name, file, safe, note in sorted(c.table):
        print(f"| {name} | {file} | {'yes' if safe else 'no'} | {note} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
