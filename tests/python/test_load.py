"""safeckpt.load over the real corpus, against torch.load and the corpus JSON."""
import io
import json
import pickle

import numpy as np
import pytest
import torch

import safeckpt
from conftest import CORPUS
from helpers import assert_matches_json, assert_same_as_torch, storage_ptr

CASES = [line.strip() for line in (CORPUS / "MANIFEST.txt").read_text().splitlines()[1:] if line.strip()]


def record(case):
    return json.loads((CORPUS / f"{case}.json").read_text())


def torch_load(path):
    try:
        return True, torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - torch 1.13 raises many kinds
        return False, None


def agrees_with_211(ref, expected):
    """False where torch 1.13 reads a file differently from 2.11 (big_endian:
    1.13 swaps int64 storages in 4-byte units), so 1.13 is no reference there."""
    try:
        assert_matches_json(ref, expected)
        return True
    except AssertionError:
        return False


def test_manifest_is_the_whole_corpus():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES)
def test_corpus_file(case):
    rec = record(case)
    path = CORPUS / rec["file"]
    unrestricted = "value_unrestricted" in rec and case.startswith("protocol_") and case != "protocol_0"
    if rec["weights_only_ok"] or unrestricted:
        ours = safeckpt.load(path)
        expected = rec["value"] if rec["weights_only_ok"] else rec["value_unrestricted"]
        ok, ref = torch_load(path)
        if ok and agrees_with_211(ref, expected):
            # Debian's torch reads it as 2.11 did: the same Python objects
            assert_same_as_torch(ref, ours)
        # and always what PyTorch 2.11 recorded (protocols 1/4/5: same objects
        # as protocol 2 with opcodes 2.11's unpickler lacks; C++ corpus_load.cpp)
        assert_matches_json(ours, expected)
    else:
        with pytest.raises(pickle.UnpicklingError) as info:
            safeckpt.load(path)
        assert isinstance(info.value, safeckpt.CheckpointError)
        names = rec.get("unsafe_globals") or []
        if names:
            assert isinstance(info.value, safeckpt.UnsafeGlobalError), case
        for g in names:
            assert g in str(info.value), f"{case}: refusal does not name {g}"


def test_some_files_compare_with_torch_113():
    # the comparison with the local torch is not vacuous
    compared = []
    for c in CASES:
        rec = record(c)
        ok, ref = torch_load(CORPUS / rec["file"])
        if rec["weights_only_ok"] and ok and agrees_with_211(ref, rec["value"]):
            compared.append(c)
    assert len(compared) >= 8, compared


@pytest.mark.parametrize("case,cls", [
    ("mal_os_system", safeckpt.UnsafeGlobalError),
    ("mal_inst", safeckpt.UnsafeGlobalError),
    ("protocol_0", safeckpt.UnsafeGlobalError),
    ("bad_missing_storage", safeckpt.MalformedCheckpointError),
    ("bad_rebuild_args", safeckpt.MalformedCheckpointError),
    ("bad_storage_too_small", safeckpt.MalformedCheckpointError),
])
def test_refusal_classes(case, cls):
    with pytest.raises(cls) as info:
        safeckpt.load(CORPUS / record(case)["file"])
    assert info.value.code in ("disallowed_global", "disallowed_operation", "malformed")


def test_refusal_says_where():
    with pytest.raises(safeckpt.UnsafeGlobalError) as info:
        safeckpt.load(CORPUS / "mal_hidden_in_state_dict.pt")
    assert info.value.record == "archive/data.pkl" and info.value.opcode == "GLOBAL"
    assert info.value.offset is not None


def test_weights_only_false_is_refused():
    with pytest.raises(ValueError, match="never executes"):
        safeckpt.load(CORPUS / "mlp_state_dict.pt", weights_only=False)


def test_views_share_memory_and_writes_stay_private():
    path = CORPUS / "views_shared_storage.pt"
    before = path.read_bytes()
    v = safeckpt.load(path)
    assert storage_ptr(v["base"]) == storage_ptr(v["row"]) == storage_ptr(v["t"])
    v["base"][2, 0] = 1234.0  # copy-on-write mapping: no fault, visible through the views
    assert v["row"][0].item() == 1234.0
    assert path.read_bytes() == before
    w = safeckpt.load(path, mmap=False)
    assert w["row"][0].item() == 16.0
    assert storage_ptr(w["base"]) == storage_ptr(w["row"])


def test_tensors_outlive_everything_else():
    t = safeckpt.load(CORPUS / "mlp_state_dict.pt")["0.weight"]
    import gc
    gc.collect()
    ref = torch.load(CORPUS / "mlp_state_dict.pt", weights_only=True)["0.weight"]
    assert torch.equal(t, ref)


def test_file_like_and_bytes():
    data = (CORPUS / "mlp_state_dict.pt").read_bytes()
    ref = torch.load(CORPUS / "mlp_state_dict.pt", weights_only=True)
    assert_same_as_torch(ref, safeckpt.load(io.BytesIO(data)))
    assert_same_as_torch(ref, safeckpt.load(data))
    with open(CORPUS / "mlp_state_dict.pt", "rb") as f:
        assert_same_as_torch(ref, safeckpt.load(f))


def test_file_like_cap(monkeypatch):
    monkeypatch.setattr(safeckpt._api, "MAX_FILELIKE_BYTES", 100)
    with pytest.raises(MemoryError):
        safeckpt.load(io.BytesIO((CORPUS / "mlp_state_dict.pt").read_bytes()))


def test_numpy_framework():
    ref = torch.load(CORPUS / "mlp_state_dict.pt", weights_only=True)
    sd = safeckpt.load(CORPUS / "mlp_state_dict.pt", framework="np")
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    for k, v in ref.items():
        assert np.array_equal(v.numpy(), sd[k])
    # The default copies (as torch.load): an array the process owns, written without touching the file.
    own = safeckpt.load(CORPUS / "mlp_state_dict.pt", framework="np", mmap=False)["0.weight"]
    before = float(own[0, 0])
    own[0, 0] = before + 1.0
    again = safeckpt.load(CORPUS / "mlp_state_dict.pt", framework="np")["0.weight"]
    assert float(again[0, 0]) == before


def test_bfloat16_in_numpy_is_raw_bits():
    rec = record("all_dtypes")
    sd = safeckpt.load(CORPUS / "all_dtypes.pt", framework="np")
    assert_matches_json(sd, rec["value"])  # values via the raw bits
    bf = [v for v in sd.values() if getattr(v, "torch_dtype", None) == "bfloat16"]
    assert bf and bf[0].dtype == np.uint16


def test_map_location():
    sd = safeckpt.load(CORPUS / "mlp_state_dict.pt", map_location="cpu")
    assert sd["0.weight"].device.type == "cpu"
    with pytest.raises(ValueError):
        safeckpt.load(CORPUS / "mlp_state_dict.pt", map_location="tpu")
    # the rest of torch's map_location meaning: test_map_location.py


def test_self_referencing_list_stays_a_cycle(tmp_path):
    a = [1]
    a.append(a)
    p = tmp_path / "cycle.pt"
    safeckpt.save({"a": a}, p)
    got = safeckpt.load(p)["a"]
    assert got[0] == 1 and got[1] is got
