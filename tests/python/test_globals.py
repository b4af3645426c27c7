"""add_safe_globals / safe_globals / get_unsafe_globals_in_checkpoint, as torch's."""
import argparse
import json

import pytest

import safeckpt
from conftest import CORPUS


def test_unsafe_globals_match_torch_211():
    checked = 0
    for j in sorted(CORPUS.glob("*.json")):
        rec = json.loads(j.read_text())
        if "unsafe_globals" in rec and rec["unsafe_globals"] is not None:
            got = safeckpt.get_unsafe_globals_in_checkpoint(CORPUS / rec["file"])
            assert got == sorted(rec["unsafe_globals"]), rec["case"]
            checked += 1
    assert checked >= 20


def test_add_safe_globals_with_a_class_and_placeholder():
    path = CORPUS / "argparse_namespace.pt"
    with pytest.raises(safeckpt.UnsafeGlobalError, match="argparse.Namespace"):
        safeckpt.load(path)
    safeckpt.add_safe_globals([argparse.Namespace])
    assert safeckpt.get_safe_globals() == [argparse.Namespace]
    assert safeckpt.get_unsafe_globals_in_checkpoint(path) == []
    obj = safeckpt.load(path)
    found = [v for v in (obj.values() if isinstance(obj, dict) else [obj]) if isinstance(v, safeckpt.SafeGlobalObject)]
    assert found and found[0].name == "argparse.Namespace"
    assert not isinstance(found[0], argparse.Namespace)  # never constructed
    safeckpt.clear_safe_globals()
    assert safeckpt.get_safe_globals() == []
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load(path)


def test_safe_globals_scope_restored_on_exception():
    path = CORPUS / "argparse_namespace.pt"
    safeckpt.add_safe_globals(["collections.somethingelse"])
    with pytest.raises(KeyError):
        with safeckpt.safe_globals(["argparse.Namespace"]):
            assert "argparse.Namespace" in safeckpt.get_safe_globals()
            safeckpt.load(path)
            raise KeyError("boom")
    assert safeckpt.get_safe_globals() == ["collections.somethingelse"]
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load(path)


def test_overlapping_safe_globals_blocks_neither_drop_nor_leak_names():
    # Two threads' blocks overlap without nesting: A enters, B enters, A exits,
    # B exits (driven by hand here, so the order is certain). Restoring a
    # snapshot on exit (torch's way, and ours before) dropped B's name when A
    # exited and left A's name allowed for good when B exited.
    path = CORPUS / "argparse_namespace.pt"
    a = safeckpt.safe_globals(["argparse.Namespace"])
    b = safeckpt.safe_globals(["collections.somethingelse"])
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert safeckpt.get_safe_globals() == ["collections.somethingelse"]
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load(path)
    b.__exit__(None, None, None)
    assert safeckpt.get_safe_globals() == []
    # One name in two overlapping blocks stays until the last of them exits.
    a = safeckpt.safe_globals(["argparse.Namespace"])
    b = safeckpt.safe_globals(["argparse.Namespace"])
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    safeckpt.load(path)
    b.__exit__(None, None, None)
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load(path)


def test_add_safe_globals_inside_a_block_outlives_it():
    path = CORPUS / "argparse_namespace.pt"
    with safeckpt.safe_globals(["argparse.Namespace"]):
        safeckpt.add_safe_globals(["argparse.Namespace"])
    safeckpt.load(path)
    assert safeckpt.get_safe_globals() == ["argparse.Namespace"]


def test_allow_keyword_is_per_call():
    path = CORPUS / "python_values.pt"
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load(path)
    rec = json.loads((CORPUS / "python_values.json").read_text())
    from helpers import assert_matches_json
    obj = safeckpt.load(path, allow=[frozenset, slice])
    assert_matches_json(obj, rec["value_unrestricted"])
    with pytest.raises(safeckpt.UnsafeGlobalError):
        safeckpt.load(path)


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "torch.load", "subprocess.Popen"])
def test_hard_blocked_names_are_refused(name):
    with pytest.raises(ValueError):
        safeckpt.add_safe_globals([name])
    assert safeckpt.get_safe_globals() == []


def test_a_dangerous_file_stays_refused_even_when_named():
    # functools.partial is hard-blocked: naming it in an allowlist is refused
    # outright, and the file stays refused naming os.system.
    with pytest.raises(ValueError, match="cannot be allowlisted"):
        safeckpt.load(CORPUS / "mal_functools_partial.pt", allow=["functools.partial"])
    with pytest.raises(safeckpt.UnsafeGlobalError, match="os.system"):
        safeckpt.load(CORPUS / "mal_functools_partial.pt")
