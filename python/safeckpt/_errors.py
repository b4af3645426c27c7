"""Exceptions of the safeckpt package and the translation of native errors.

Like torch.load(weights_only=True), refusals are pickle.UnpicklingError
subclasses, so code written for torch's refusals catches ours too.
"""
import pickle

from . import _safeckpt as _native


class CheckpointError(pickle.UnpicklingError):
    """A checkpoint safeckpt refused or could not read.

    Attributes: ``code`` (the C++ ErrorCode name: "malformed",
    "disallowed_global", ...), ``record`` (zip record or stream), ``offset``
    (byte offset in it, or None), ``opcode`` (pickle opcode name or "").
    """

    def __init__(self, message, code="", record="", offset=None, opcode=""):
        super().__init__(message)
        self.code = code
        self.record = record
        self.offset = offset
        self.opcode = opcode


class UnsafeGlobalError(CheckpointError):
    """The file imports or calls a global outside the safe globals (the
    policy codes disallowed_global / disallowed_operation). The message names
    every such global and, when it is harmless data, how to allow it."""


class MalformedCheckpointError(CheckpointError):
    """The bytes are not a valid checkpoint (also: a Limits cap was hit)."""


class UnsupportedCheckpointError(CheckpointError):
    """A valid file of a kind safeckpt does not load (TorchScript, PT2
    programs, compressed wrappers, tensor kinds the installed framework cannot
    represent)."""


_BY_CODE = {
    "disallowed_global": UnsafeGlobalError,
    "disallowed_operation": UnsafeGlobalError,
    "malformed": MalformedCheckpointError,
    "limit_exceeded": MalformedCheckpointError,
    "unsupported": UnsupportedCheckpointError,
}


def translate(err):
    """The public exception for a native ``_safeckpt.Error``."""
    code, _number, message, record, offset, opcode, full = err.args
    if code == "io":
        return OSError(full)
    if code == "exists":
        return FileExistsError(full)
    if code == "invalid_argument":
        return ValueError(full)
    if code in ("device", "internal"):  # a CUDA failure; a bug in safeckpt
        return RuntimeError(full)
    cls = _BY_CODE.get(code, CheckpointError)
    del message
    return cls(full, code=code, record=record, offset=offset, opcode=opcode)


class native_errors:
    """Context manager: re-raises native errors as the public exceptions."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and isinstance(exc, _native.Error):
            raise translate(exc) from None
        return False
