"""The ``device`` setting: auto|cpu|cuda in every verb, an absent CUDA a one-line settings
error (exit 2, never a silent fallback), and CPU runs — the default — unchanged.

This suite runs on CPUs: what a CUDA machine does is checked only as far as choosing the device.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dfl_node.algorithms.messages import ModelMessage, on_device, parts_from_state
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.devices import device_problem, resolve_device
from dfl_node.learning.provision import provision
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.sim import run_fleet
from dfl_node.testbed.launcher import node_env
from tests.helpers.cli import error_lines, invoke

pytestmark = pytest.mark.usefixtures("clean_env")
NO_CUDA = not torch.cuda.is_available()
needs_no_cuda = pytest.mark.skipif(not NO_CUDA, reason="checks the error of a machine without CUDA")
# The verbs that train (partition takes no --device: it decides the shards, not where they are learnt from).
VERBS = {"simulate": ("simulate", "--quiet"), "testbed": ("testbed",),
         "start": ("start", "--id", "node-0", "--data", "shards/node-0")}


def test_cpu_is_the_default_of_every_config() -> None:
    assert SharedSettings().device == "cpu" and ExperimentConfig().learning.device == "cpu"
    assert NodeConfig(id="a", data=Path("d")).learning.device == "cpu"
    assert resolve_device("cpu") == torch.device("cpu")


@needs_no_cuda
def test_auto_is_the_cpu_on_a_machine_without_cuda() -> None:
    assert resolve_device("auto") == torch.device("cpu")
    assert device_problem("auto") is None and device_problem("cpu") is None


def test_auto_picks_cuda_where_torch_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert device_problem("cuda") is None


@needs_no_cuda
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_absent_cuda_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: str) -> None:
    monkeypatch.chdir(tmp_path)
    problem = device_problem("cuda")
    assert problem and "cuda is not available here" in problem and "\n" not in problem
    flag = invoke(*VERBS[verb], "--device", "cuda")
    assert flag.exit_code == 2, flag.output
    assert error_lines(flag) == [f"Error: --device: {problem}"]
    env = invoke(*VERBS[verb], env={"DFL_DEVICE": "cuda"})
    assert env.exit_code == 2 and error_lines(env) == [f"Error: DFL_DEVICE: {problem}"]
    (tmp_path / "run.yaml").write_text("device: cuda\n")
    file = invoke(*VERBS[verb], "--config", "run.yaml")
    assert file.exit_code == 2 and error_lines(file) == [f"Error: device (in run.yaml): {problem}"]


@needs_no_cuda
def test_a_config_naming_cuda_stays_readable_without_it() -> None:
    """Only loading settings to run checks the machine: a results file or a sweep's grid point of a
    GPU run validates anywhere, and a driver asked to run it says why it cannot."""
    config = ExperimentConfig.model_validate({"device": "cuda", "nodes": 2, "rounds": 1})
    with pytest.raises(ValueError, match="cuda is not available here"):
        run_fleet(config, "defkt")


def test_a_wrong_device_name_is_refused() -> None:
    result = invoke("simulate", "--quiet", "--device", "gpu")
    assert result.exit_code == 2 and "'gpu' is not one of 'auto', 'cpu', 'cuda'" in result.output


def test_the_testbed_hands_the_device_to_its_daemons() -> None:
    config = ExperimentConfig(device="auto")
    assert node_env(config.learning, config.per_algorithm)["DFL_DEVICE"] == "auto"


def test_simulations_on_cpu_and_auto_match_the_default() -> None:
    """Explicit cpu, and auto on this machine, run exactly the default simulation: same models, bit for bit."""
    base = dict(nodes=4, rounds=4, eval_every=2, batch_size=20, mkt_batch_size=20, lr=0.05, hidden=[32, 32])
    fleet = provision(ExperimentConfig(**base))
    for algorithm in ("defkt", "fullavg", "combo", "fedavg"):
        digests = []
        for device in ([None, "cpu", "auto"] if NO_CUDA else [None, "cpu"]):
            config = ExperimentConfig(**base, **({"device": device} if device else {}))
            digests.append([n.param_sha256 for n in run_fleet(config, algorithm, data=fleet).nodes])
        assert all(d == digests[0] for d in digests), algorithm


def test_data_and_messages_stay_put_where_they_already_are() -> None:
    """Moving to the device a tensor is already on is free: the CPU path copies nothing."""
    data = ArrayDataset(torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.int64), 2)
    assert data.to("cpu") is data and data.to(torch.device("cpu")) is data
    message = ModelMessage("a", 0, "defkt.model", 1, parts_from_state({"w": torch.ones(2, 2)}))
    assert on_device(message, "cpu") is message
    moved = on_device(message, "meta")  # another device: every part moved, the rest kept
    assert moved is not message and all(p.values.device.type == "meta" for p in moved.parts)
    assert (moved.sender, moved.purpose, [p.name for p in moved.parts]) == ("a", "defkt.model", ["w"])
