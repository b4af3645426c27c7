"""safeckpt.sign / safeckpt.verify (OpenSSF Model Signing) over the C++ layer:
model_signing's own signed samples (tests/data/oms, copied from ../shared/oms),
models of real checkpoints, bundles cross-checked with the `safeckpt` CLI and
the independent checker tests/sign/oms_check.py (Debian python3-cryptography)."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import safeckpt
from conftest import CORPUS, DATA

OMS = DATA / "oms"
SAMPLES = OMS / "model-transparency" / "scripts" / "tests"
KEYS = SAMPLES / "keys" / "certificate"
PUB = KEYS / "signing-key-pub.pem"
CA = KEYS / "ca-cert.pem"
P256_KEY = OMS / "minted" / "p256-key.pem"
P256_PUB = OMS / "minted" / "p256-pub.pem"
CHECKER = DATA.parent / "sign" / "oms_check.py"


def make_model(tmp_path):
    m = tmp_path / "model"
    (m / "tokenizer").mkdir(parents=True)
    shutil.copyfile(CORPUS / "mlp_state_dict.pt", m / "model.pt")
    (m / "config.json").write_text('{"hidden": 4}')
    (m / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    return m


def test_reference_samples_verify():
    k = SAMPLES / "v1.1.0-elliptic-key"
    r = safeckpt.verify(k, k / "model.sig", public_key=PUB)
    assert isinstance(r, safeckpt.VerifyResult)
    assert r.files == {"signme-1": "verified", "signme-2": "verified"}
    assert r.method == "files" and r.hash_type == "sha256"
    assert len(r.root_digest) == 64
    c = SAMPLES / "v1.0.1-certificate"
    rc = safeckpt.verify(c, c / "model.sig", certificate_chain=[CA], ignore_paths=["ignore-me"])
    assert rc.files == {"signme-1": "verified", "signme-2": "verified"}
    # Single-file model: resource ".".
    s = SAMPLES / "v1.0.0-elliptic-key"
    assert safeckpt.verify(s / "signme-1", s / "model.sig", public_key=PUB).files == {".": "verified"}
    # Without ignoring it, the unsigned file fails verification.
    with pytest.raises(safeckpt.SignatureError) as e:
        safeckpt.verify(c, c / "model.sig", certificate_chain=CA)
    assert e.value.files["ignore-me"] == "extra"
    assert "1 extra: ignore-me" in str(e.value)


def test_wrong_trust_and_bad_bundles(tmp_path):
    k = SAMPLES / "v1.1.0-elliptic-key"
    with pytest.raises(safeckpt.SignatureError) as e:
        safeckpt.verify(k, k / "model.sig", public_key=P256_PUB)
    assert e.value.code == "integrity" and e.value.files == {} and "key mismatch" in str(e.value)
    c = SAMPLES / "v1.1.0-certificate"
    with pytest.raises(safeckpt.SignatureError):
        safeckpt.verify(c, c / "model.sig", certificate_chain=OMS / "minted" / "other-ca-cert.pem")
    garbage = tmp_path / "garbage.sig"
    garbage.write_text('{"mediaType":')
    with pytest.raises(safeckpt.SignatureError) as e:
        safeckpt.verify(k, garbage, public_key=PUB)
    assert e.value.code == "malformed"
    with pytest.raises(OSError):
        safeckpt.verify(k, tmp_path / "nope.sig", public_key=PUB)
    with pytest.raises(ValueError):
        safeckpt.verify(k, k / "model.sig")  # no trust
    with pytest.raises(ValueError):
        safeckpt.verify(k, k / "model.sig", public_key=PUB, certificate_chain=[CA])  # both
    # SignatureError is not a checkpoint refusal: code catching those does not swallow it.
    assert not issubclass(safeckpt.SignatureError, safeckpt.CheckpointError)


def test_modified_after_signing(tmp_path):
    m = tmp_path / "v1.1.0-elliptic-key"
    shutil.copytree(SAMPLES / "v1.1.0-elliptic-key", m)
    (m / "signme-1").write_bytes(b"signme-X\n")
    (m / "signme-2").unlink()
    (m / "added.bin").write_bytes(b"x")
    with pytest.raises(safeckpt.SignatureError) as e:
        safeckpt.verify(m, m / "model.sig", public_key=PUB)
    assert e.value.files == {"signme-1": "changed", "signme-2": "missing", "added.bin": "extra"}
    assert e.value.signer != ""
    msg = str(e.value)
    assert "1 changed: signme-1" in msg and "1 missing: signme-2" in msg and "1 extra: added.bin" in msg
    # ignore_unsigned_files drops the extra file; the others still fail.
    with pytest.raises(safeckpt.SignatureError) as e:
        safeckpt.verify(m, m / "model.sig", public_key=PUB, ignore_unsigned_files=True)
    assert "added.bin" not in e.value.files


def test_sign_then_verify_everywhere(tmp_path):
    m = make_model(tmp_path)
    sig = tmp_path / "model.sig"
    r = safeckpt.sign(m, sig, private_key=P256_KEY)
    assert isinstance(r, safeckpt.SignResult)
    assert [n for n, _, _ in r.resources] == ["config.json", "model.pt", "tokenizer/vocab.txt"]
    v = safeckpt.verify(m, sig, public_key=P256_PUB)
    assert v.root_digest == r.root_digest
    assert set(v.files.values()) == {"verified"}
    # The CLI verifies what Python signed; the independent checker too.
    cli = os.environ.get("SAFECKPT_CLI")
    if cli:
        out = subprocess.run([cli, "verify", str(m), "--signature", str(sig), "--public-key", str(P256_PUB)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    if importlib.util.find_spec("cryptography") is None:  # .ci/run installs python3-cryptography
        pytest.skip("the independent checker tests/sign/oms_check.py needs the cryptography package")
    chk = subprocess.run([sys.executable, str(CHECKER), "verify", str(m), str(sig), str(P256_PUB)],
                         capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    # Certificate method, shards, ignore_paths.
    cs = tmp_path / "cert.sig"
    rc = safeckpt.sign(m, cs, private_key=KEYS / "signing-key.pem", certificate=KEYS / "signing-key-cert.pem",
                       certificate_chain=[KEYS / "int-ca-cert.pem"], serialization="shards", shard_size=1000,
                       ignore_paths=["tokenizer"])
    assert all(":" in n for n, _, _ in rc.resources)
    assert not any(n.startswith("tokenizer/") for n, _, _ in rc.resources)
    vc = safeckpt.verify(m, cs, certificate_chain=CA)
    assert vc.method == "shards"
    # overwrite=False refuses an existing bundle; bad options are ValueError.
    with pytest.raises(FileExistsError):
        safeckpt.sign(m, sig, private_key=P256_KEY, overwrite=False)
    with pytest.raises(ValueError):
        safeckpt.sign(m, sig, private_key=P256_KEY, serialization="blocks")
    with pytest.raises(ValueError):
        safeckpt.sign(m, sig, private_key=P256_PUB)  # a public key cannot sign
    with pytest.raises(OSError):
        safeckpt.sign(m, sig, private_key=tmp_path / "nope.pem")
    # A change after signing, then verify raises.
    (m / "config.json").write_text('{"hidden": 5}')
    with pytest.raises(safeckpt.SignatureError) as e:
        safeckpt.verify(m, sig, public_key=P256_PUB)
    assert e.value.files["config.json"] == "changed"
