"""``dfl-node export`` of a node that runs a model of the user's own: a ``package.module:factory`` on
PYTHONPATH, or an installed entry-point plugin. The export runs as an operator runs it, a fresh ``dfl-node``
process (nothing of the user's imported yet), whose ONNX file onnxruntime runs to the logits and probabilities
(``/predict``'s) of the node's model, rebuilt here from its checkpoint with the registry. Where the user's code is
not there, the export is one line, exit 2, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import onnxruntime
import pytest
import torch
from safetensors.torch import load_file

from dfl_node.learning.datasets import load_shard
from dfl_node.learning.export import probabilities
from dfl_node.learning.models import ModelSpec
from tests.helpers.fleet import daemon
from tests.helpers.plugins import install_plugin

# A model of the user's own, as the forecasting example's harmodel: a tiny dilated temporal convolution over the
# sample's values.
USER_MODULE = '''
import math

from torch import nn


def tiny_tcn(sample_shape, num_classes):
    return nn.Sequential(nn.Flatten(2), nn.Conv1d(sample_shape[0], 4, 3, padding=2, dilation=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * math.prod(sample_shape[1:]), num_classes))
'''
REFERENCE, PLUGIN = "export_user_tcn:tiny_tcn", "export-tiny"  # the two ways to name a model of one's own


class UserNode(NamedTuple):
    """The state folder of a node that runs ``model``, a model of the user's own whose code is in ``site``."""

    model: str
    state_dir: Path
    site: Path


@pytest.fixture(params=[REFERENCE, PLUGIN])
async def user_node(request: pytest.FixtureRequest, fleet_shards: Path, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> UserNode:
    """A daemon's node configured with ``request.param`` (its code on ``sys.path``, as ``dfl-node start`` finds
    it on PYTHONPATH), checkpointed with weights moved off its ``w0``: an export must carry the checkpoint's
    weights, not a rebuild from the seed."""
    site = install_plugin(tmp_path / "site", "export_plugins", models={PLUGIN: "tiny"})
    (site / "export_user_tcn.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(site))
    node = daemon(id="node-0", data=fleet_shards / "node-0", model=request.param, hidden=None, mdns=False,
                  state_dir=tmp_path / "state", evaluate=False).node
    generator = torch.Generator().manual_seed(46)
    with torch.no_grad():
        for parameter in node.learner.ctx.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator), alpha=0.1)
    await node.save()
    node.learner.checkpoint.lock.release()
    return UserNode(request.param, tmp_path / "state", site)


def export(state_dir: Path, out: Path, *, pythonpath: Path | None) -> subprocess.CompletedProcess[str]:
    """``dfl-node export STATE_DIR --out OUT`` as an operator runs it, in a process of its own (nothing of the
    user's imported yet) with ``pythonpath`` on its PYTHONPATH, from ``out``'s folder (``python -m`` puts the
    working folder on ``sys.path``: the user's code is not there)."""
    paths = [str(pythonpath)] if pythonpath else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "dfl_node", "export", str(state_dir), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=out.parent)


def test_a_user_models_onnx_export_gives_the_nodes_logits_and_predictions(
        user_node: UserNode, fleet_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "w0.onnx"
    done = export(user_node.state_dir, out, pythonpath=user_node.site)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith(f"wrote {out} (onnx): {user_node.model} for samples [1, 8, 8], 10 classes; "
                                  "node-0 at round 0")
    x = load_shard(fleet_shards / "test.safetensors").x
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = torch.from_numpy(session.run(["logits"], {"samples": x.numpy()})[0])
    assert session.get_modelmeta().custom_metadata_map["spec"] == user_node.model
    model = ModelSpec.parse(user_node.model, configured=True).build((1, 8, 8), 10)  # the node's model, by the
    model.load_state_dict(load_file(str(user_node.state_dir / "model.safetensors")))  # registry, not the exporter
    with torch.no_grad():
        expected = model.eval()(x)
    assert logits.shape == (len(x), 10) and logits.std() > 0.1  # a model's answers, not a constant
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.softmax(logits, dim=1), probabilities(model, x, 10), rtol=1e-4, atol=1e-5)


def test_a_user_model_whose_code_is_not_there_is_one_line_exit_2(user_node: UserNode, tmp_path: Path) -> None:
    out = tmp_path / "w0.onnx"
    done = export(user_node.state_dir, out, pythonpath=None)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.lower().startswith("error: ")]
    if user_node.model == REFERENCE:
        assert line == ("error: cannot load export_user_tcn:tiny_tcn: ModuleNotFoundError: No module named "
                        "'export_user_tcn' (install its package, or put the folder that holds it on PYTHONPATH)")
    else:
        assert line.startswith("Error: Invalid value for ")  # click's, about STATE_DIR
        assert (f"{user_node.state_dir / 'model.safetensors'}: this installation cannot build its model (unknown "
                "model spec 'export-tiny'") in line
    assert not out.exists()
