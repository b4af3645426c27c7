"""safeckpt.run: torch.export programs made by PyTorch 2.11 (tests/data/pt2-2.11,
copied from the shared corpus) on the engine's CPU reference interpreter,
compared with the eager outputs PyTorch recorded beside them
(`<m>.io.safetensors`: input.<name>, output.<i>.cpu), within the corpus
JSON's tolerance (max|out-ref| <= atol + rtol*max|ref|, float32 floored at
1e-4 as the C++ tests do). Weights bound from a checkpoint and refusals
(an op outside the allowlist, inputs that do not fit) go through the same
call."""
import json
import shutil
import zipfile

import numpy as np
import pytest
import torch

import safeckpt
from conftest import DATA

PT2 = DATA / "pt2-2.11"


def _io(model):
    with safeckpt.safe_open(PT2 / f"{model}.io.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _tol(model):
    t = json.loads((PT2 / f"{model}.json").read_text())["tolerance"]["program_vs_eager_cpu"]
    return max(t["atol"], 1e-4), max(t["rtol"], 1e-4)


def _check(outs, io, atol, rtol):
    refs = sorted((k for k in io if k.startswith("output.") and k.endswith(".cpu")),
                  key=lambda k: int(k.split(".")[1]))
    assert len(outs) == len(refs)
    for out, k in zip(outs, refs):
        ref = io[k]
        assert isinstance(out, torch.Tensor)
        assert out.dtype == ref.dtype and out.shape == ref.shape, k
        diff = (out.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
        assert diff <= atol + rtol * ref.double().abs().max().item(), (k, diff)


@pytest.mark.parametrize("program", ["mlp.train", "mlp.core", "cnn.train", "cnn.core", "gpt2.core"])
def test_run_matches_eager(program):
    model = program.split(".")[0]
    io = _io(model)
    inputs = {k[len("input."):]: v for k, v in io.items() if k.startswith("input.")}
    outs = safeckpt.run(PT2 / f"{program}.pt2", inputs)
    _check(outs, io, *_tol(model))


def test_run_numpy_inputs_and_outputs():
    io = _io("mlp")
    outs = safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"].numpy()}, framework="np")
    assert isinstance(outs[0], np.ndarray)
    ref = io["output.0.cpu"].numpy()
    assert outs[0].shape == ref.shape
    assert np.abs(outs[0] - ref).max() <= 1e-4 + 1e-4 * np.abs(ref).max()


def _archive_weights(program):
    """The archive's raw weights (use_pickle false) as torch tensors by FQN,
    read with zipfile + the config's tensor_meta (dense row-major here)."""
    out = {}
    with zipfile.ZipFile(PT2 / f"{program}.pt2") as z:
        root = program
        cfg = json.loads(z.read(f"{root}/data/weights/model_weights_config.json"))["config"]
        for fqn, e in cfg.items():
            assert not e["use_pickle"]
            assert e["tensor_meta"]["dtype"] == 7  # float32 (torch/_export/serde/schema.py ScalarType.FLOAT)
            sizes = [s["as_int"] for s in e["tensor_meta"]["sizes"]]
            raw = z.read(f"{root}/data/weights/{e['path_name']}")
            out[fqn] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(sizes).clone()
    return out


def test_run_weights_from_a_checkpoint(tmp_path):
    io = _io("mlp")
    w = _archive_weights("mlp.core")
    ck = tmp_path / "weights.pt"
    safeckpt.save(w, ck)
    own = safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"]})
    bound = safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"]}, weights=ck)
    assert torch.equal(own[0], bound[0])
    # Other weights give other outputs: the checkpoint is what ran.
    w2 = {k: v * 2 for k, v in w.items()}
    safeckpt.save(w2, tmp_path / "doubled.pt")
    doubled = safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"]}, weights=tmp_path / "doubled.pt")
    assert not torch.equal(own[0], doubled[0])
    # A missing and an unexpected name are both reported (strict binding).
    renamed = dict(w)
    first = sorted(renamed)[0]
    renamed["not_in_the_program"] = renamed.pop(first)
    safeckpt.save(renamed, tmp_path / "renamed.pt")
    with pytest.raises(ValueError) as e:
        safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"]}, weights=tmp_path / "renamed.pt")
    assert first in str(e.value) and "not_in_the_program" in str(e.value)


def test_run_refuses_inputs_that_do_not_fit():
    io = _io("mlp")
    with pytest.raises(ValueError):
        safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"][:, :64].contiguous()})
    with pytest.raises(ValueError):
        safeckpt.run(PT2 / "mlp.core.pt2", {"x": io["input.x"].double()})
    with pytest.raises(ValueError):
        safeckpt.run(PT2 / "mlp.core.pt2", {})


def test_run_refuses_an_op_outside_the_allowlist(tmp_path):
    """The same archive with one node's target renamed to an op the engine
    does not run: refused by policy before anything runs, naming the op."""
    src = PT2 / "mlp.core.pt2"
    dst = tmp_path / "mlp.core.pt2"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("models/model.json"):
                text = data.decode()
                assert "torch.ops.aten.gelu.default" in text
                data = text.replace("torch.ops.aten.gelu.default", "torch.ops.aten._foreach_exp.default", 1).encode()
            zout.writestr(info, data)
    io = _io("mlp")
    with pytest.raises(safeckpt.UnsafeGlobalError) as e:
        safeckpt.run(dst, {"x": io["input.x"]})
    assert "_foreach_exp" in str(e.value)


def test_run_is_not_a_checkpoint_loader(tmp_path):
    """A checkpoint is not a program: a clear error, not a crash."""
    shutil.copy(DATA / "corpus" / "torch-2.11" / "mlp_state_dict.pt", tmp_path / "x.pt2")
    with pytest.raises(safeckpt.CheckpointError):
        safeckpt.run(tmp_path / "x.pt2", {})
