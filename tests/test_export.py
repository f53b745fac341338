"""``dfl-node export``: a node's trained model, from its state folder, as files an application loads without
dfl-node. Each export is loaded in a subprocess where ``dfl_node`` cannot be imported (TorchScript with
``torch.jit.load``, ONNX with onnxruntime) and must give, for every sample of the test set, the class the node's
model gives, rebuilt here from its checkpoint by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dfl_node.learning.datasets import load_shard
from dfl_node.learning.export import TrainedModel
from dfl_node.learning.models import ModelSpec, param_digest
from dfl_node.node.model.persistence import Checkpoint, read_trained
from tests.helpers.cli import error_lines, invoke
from tests.helpers.fleet import FLEET, daemon, simulated

APPLICATION = """
import json, sys
sys.modules["dfl_node"] = None  # no dfl-node here: importing it raises ImportError
import numpy as np
kind, model_path, samples_path = sys.argv[1:]
x = np.load(samples_path)["x"]
if kind == "torchscript":
    import torch
    card = {"dfl-node.json": ""}
    model = torch.jit.load(model_path, _extra_files=card)
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()
    card = json.loads(card["dfl-node.json"])
else:
    import onnxruntime
    session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"samples": x})[0]
    card = session.get_modelmeta().custom_metadata_map
print(json.dumps({"classes": logits.argmax(1).tolist(), "card": card,
                  "dfl_node_imported": any(name.startswith("dfl_node.") for name in sys.modules)}))
"""


@pytest.fixture(scope="module")
def trained(fleet_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state folder of a node of a simulated fleet, after its rounds."""
    workdir = tmp_path_factory.mktemp("fleet")
    simulated(FLEET.model_copy(update={"rounds": 6, "local_epochs": 10, "mkt_epochs": 5}), "defkt", workdir)
    return workdir / "defkt" / "node-1"


def classes_in_process(state_dir: Path, x: torch.Tensor) -> list[int]:
    """The node's model, rebuilt from its checkpoint with the registry (not with the export code)."""
    model = ModelSpec.parse("mlp:32,32").build((1, 8, 8), 10)
    model.load_state_dict(load_file(str(state_dir / "model.safetensors")))
    with torch.no_grad():
        return model.eval()(x).argmax(1).tolist()


@pytest.mark.parametrize(("fmt", "suffix"), [("torchscript", ".pt"), ("onnx", ".onnx")])
def test_an_export_gives_the_nodes_classes_without_dfl_node(trained: Path, fleet_shards: Path, tmp_path: Path,
                                                            fmt: str, suffix: str) -> None:
    out = tmp_path / f"model{suffix}"
    result = invoke("export", str(trained), "--out", str(out))  # the format from the suffix
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out} ({fmt}): mlp:32,32 for samples [1, 8, 8], 10 classes; node-1 at "
                                    "round 6")
    test = load_shard(fleet_shards / "test.safetensors")
    np.savez(tmp_path / "test.npz", x=test.x.numpy())
    ran = subprocess.run([sys.executable, "-c", APPLICATION, fmt, str(out), str(tmp_path / "test.npz")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    expected = classes_in_process(trained, test.x)
    assert answer["classes"] == expected and not answer["dfl_node_imported"]
    assert sum(c == y for c, y in zip(expected, test.y.tolist())) / len(test) > 0.7  # a trained model
    card = answer["card"]
    assert (card["spec"], card["sample_shape"], card["num_classes"], card["node"]) == ("mlp:32,32", "[1, 8, 8]",
                                                                                      "10", "node-1")
    assert card["sha256"] == read_trained(trained).card.sha256


def test_the_safetensors_export_is_the_checkpoints_model_with_its_card(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.bin"
    assert invoke("export", str(trained), "--out", str(out), "--format", "safetensors").exit_code == 0
    exported = TrainedModel.from_bytes(out.read_bytes())
    saved = load_file(str(trained / "model.safetensors"))
    assert exported.state.keys() == saved.keys() and all(torch.equal(exported.state[k], saved[k]) for k in saved)
    assert exported.card.round == json.loads((trained / "state.json").read_text())["round"] == 6
    assert exported.card.sha256 == param_digest(exported.module.state_dict())


async def test_dfml_exports_its_peak_model(fleet_shards: Path, tmp_path: Path) -> None:
    """The model a node reports as its own is what it serves and exports: DFML's peak model, not its regular one."""
    node = daemon(id="node-0", data=fleet_shards / "node-0", algorithm="dfml", http_port=8080, mdns=False,
                  state_dir=tmp_path / "state", evaluate=False).node
    with torch.no_grad():
        for parameter in node.learner.ctx.auxiliary["peak"].parameters():
            parameter.mul_(0.5)  # the peak model, unlike the regular one
    await node.save()
    node.learner.checkpoint.lock.release()
    peak = param_digest(node.learner.ctx.auxiliary["peak"].state_dict())
    assert peak != param_digest(node.learner.ctx.model.state_dict())
    assert read_trained(tmp_path / "state").card.sha256 == (await node.committed_model()).card.sha256 == peak


def test_a_folder_without_a_described_checkpoint_is_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old"
    Checkpoint(old).save({"w": torch.ones(2, 2)}, "fp", {"round": 3})  # as checkpoints were written before
    for folder, reason in [(old, "does not say how to rebuild its model"), (tmp_path, "holds no readable checkpoint")]:
        result = invoke("export", str(folder), "--out", str(tmp_path / "m.onnx"))
        assert result.exit_code == 2
        [line] = error_lines(result)
        assert reason in line, line
    assert not (tmp_path / "m.onnx").exists()
    unknown = invoke("export", str(old), "--out", str(tmp_path / "model.bin"))
    assert unknown.exit_code == 2 and "cannot tell the format from 'model.bin'" in error_lines(unknown)[0]
