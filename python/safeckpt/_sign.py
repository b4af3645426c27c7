"""OpenSSF Model Signing: safeckpt.sign / safeckpt.verify over the C++ layer
(include/safeckpt/sign.hpp), the bundles `model_signing` 1.1 writes and
verifies (``model.sig``), key and certificate methods.

    safeckpt.sign("model_dir", "model_dir/model.sig", private_key="key.pem")
    r = safeckpt.verify("model_dir", "model_dir/model.sig", public_key="pub.pem")
    r.signer, r.files        # {"model.pt": "verified", ...}

A model is a directory or a single file. Paths in ``ignore_paths`` are
relative to the model root (the C++ API's convention; the ``safeckpt`` CLI,
like model_signing's, also accepts them relative to the current directory).
"""
import os

from . import _safeckpt as _native
from ._errors import translate


class SignatureError(Exception):
    """The model does not verify against the bundle.

    Raised by ``safeckpt.verify`` when the bundle is malformed, refused or
    unsupported (e.g. a keyless Sigstore bundle), when its signature, key,
    certificate chain, certificate validity or root digest fails, when the
    model cannot be hashed as signed (a symlink, a file changing while it is
    hashed), or when files changed, are missing or are not signed.

    Attributes: ``code`` (the C++ ErrorCode name: "integrity" for a failed
    verification, "malformed", "limit_exceeded" or "unsupported" for a bundle
    or model refused as such), ``files`` (dict resource name -> "verified" /
    "changed" / "missing" / "extra"; empty when the signature itself failed),
    ``signer`` (who signed, when the signature verified; else "").
    """

    def __init__(self, message, code="integrity", files=None, signer=""):
        super().__init__(message)
        self.code = code
        self.files = dict(files or {})
        self.signer = signer


class VerifyResult:
    """What ``safeckpt.verify`` returns when the model verified.

    ``signer`` (a one-line description of the key or certificate), ``method``
    ("files" or "shards"), ``hash_type`` ("sha256", ...), ``root_digest``
    (lowercase hex SHA-256 of the statement's subject), ``files`` (dict
    resource name -> "verified"; shard names are "path:start:end")."""

    __slots__ = ("signer", "method", "hash_type", "root_digest", "files")

    def __init__(self, signer, method, hash_type, root_digest, files):
        self.signer = signer
        self.method = method
        self.hash_type = hash_type
        self.root_digest = root_digest
        self.files = files

    def __repr__(self):
        return "VerifyResult(signer=%r, method=%r, files=%d)" % (self.signer, self.method, len(self.files))


class SignResult:
    """What ``safeckpt.sign`` returns: ``root_digest`` (lowercase hex) and
    ``resources`` (list of (name, algorithm, hex digest) in the bundle's order)."""

    __slots__ = ("root_digest", "resources")

    def __init__(self, root_digest, resources):
        self.root_digest = root_digest
        self.resources = resources

    def __repr__(self):
        return "SignResult(root_digest=%r, resources=%d)" % (self.root_digest, len(self.resources))


def _paths(v):
    if v is None:
        return []
    if isinstance(v, (str, bytes, os.PathLike)):
        return [os.fsdecode(v)]
    return [os.fsdecode(p) for p in v]


_SIGNATURE_CODES = ("integrity", "malformed", "limit_exceeded", "unsupported")


def verify(model, signature, *, public_key=None, certificate_chain=None, ignore_paths=(),
           ignore_unsigned_files=False, threads=0):
    """Verifies a model (directory or file) against an OpenSSF Model Signing
    bundle, as ``safeckpt verify`` does: the signature with ``public_key``
    (PEM path; key method) or ``certificate_chain`` (trusted CA PEM path(s);
    certificate method) — exactly one — then every file re-hashed and compared
    with the signed digests. ``ignore_paths``: paths relative to the model
    root to skip; ``ignore_unsigned_files``: files the bundle does not list
    are neither hashed nor reported; ``threads``: hashing threads (0 = all
    cores).

    Returns a VerifyResult. Raises SignatureError (see there) when the model
    does not verify, OSError when the model, bundle or a PEM file cannot be
    read, ValueError for no or both trust forms or an unusable PEM."""
    pub = "" if public_key is None else os.fsdecode(public_key)
    chain = _paths(certificate_chain)
    try:
        signer, method, hash_type, root, files = _native.verify_model(
            os.fsdecode(model), os.fsdecode(signature), pub, chain, _paths(ignore_paths), bool(ignore_unsigned_files),
            int(threads))
    except _native.Error as e:
        code = e.args[0]
        if code in _SIGNATURE_CODES:
            raise SignatureError(e.args[6], code=code) from None
        raise translate(e) from None
    files = dict(files)
    bad = {n: s for n, s in files.items() if s != "verified"}
    if bad:
        parts = []
        for status in ("changed", "missing", "extra"):
            names = sorted(n for n, s in bad.items() if s == status)
            if names:
                parts.append("%d %s: %s" % (len(names), status, ", ".join(names)))
        raise SignatureError("%s: the model differs from what %s signed: %s" % (os.fsdecode(model), signer,
                                                                                  "; ".join(parts)),
                             files=files, signer=signer)
    return VerifyResult(signer, method, hash_type, root, files)


def sign(model, signature, *, private_key, certificate=None, certificate_chain=(), ignore_paths=(),
         serialization="files", shard_size=1_000_000_000, threads=0, overwrite=True):
    """Signs a model (directory or file) and writes the bundle to
    ``signature`` atomically, as ``safeckpt sign`` does: key method with
    ``private_key`` alone (EC P-256/P-384/P-521 PEM path), certificate method
    with ``certificate`` (leaf PEM) and ``certificate_chain`` (intermediate
    PEM path(s), put in the bundle). ``serialization`` "files" (what
    model_signing verifies) or "shards" (``shard_size`` bytes each);
    ``ignore_paths`` relative to the model root (recorded in the bundle).

    Returns a SignResult. Raises ValueError (bad key or certificate, a
    certificate not matching the key, an empty model, bad options, a model
    that cannot be signed as it is: a symlink, a name that is not UTF-8, a
    limit), OSError
    (unreadable model or PEM, a write failure), FileExistsError (the
    signature exists and ``overwrite`` is False)."""
    cert = "" if certificate is None else os.fsdecode(certificate)
    try:
        root, resources = _native.sign_model(os.fsdecode(model), os.fsdecode(signature), os.fsdecode(private_key),
                                             cert, _paths(certificate_chain), _paths(ignore_paths),
                                             str(serialization), int(shard_size), int(threads), bool(overwrite))
    except _native.Error as e:
        if e.args[0] in ("io", "exists", "invalid_argument"):
            raise translate(e) from None
        raise ValueError(e.args[6]) from None  # a model that cannot be signed as it is (symlink, name, limit)
    return SignResult(root, resources)
