"""safeckpt: open PyTorch checkpoints you did not write, with torch's API and
without running anything from the file.

    import safeckpt
    sd = safeckpt.load("model.pt")                 # = torch.load(..., weights_only=True)
    sd = safeckpt.load("model.pt", map_location="cuda")   # GPU loader + DLPack (CUDA builds)
    safeckpt.save(sd, "copy.pt")                   # torch.load reads it back
    with safeckpt.safe_globals([MyConfig]): ...    # as torch.serialization.safe_globals
    safeckpt.get_unsafe_globals_in_checkpoint("x.pt")
    safeckpt.scan("x.pt").verdict                  # the auditor
    with safeckpt.safe_open("model.safetensors") as f: f.get_tensor("w")
    safeckpt.load_dcp("ckpt_dir", rank=0, world_size=2)   # a DCP directory, this rank's shards
    safeckpt.sign("model_dir", "model.sig", private_key="key.pem")    # OpenSSF Model Signing
    safeckpt.verify("model_dir", "model.sig", public_key="pub.pem")   # raises SignatureError
    outs = safeckpt.run("prog.pt2", {"x": x}, weights="model.pt")    # torch.export program, CPU interpreter

The checks are the C++ library's (include/safeckpt/*.hpp): the restricted
pickle machine, the allowlist (PyTorch 2.6+'s weights-only set), storage
and view bounds, memory and size limits.
"""
from . import _safeckpt
from ._dcp import load_dcp
from ._api import (MAX_FILELIKE_BYTES, RawBitsArray, Report, get_unsafe_globals_in_checkpoint, load, safe_open,
                   scan)
from ._errors import (CheckpointError, MalformedCheckpointError, UnsafeGlobalError, UnsupportedCheckpointError)
from ._globals import add_safe_globals, clear_safe_globals, get_safe_globals, safe_globals
from ._run import run
from ._save import save
from ._sign import SignatureError, SignResult, VerifyResult, sign, verify
from ._tree import GlobalRef, SafeGlobalObject

__version__ = _safeckpt.__version__
HAS_CUDA = bool(_safeckpt.has_cuda)

__all__ = [
    "load", "load_dcp", "save", "safe_open", "scan", "Report", "get_unsafe_globals_in_checkpoint", "add_safe_globals",
    "safe_globals", "get_safe_globals", "clear_safe_globals", "CheckpointError", "UnsafeGlobalError",
    "MalformedCheckpointError", "UnsupportedCheckpointError", "GlobalRef", "SafeGlobalObject", "RawBitsArray",
    "MAX_FILELIKE_BYTES", "HAS_CUDA", "sign", "verify", "SignatureError", "SignResult", "VerifyResult", "run",
]
