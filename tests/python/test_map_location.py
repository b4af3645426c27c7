"""map_location with torch.load's meaning (str, torch.device, dict, callable,
None = the recorded location), file-likes to CUDA and safe_open(device=...),
against the local torch.load (Debian's 1.13 here; 2.11 on the GPU machine).

Files with storages recorded at other locations than "cpu" are written by the
local torch.save itself: a tagger registered through PyTorch's own
torch.serialization.register_package names the location of chosen storages
(what torch.save of a CUDA tensor records, "cuda:1"), so no GPU is needed to
make them and the bytes are torch's.
"""
import io
import pickle

import pytest
import torch

import safeckpt
from conftest import CORPUS
from helpers import assert_same_as_torch, storage_ptr

_TAGS = {}  # storage data_ptr -> the location torch.save records for it


def _tagger(storage):
    return _TAGS.get(storage.data_ptr())


def _no_restore(storage, location):
    return None  # torch's own deserializers restore


torch.serialization.register_package(1, _tagger, _no_restore)

HAS_GPU = torch.cuda.is_available()


def save_tagged(path, obj, tags):
    """torch.save(obj) with the storages of tags' tensors recorded at tags' locations."""
    _TAGS.clear()
    _TAGS.update({t.data_ptr(): loc for t, loc in tags})
    try:
        torch.save(obj, path)
    finally:
        _TAGS.clear()


@pytest.fixture
def mixed(tmp_path):
    """A state_dict with two storages recorded at "cuda:1" (one shared by two views) and one at "cpu"."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g)
    b = torch.randn(6, generator=g)
    e = torch.arange(10, dtype=torch.int64)
    obj = {"w": w, "w_row": w[1], "w_t": w.t(), "b": b, "e": e}
    p = tmp_path / "mixed.pt"
    save_tagged(p, obj, [(w, "cuda:1"), (b, "cuda:1")])
    return p


def torch_load(p, **kw):
    return torch.load(p, weights_only=True, **kw)


def devices(obj):
    return {k: v.device.type for k, v in obj.items()}


@pytest.mark.parametrize("loc", [{"cuda:1": "cpu"}, {"cuda:1": "cpu", "cpu": "cpu"}, "cpu", torch.device("cpu")])
def test_maps_to_cpu_like_torch(mixed, loc):
    ref = torch_load(mixed, map_location=loc)
    ours = safeckpt.load(mixed, map_location=loc)
    assert_same_as_torch(ref, ours)
    assert set(devices(ours).values()) == {"cpu"}
    # a file object takes the same route
    with open(mixed, "rb") as f:
        assert_same_as_torch(ref, safeckpt.load(f, map_location=loc))


def test_dict_values_may_be_devices(mixed):
    # torch's own dict values must be strings (it calls location.startswith);
    # safeckpt also takes torch.device values and maps them like their str()
    assert_same_as_torch(torch_load(mixed, map_location={"cuda:1": "cpu"}),
                         safeckpt.load(mixed, map_location={"cuda:1": torch.device("cpu")}))


@pytest.mark.skipif(HAS_GPU, reason="checks the refusals of a machine without a GPU")
@pytest.mark.parametrize("loc", [None, {"cpu": "cuda:0"}, "cuda", torch.device("cuda:0")])
def test_cuda_without_gpu_refused_like_torch(mixed, loc):
    # torch's weights-only load re-raises the RuntimeError as an UnpicklingError with its text
    with pytest.raises((RuntimeError, pickle.UnpicklingError)) as ref:
        torch_load(mixed, map_location=loc)
    assert "torch.cuda.is_available() is False" in str(ref.value)
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.is_available\(\) is False"):
        safeckpt.load(mixed, map_location=loc)
    with pytest.raises(RuntimeError, match=r"is_available\(\) is False"):  # file objects too, not only paths
        safeckpt.load(io.BytesIO(mixed.read_bytes()), map_location=loc)


@pytest.mark.skipif(HAS_GPU, reason="checks the refusals of a machine without a GPU")
def test_safe_open_cuda_without_gpu():
    with pytest.raises(RuntimeError, match=r"is_available\(\) is False"):
        safeckpt.safe_open(CORPUS / "mlp_state_dict.pt", device="cuda")
    with pytest.raises(RuntimeError, match=r"is_available\(\) is False"):
        safeckpt.safe_open(CORPUS / "mlp_state_dict.pt", device=0)


def test_bad_arguments():
    p = CORPUS / "mlp_state_dict.pt"
    with pytest.raises(ValueError):
        safeckpt.load(p, map_location="tpu")
    with pytest.raises(ValueError):
        safeckpt.load(p, map_location={"cpu": "tpu"})
    with pytest.raises(TypeError):
        safeckpt.load(p, map_location={"cpu": 0})
    with pytest.raises(TypeError):
        safeckpt.load(p, map_location=3)
    with pytest.raises(ValueError, match="framework='pt'"):
        safeckpt.load(p, map_location="cuda", framework="np")
    with pytest.raises(ValueError, match="framework='pt'"):
        safeckpt.load(p, map_location=lambda s, loc: s, framework="np")
    with pytest.raises(ValueError):
        safeckpt.safe_open(p, device="tpu")
    with pytest.raises(ValueError, match="framework='pt'"):
        safeckpt.safe_open(p, framework="np", device="cuda")
    np_sd = safeckpt.load(p, map_location="cpu", framework="np")
    assert np_sd["0.weight"].shape == tuple(torch_load(p)["0.weight"].shape)


def test_recorded_location_we_do_not_restore(tmp_path):
    w = torch.ones(3)
    p = tmp_path / "tpu.pt"
    save_tagged(p, {"w": w}, [(w, "tpu:0")])
    with pytest.raises((RuntimeError, pickle.UnpicklingError), match="don't know how to restore"):
        torch_load(p)
    with pytest.raises(safeckpt.UnsupportedCheckpointError, match="'tpu:0'") as info:
        safeckpt.load(p)
    assert isinstance(info.value, pickle.UnpicklingError)
    assert_same_as_torch(torch_load(p, map_location={"tpu:0": "cpu"}),
                         safeckpt.load(p, map_location={"tpu:0": "cpu"}))


def test_callable_sees_what_torch_passes(mixed):
    seen = {"torch": [], "ours": []}

    def spy(who):
        def fn(storage, location):
            seen[who].append((type(storage).__name__, storage.device.type, storage.nbytes(), location))
            return storage
        return fn

    ref = torch_load(mixed, map_location=spy("torch"))
    ours = safeckpt.load(mixed, map_location=spy("ours"))
    assert_same_as_torch(ref, ours)
    assert sorted(seen["ours"]) == sorted(seen["torch"])
    assert len(seen["torch"]) == 3 and {s[3] for s in seen["torch"]} == {"cpu", "cuda:1"}  # as save_tagged recorded


def test_callable_result_is_used(mixed):
    def fn(storage, location):
        if location == "cuda:1":
            return storage.clone().fill_(7)
        return None  # the recorded location: cpu here

    ref = torch_load(mixed, map_location=fn)
    ours = safeckpt.load(mixed, map_location=fn)
    assert_same_as_torch(ref, ours)
    assert storage_ptr(ours["w"]) == storage_ptr(ours["w_row"])  # one result per storage, shared by its views
    assert ours["w"].view(torch.uint8).eq(7).all()


def test_callable_must_return_a_storage_of_the_same_size(mixed):
    with pytest.raises(TypeError, match="UntypedStorage"):
        safeckpt.load(mixed, map_location=lambda s, loc: "cpu")
    with pytest.raises(ValueError, match="bytes"):
        safeckpt.load(mixed, map_location=lambda s, loc: torch.UntypedStorage(1))


def test_callable_with_mmap_false_gets_owned_copies(mixed):
    kept = []
    safeckpt.load(mixed, map_location=lambda s, loc: kept.append(s) or s, mmap=False)
    assert len(kept) == 3
    ref = torch_load(mixed, map_location=lambda s, loc: s)
    assert_same_as_torch(ref, safeckpt.load(mixed, map_location=lambda s, loc: s, mmap=False))


def test_meta_like_torch(mixed):
    ref = torch_load(mixed, map_location="meta")
    ours = safeckpt.load(mixed, map_location="meta")
    for k, r in ref.items():
        o = ours[k]
        assert o.device.type == r.device.type == "meta", k
        assert (o.dtype, o.shape, o.stride(), o.storage_offset()) == (r.dtype, r.shape, r.stride(),
                                                                       r.storage_offset()), k


def test_safe_open_device_cpu_forms():
    p = CORPUS / "mlp_state_dict.pt"
    ref = torch_load(p)
    for dev in ("cpu", torch.device("cpu"), None):
        with safeckpt.safe_open(p, device=dev) as f:
            assert torch.equal(f.get_tensor("0.weight"), ref["0.weight"])


# ---- on a machine with a GPU (tests/python/device/run_device.sh) ----
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")


@gpu
@pytest.mark.parametrize("loc", [{"cpu": "cuda:0", "cuda:1": "cuda:0"}, "cuda:0", "cuda", torch.device("cuda"),
                                 {"cuda:1": "cuda:0"}])
def test_gpu_maps_like_torch(mixed, loc):
    ref = torch_load(mixed, map_location=loc)
    ours = safeckpt.load(mixed, map_location=loc)
    assert_same_as_torch(ref, ours)
    assert devices(ours) == devices(ref)
    with open(mixed, "rb") as f:  # file objects go to the GPU too
        ours_f = safeckpt.load(f, map_location=loc)
    assert_same_as_torch(ref, ours_f)
    assert devices(ours_f) == devices(ref)


@gpu
def test_gpu_callable_and_corpus_file_object():
    p = CORPUS / "views_shared_storage.pt"
    ref = torch_load(p, map_location=lambda s, loc: s.cuda(0))
    ours = safeckpt.load(p, map_location=lambda s, loc: s.cuda(0))
    assert_same_as_torch(ref, ours)
    assert_same_as_torch(torch_load(p, map_location="cuda"), safeckpt.load(p.read_bytes(), map_location="cuda"))


@gpu
def test_gpu_safe_open():
    p = CORPUS / "mlp_state_dict.pt"
    ref = torch_load(p, map_location="cuda")
    with safeckpt.safe_open(p, device="cuda:0") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            assert t.device.type == "cuda" and torch.equal(t, ref[k]), k


@pytest.mark.skipif(not safeckpt.HAS_CUDA, reason="module built without CUDA (no _Checkpoint.to_device)")
def test_to_device_hands_over_only_an_unviewed_host_checkpoint():
    # the native step behind map_location={"cpu": "cuda:0"} and file objects:
    # the parsed checkpoint moves to the GPU loader, so no buffer may still view it
    from safeckpt import _safeckpt as native
    ck = native.load_path(str(CORPUS / "mlp_state_dict.pt"), [])
    buf = ck.storage_buffer(0, False)
    with pytest.raises(native.Error, match="no buffer refers to"):
        ck.to_device("cuda:0")
    del buf
    if not HAS_GPU:
        with pytest.raises(native.Error, match="device"):
            ck.to_device("cuda:0")
        with pytest.raises(native.Error, match="no buffer refers to"):  # handed over, even though it failed
            ck.to_device("cuda:0")
