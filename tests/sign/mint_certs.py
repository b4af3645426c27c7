#!/usr/bin/python3
"""Mints the extra keys and certificates of tests/data/oms/minted/ (run once; outputs committed).

Debian's python3-cryptography, signed by the upstream test intermediate CA
(tests/data/oms/model-transparency/scripts/tests/keys/certificate/int-ca-*.pem):
  expired-cert.pem      leaf for signing-key.pem, valid 2020-01-01 .. 2021-01-01 (expired)
  nousage-cert.pem      leaf for signing-key.pem, KeyUsage keyEncipherment only, no EKU
  p256-key.pem, p521-key.pem   EC private keys (PKCS#8) for the other two curves
  p256-pub.pem, p521-pub.pem   their public keys
  other-ca-cert.pem     a self-signed CA that signed none of the above (wrong trust store)
Usage: /usr/bin/python3 tests/sign/mint_certs.py
"""
import datetime
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID, ExtendedKeyUsageOID

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = os.path.join(HERE, "..", "data", "oms", "model-transparency", "scripts", "tests", "keys", "certificate")
OUT = os.path.join(HERE, "..", "data", "oms", "minted")


def pem_after_text(path):
    data = open(path, "rb").read()
    return data[data.index(b"-----BEGIN"):]


def main():
    os.makedirs(OUT, exist_ok=True)
    int_key = serialization.load_pem_private_key(pem_after_text(os.path.join(KEYS, "int-ca-priv.pem")), None)
    int_cert = x509.load_pem_x509_certificate(pem_after_text(os.path.join(KEYS, "int-ca-cert.pem")))
    leaf_key = serialization.load_pem_private_key(pem_after_text(os.path.join(KEYS, "signing-key.pem")), None)

    def leaf(not_before, not_after, key_usage_sign):
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "minted-leaf")]))
             .issuer_name(int_cert.subject)
             .public_key(leaf_key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(not_before).not_valid_after(not_after)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                 int_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value), False))
        if key_usage_sign:
            b = b.add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), True)
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), False)
        else:
            b = b.add_extension(x509.KeyUsage(False, False, True, False, False, False, False, False, False), True)
        return b.sign(int_key, hashes.SHA256())

    dt = datetime.datetime
    certs = {
        "expired-cert.pem": leaf(dt(2020, 1, 1), dt(2021, 1, 1), True),
        "nousage-cert.pem": leaf(dt(2025, 6, 1), dt(2035, 4, 1), False),
    }
    for name, c in certs.items():
        open(os.path.join(OUT, name), "wb").write(c.public_bytes(serialization.Encoding.PEM))
    for name, curve in (("p256", ec.SECP256R1()), ("p521", ec.SECP521R1())):
        k = ec.generate_private_key(curve)
        open(os.path.join(OUT, name + "-key.pem"), "wb").write(k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        open(os.path.join(OUT, name + "-pub.pem"), "wb").write(k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "other-ca")])
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(dt(2025, 1, 1))
          .not_valid_after(dt(2035, 1, 1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA384()))
    open(os.path.join(OUT, "other-ca-cert.pem"), "wb").write(ca.public_bytes(serialization.Encoding.PEM))


if __name__ == "__main__":
    main()
