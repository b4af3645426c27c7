"""Zips with duplicate member names, and which copy PyTorch reads.

Run with Debian's PyTorch 1.13 (/usr/bin/python3), from this directory:
    /usr/bin/python3 gen_zip_duplicates.py
PyTorch's zip reader (caffe2/serialize/inline_container.cc, getRecordID ->
miniz mz_zip_reader_locate_file) binary-searches the central directory
heap-sorted by lower-cased name; the sort is not stable, so which of several
same-named entries it returns depends on the archive's layout (not always the
first). Each file holds copies of archive/data.pkl that differ: copy k loads
as {"copy": k}, and copy 1 also calls builtins.len("ab") (harmless, but not
an allowed global), so a scan can show which copy holds what. torch.load
(weights_only=False, the 1.13 default) says which copy it read; the central
directory index of that copy is written to observed.txt.
"""
import io
import pickle
import sys
import warnings
import zipfile

import torch

warnings.simplefilter("ignore")  # zipfile warns about duplicate names


class Len:
    def __reduce__(self):
        return (len, ("ab",))


def copy_pickle(k):
    d = {"copy": k}
    if k == 1:
        d["n"] = Len()
    return pickle.dumps(d, protocol=2)


def build(path, copies, extra):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for k in range(1, copies + 1):
            z.writestr("archive/data.pkl", copy_pickle(k))
        for i in range(extra):
            z.writestr("archive/extra%d" % i, b"x")
        z.writestr("archive/version", b"3\n")
    names = [i.filename for i in zipfile.ZipFile(path).infolist()]
    got = torch.load(path)["copy"]
    index = [i for i, n in enumerate(names) if n == "archive/data.pkl"][got - 1]
    return got, index


with open("observed.txt", "w") as out:
    out.write("# torch %s, python %s\n" % (torch.__version__, sys.version.split()[0]))
    for name, copies, extra in [("dup2.pt", 2, 0), ("dup3_extra7.pt", 3, 7), ("dup5.pt", 5, 0)]:
        got, index = build(name, copies, extra)
        out.write("%s: %d copies of archive/data.pkl; torch.load read copy %d = central entry #%d\n"
                  % (name, copies, got, index))
print(open("observed.txt").read())
