"""load_dcp: torch.distributed.checkpoint directories, read by the C++ reader
(include/safeckpt/dcp.hpp): the .metadata pickle through hooks that accept
only DCP's own metadata classes, every chunk through the weights-only loader,
the layout checked (tiling, ranges inside files, plain file names)."""
import os

from . import _safeckpt as _native
from ._api import _NP_NATIVE, RawBitsArray, _framework, _raw_np_dtype, _torch, load
from ._errors import native_errors

import numpy as _np


def _make(dtype, sizes, buf, fw):
    if fw == "pt":
        dt = getattr(_torch, dtype, None)
        if dt is not None:
            flat = _torch.frombuffer(buf, dtype=_torch.uint8) if len(buf) else _torch.empty(0, dtype=_torch.uint8)
            return flat.view(dt).reshape(sizes)
    raw = dtype not in _NP_NATIVE
    npdt = _np.dtype(_raw_np_dtype(dtype) if raw else _NP_NATIVE[dtype])
    arr = _np.frombuffer(buf, dtype=npdt).reshape(sizes) if len(buf) else _np.empty(sizes, dtype=npdt)
    if raw:
        arr = arr.view(RawBitsArray)
        arr.torch_dtype = dtype
    return arr


def load_dcp(path, *, rank=None, world_size=None, shard_dim=0, boxes=None, framework=None):
    """Reads a torch.distributed.checkpoint (DCP) directory without running
    anything from it (PyTorch reads its .metadata with plain pickle).

    path: the directory (holding .metadata and __<rank>_<n>.distcp files).
    Three modes:
      - neither rank nor boxes: the whole model, nested as
        torch.distributed.checkpoint.format_utils.dcp_to_torch_save writes it
        (every tensor whole, non-tensor items as their values); the same as
        safeckpt.load(path).
      - rank and world_size: a flat dict FQN -> tensor holding the part of
        every tensor that rank `rank` of `world_size` owns under Shard(shard_dim)
        (torch.chunk's split: ceil(n / world_size) rows per rank, trailing
        ranks fewer or none); a tensor with fewer than shard_dim + 1
        dimensions, or every tensor when shard_dim is None, is whole
        (Replicate). Only the chunks each part needs are read.
      - boxes: {fqn: (offsets, sizes)}: a flat dict of exactly those slices.
    Resharded modes return tensors only (no non-tensor items); each tensor
    owns its memory (a row-major copy assembled from the chunks).
    framework: "pt" (torch tensors), "np" (numpy; dtypes numpy lacks as
    RawBitsArray) or None ("pt" when torch imports).

    Raises UnsafeGlobalError (a .metadata naming anything outside DCP's
    metadata classes), MalformedCheckpointError (overlapping or missing chunks,
    a range past the end of a file, a bad file name, damaged chunk payloads),
    UnsupportedCheckpointError, ValueError (a box outside its tensor, an
    unknown FQN, rank outside world_size, bad arguments), OSError for I/O.
    """
    fw = _framework(framework)
    path = os.fspath(path)
    if boxes is None and rank is None:
        if world_size is not None:
            raise ValueError("world_size needs rank")
        return load(path, framework=fw)
    items = []
    if boxes is not None:
        if rank is not None or world_size is not None:
            raise ValueError("give either boxes or rank/world_size")
        for fqn, (offsets, sizes) in boxes.items():
            items.append((str(fqn), [int(o) for o in offsets], [int(s) for s in sizes]))
        if not items:
            return {}
    elif world_size is None or int(world_size) <= 0:
        raise ValueError("rank needs a positive world_size")
    sd = -1 if shard_dim is None else int(shard_dim)
    if sd < -1:
        raise ValueError("shard_dim must be None or >= 0")
    with native_errors():
        got = _native.load_dcp_boxes(path, -1 if rank is None else int(rank),
                                     0 if world_size is None else int(world_size), sd, items)
    return {fqn: _make(dtype, sizes, buf, fw) for fqn, dtype, _shape, _offsets, sizes, buf in got}
