#!/usr/bin/python3
"""Independent OMS check (issue 15): verifies and signs model_signing bundles
with Debian's python3-cryptography, following ../shared/docs/oms-format.md —
not safeckpt's code. Used by tests/sign/test_sign_cli.cpp.

  oms_check.py verify MODEL BUNDLE PUBKEY_PEM [--ignore P ...]   exit 0 verified, 1 not
  oms_check.py sign MODEL PRIVKEY_PEM OUT                        key method, files, sha256
  oms_check.py schema BUNDLE SCHEMA_DIR                          bundle + statement validate
Rules (oms-format.md): bundle = compact JSON {mediaType v0.3, verificationMaterial.publicKey.hint,
dsseEnvelope{payload b64, payloadType in-toto, signatures[1]}}; signature = DER ECDSA over
PAE "DSSEv1 28 application/vnd.in-toto+json <len> <payload>" with the curve's hash; hint =
sha256 hex of the PEM SubjectPublicKeyInfo; root digest = sha256 of the concatenated raw
resource digests in listed order; names relative '/'-paths ("." for a single file), files
sorted by name; files = sha256 of the file, shards = "<path>:<start>:<end>" of shard_size
pieces (algorithm "sha256-sharded-<N>"); git files at the root and ignore_paths skipped.
"""
import base64
import hashlib
import json
import os
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

PAYLOAD_TYPE = "application/vnd.in-toto+json"
GIT = [".git", ".gitattributes", ".github", ".gitignore"]


def pae(payload):
    return b"DSSEv1 %d %s %d " % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload)) + payload


def curve_hash(key):
    return {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}[key.curve.key_size]


def pem_after_text(path):
    data = open(path, "rb").read()
    return data[data.index(b"-----BEGIN"):]


def hint(pub):
    return hashlib.sha256(pub.public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def walk(model, ignore):
    if os.path.isfile(model):
        return [(".", model)]
    out = []
    for root, dirs, files in os.walk(model):
        for f in files:
            full = os.path.join(root, f)
            rel = os.path.relpath(full, model).replace(os.sep, "/")
            if any(rel == p or rel.startswith(p + "/") for p in ignore):
                continue
            out.append((rel, full))
    return sorted(out, key=lambda e: e[0].encode())


def hash_model(model, ser, ignore):
    out = {}
    for name, full in walk(model, ignore):
        data = open(full, "rb").read()
        if ser["method"] == "files":
            out[name] = hashlib.sha256(data).hexdigest()
        else:
            n = int(ser["shard_size"])
            for s in range(0, len(data), n):
                e = min(len(data), s + n)
                out["%s:%d:%d" % (name, s, e)] = hashlib.sha256(data[s:e]).hexdigest()
    return out


def verify(model, bundle_path, pub_path, extra_ignore):
    bundle = json.load(open(bundle_path))
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json", "mediaType"
    env = bundle["dsseEnvelope"]
    assert env["payloadType"] == PAYLOAD_TYPE, "payloadType"
    assert len(env["signatures"]) == 1, "one signature"
    payload = base64.b64decode(env["payload"], validate=True)
    sig = base64.b64decode(env["signatures"][0]["sig"], validate=True)
    pub = serialization.load_pem_public_key(pem_after_text(pub_path))
    h = bundle["verificationMaterial"]["publicKey"].get("hint")
    if h is not None and h != hint(pub):
        print("key mismatch")
        return 1
    try:
        pub.verify(sig, pae(payload), ec.ECDSA(curve_hash(pub)))
    except InvalidSignature:
        print("signature does not verify")
        return 1
    st = json.loads(payload)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://model_signing/signature/v1.0"
    assert len(st["subject"]) == 1
    res = st["predicate"]["resources"]
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in res)).hexdigest()
    if root != st["subject"][0]["digest"]["sha256"]:
        print("root digest mismatch")
        return 1
    ser = st["predicate"]["serialization"]
    ignore = GIT + ser.get("ignore_paths", []) + extra_ignore
    local = hash_model(model, ser, ignore)
    signed = {r["name"]: r["digest"] for r in res}
    if local != signed:
        print("model differs: local %s signed %s" % (sorted(local.items()), sorted(signed.items())))
        return 1
    names = [r["name"] for r in res]
    if ser["method"] == "files" and names != sorted(names, key=lambda n: n.encode()):
        print("resources not in code point order")
        return 1
    print("verified %d resources" % len(res))
    return 0


def sign(model, key_path, out):
    key = serialization.load_pem_private_key(pem_after_text(key_path), None)
    ignore = list(GIT)
    sig_abs = os.path.abspath(out)
    if os.path.isdir(model) and sig_abs.startswith(os.path.abspath(model) + os.sep):
        ignore.append(os.path.relpath(sig_abs, model))
    digests = hash_model(model, {"method": "files"}, ignore)
    res = [{"name": n, "algorithm": "sha256", "digest": d} for n, d in sorted(digests.items(), key=lambda e: e[0].encode())]
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in res)).hexdigest()
    st = {"_type": "https://in-toto.io/Statement/v1",
          "subject": [{"name": os.path.basename(os.path.normpath(model)), "digest": {"sha256": root}}],
          "predicateType": "https://model_signing/signature/v1.0",
          "predicate": {"resources": res,
                        "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                          "ignore_paths": sorted(ignore)}}}
    payload = json.dumps(st).encode()
    sig = key.sign(pae(payload), ec.ECDSA(curve_hash(key.public_key())))
    bundle = {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
              "verificationMaterial": {"publicKey": {"hint": hint(key.public_key())}, "tlogEntries": []},
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                               "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}
    open(out, "w").write(json.dumps(bundle, separators=(",", ":")))
    return 0


def schema(bundle_path, schema_dir):
    import jsonschema
    store = {}
    for f in os.listdir(schema_dir):
        s = json.load(open(os.path.join(schema_dir, f)))
        store[s["$id"]] = s
    def validate(doc, sid):
        resolver = jsonschema.RefResolver(base_uri=sid, referrer=store[sid], store=store)
        jsonschema.Draft202012Validator(store[sid], resolver=resolver).validate(doc)
    bundle = json.load(open(bundle_path))
    validate(bundle, "https://model_signing/bundle/v1.0/schema")
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    validate(st, "https://model_signing/statement/v1.0/schema")
    print("schemas: bundle and statement valid")
    return 0


def main(argv):
    if argv[1] == "verify":
        ignore = argv[6:] if len(argv) > 5 and argv[5] == "--ignore" else []
        return verify(argv[2], argv[3], argv[4], ignore)
    if argv[1] == "sign":
        return sign(argv[2], argv[3], argv[4])
    if argv[1] == "schema":
        return schema(argv[2], argv[3])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
