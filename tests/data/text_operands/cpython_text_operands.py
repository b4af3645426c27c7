"""Observes how CPython's C unpickler reads non-canonical text operands.

Run with Debian's Python (the one beside PyTorch 1.13):
    /usr/bin/python3 tests/data/text_operands/cpython_text_operands.py
It prints the rows of tests/scanner/test_scan_text_operands.cpp: each operand
as a C++ string literal and what pickle.loads made of it (repr), or the
exception CPython raised. Observed with CPython 3.11.2 (Debian 12); the
output is committed beside this script as observed.txt.
"""
import pickle
import sys

# (opcode byte, operand bytes without the newline)
CASES = [
    (b"I", b"0x10"), (b"I", b"1_0"), (b"I", b"1\x00z"), (b"I", b"010"), (b"I", b" 7"),
    (b"I", b"+1"), (b"I", b"-0"), (b"I", b"0o17"), (b"I", b"0b11"), (b"I", b"0X1F"),
    (b"I", b"0x1_0"), (b"I", b"1 "), (b"I", b"\t8"), (b"I", b"1\r"), (b"I", b"1\x00"),
    (b"I", b"99999999999999999999_0"), (b"I", b"0x8000000000000000"), (b"I", b"-0x8000000000000000"),
    (b"I", b"\x00"),
    (b"L", b"0x10L"), (b"L", b"1_0L"), (b"L", b" 5 L"), (b"L", b"0b1\x00L"), (b"L", b"-0o7"),
    (b"F", b"1.5\x00x"), (b"F", b"-2.5\x00"),
    # CPython refuses these too: the scan must stop there (kMalformed).
    (b"I", b"0x"), (b"I", b"1__0"), (b"I", b"_1"), (b"L", b"010L"), (b"F", b" 1.5"), (b"F", b"1_0.5"),
]


def cxx(b):
    return '"' + "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else "\\x%02x\"\"" % c for c in b) + '"'


for op, arg in CASES:
    data = op + arg + b"\n."
    try:
        out = repr(pickle.loads(data))
    except Exception as e:  # noqa: BLE001 - we record what CPython says
        out = "!" + type(e).__name__
    print('{%s, %s, "%s"},' % (cxx(op), cxx(arg), out))

# GET/PUT indices: PUT <text> stores the INT, GET 1 reads it back.
for put in [b" 01", b"1_0", b"1\x00x", b"+1", b"0x1"]:
    data = b"(I7\np" + put + b"\n0g" + (b"10" if put == b"1_0" else b"1") + b"\n."
    try:
        out = repr(pickle.loads(data))
    except Exception as e:  # noqa: BLE001
        out = "!" + type(e).__name__
    print("PUT %s -> %s" % (cxx(put), out))
print("# " + sys.version.split()[0])
