#!/usr/bin/env python3
"""Writes the issue-11 memory bomb (helper membudget): a torch.save-shaped zip
whose deflated archive/data.pkl (~510 KB) inflates to 512 MiB of NONE opcodes
(NONE POP pairs, so the stack stays shallow and every NONE is a new value node).
Usage: python3 bench/membudget_bombs.py OUT.pt [MIB]
Measured with: /usr/bin/time -v build/cli/safeckpt inspect OUT.pt (see RESULTS.md).
"""
import sys, zipfile

out = sys.argv[1]
mib = int(sys.argv[2]) if len(sys.argv) > 2 else 512
size = mib << 20
pkl = b"\x80\x02" + b"N0" * ((size - 4) // 2) + b"N."
with zipfile.ZipFile(out, "w") as z:
    z.writestr(zipfile.ZipInfo("archive/data.pkl"), pkl, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    z.writestr(zipfile.ZipInfo("archive/version"), b"3\n")
