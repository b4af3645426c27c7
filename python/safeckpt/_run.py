"""safeckpt.run: a torch.export program (PT2 archive) on the engine's CPU
reference interpreter (include/safeckpt/graph.hpp), as ``safeckpt run
--device cpu`` runs it. The archive is read as data: the graph is JSON
validated against the engine's ATen op allowlist (allowlist/ops.schema),
weights are raw bytes or a checkpoint safeckpt's loader verified; nothing
from the file is executed (no pickle outside the restricted loader, no .so,
no Python)."""
import os

import numpy as _np

from . import _globals
from . import _safeckpt as _native
from ._api import _framework, _torch
from ._dcp import _make
from ._errors import native_errors


def _as_input(name, value):
    """(name, dtype name, shape, bytes) of a torch tensor or numpy array."""
    if _torch is not None and isinstance(value, _torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        data = t.reshape(-1).view(_torch.uint8).numpy().tobytes() if t.numel() else b""
        return (name, dtype, list(t.shape), data)
    a = _np.ascontiguousarray(value)
    dtype = getattr(a, "torch_dtype", None) or {
        "float32": "float32", "float64": "float64", "float16": "float16", "int64": "int64", "int32": "int32",
        "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
    }.get(a.dtype.name)
    if dtype is None:
        raise TypeError(f"input {name!r}: numpy dtype {a.dtype} has no torch dtype")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return (name, dtype, list(a.shape), a.tobytes())


def run(program, inputs, *, weights=None, model="model", framework=None, allow=None):
    """Runs `model` of the PT2 archive `program` (torch.export.save output)
    on the CPU reference interpreter and returns its user outputs as a list,
    in the program's output order (what ``ep.module()(*args)`` returns,
    flattened).

    program: path of the .pt2 archive (the 2.6/2.7 flat layout too).
    inputs: dict user-input name -> torch.Tensor or numpy array (the names
      of the exported forward's arguments, e.g. {"idx": ...}); each is checked
      against the program (dtype, rank, static dims, dynamic dims within the
      program's range_constraints) before anything runs.
    weights: None (the archive's own weights and constants) or the path of
      a checkpoint safeckpt.load reads (.pt, .safetensors, sharded index, DCP
      directory), bound by state_dict key like load_state_dict(strict=True);
      every missing, unexpected or misshapen name is reported. Constants and
      non-persistent buffers the checkpoint lacks come from the archive.
    model: which program of the archive ("model" is what torch.export.save writes).
    framework: "pt" (torch tensors), "np" (numpy) or None ("pt" when torch imports).
    allow: extra safe globals for reading `weights` (as add_safe_globals).

    Raises UnsafeGlobalError (an op outside the engine's allowlist, a
    higher-order or custom op, a mutation, a pickled weight importing
    outside the allowlist: nothing ran), MalformedCheckpointError (a damaged
    archive, JSON the schema does not allow, a tensor_meta the shape pass
    cannot reproduce, an index out of range at run time),
    UnsupportedCheckpointError (AOTInductor code in the archive, a dtype the
    interpreter lacks), ValueError (inputs or weights that do not fit the
    program), OSError for I/O.
    """
    fw = _framework(framework)
    items = [_as_input(str(k), v) for k, v in dict(inputs).items()]
    pairs, _names = _globals.current(allow)
    with native_errors():
        got = _native.run_program(os.fspath(program), str(model), items,
                                  "" if weights is None else os.fspath(weights), pairs)
    return [_make(dtype, shape, buf, fw) for dtype, shape, buf in got]
