"""pytest setup for the safeckpt Python package tests (ctest label `python`).

ctest runs them with PYTHONPATH=<build>/python (the package assembled in
the build tree) and SAFECKPT_TEST_DATA=<source>/tests/data; run by hand:
    PYTHONPATH=build/python SAFECKPT_TEST_DATA=tests/data /usr/bin/python3 -m pytest tests/python
The reference is Debian's PyTorch (1.13) torch.load(weights_only=True) where
it reads a file, else what PyTorch 2.11 recorded in the corpus JSON.
"""
import os
import pathlib
import warnings

import pytest

warnings.filterwarnings("ignore", category=UserWarning)

DATA = pathlib.Path(os.environ.get("SAFECKPT_TEST_DATA", pathlib.Path(__file__).resolve().parents[1] / "data"))
CORPUS = DATA / "corpus" / "torch-2.11"


@pytest.fixture(autouse=True)
def _no_leftover_safe_globals():
    import safeckpt
    safeckpt.clear_safe_globals()
    yield
    safeckpt.clear_safe_globals()
