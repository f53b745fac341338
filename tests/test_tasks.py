"""Tasks: what a fleet learns besides classes. Regression and anomaly detection train, fuse by Def-KT's
mutual knowledge transfer and are judged through the node's task; classification is what it always was; an
algorithm that needs classes refuses another task at start, in one line."""

from __future__ import annotations

import copy
import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dfl_node.algorithms import NodeContext, make_algorithm
from dfl_node.algorithms.base import sample_pairs
from dfl_node.algorithms.plan import Step
from dfl_node.learning.algorithm_settings import BUILTIN_TASK_NAMES, SharedSettings
from dfl_node.learning.data_files import read_samples
from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.datasets import ArrayDataset, load_dataset
from dfl_node.learning.fusion import mkt_losses
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.tasks import BUILTIN_TASKS, Anomaly, Classification, roc_auc, task_of
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from tests.helpers.cli import START, error_lines, invoke

FEATURES, TARGETS = 6, 2
NODE = {"id": "node-0", "data": "shards/node-0"}  # what a node's settings need besides those under test


def linear_problem(seed: int, n: int, shift: float = 0.0) -> ArrayDataset:
    """y = W x + b (+ noise), the same W for every device; ``shift`` moves a device's inputs (non-IID)."""
    weights = torch.Generator().manual_seed(99)
    w, b = torch.randn(FEATURES, TARGETS, generator=weights), torch.randn(TARGETS, generator=weights)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g) + shift
    y = x @ w + b + 0.05 * torch.randn(n, TARGETS, generator=g)
    return ArrayDataset(x, y.float(), TARGETS)


def test_the_settings_know_every_built_in_task() -> None:
    assert set(BUILTIN_TASK_NAMES) == set(BUILTIN_TASKS)
    assert isinstance(task_of(SharedSettings()), Classification)
    assert task_of(SharedSettings(task="regression", regression_loss="huber")).loss is F.huber_loss
    assert task_of(SharedSettings(task="anomaly", anomaly_quantile=0.9)) == Anomaly(quantile=0.9)


def test_classification_fuses_with_000s_losses_bit_for_bit() -> None:
    z1, z2, y = torch.randn(8, 10), torch.randn(8, 10), torch.randint(0, 10, (8,))
    ours = Classification().mutual_losses(z1, z2, y)
    assert all(torch.equal(a, b) for a, b in zip(ours, mkt_losses(z1, z2, y), strict=True))
    assert Classification().loss is F.cross_entropy


def test_roc_auc_is_the_chance_a_positive_outscores_a_negative() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (40,), generator=g).double()  # many ties
    flags = torch.randint(0, 2, (40,), generator=g)
    pairs = [(p, n) for p, n in itertools.product(scores[flags == 1], scores[flags == 0])]
    expected = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert math.isclose(roc_auc(scores, flags), expected)
    assert roc_auc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0])) == 0.5


def test_a_def_kt_fleet_of_regressors_beats_each_device_alone() -> None:
    """Four devices whose inputs cover different parts of the space (a shift each): Def-KT's pairs fuse with the
    task's distance (MSE) in place of KL, and every device ends with a lower RMSE on a test set of the whole space
    than it reaches on its own data alone, for the same number of local passes."""
    config = SharedSettings(task="regression", model="mlp", hidden=[16], lr=0.02, batch_size=16, mkt_batch_size=16)
    spec, test = ModelSpec("mlp", (16,)), linear_problem(100, 400, shift=0.0)
    shards = [linear_problem(i, 60, shift=i - 1.5) for i in range(4)]
    defkt = make_algorithm("defkt", config)
    fleet = [NodeContext(f"node-{i}", spec.build((FEATURES,), TARGETS, seed=0), spec, shard, shard.subset(range(10)),
                         config) for i, shard in enumerate(shards)]
    alone = [copy.deepcopy(ctx) for ctx in fleet]
    task = fleet[0].task
    before = task.evaluate(fleet[0].model, test)
    assert before.metrics.keys() == {"rmse", "mae", "r2"} and before.score == before.metrics["rmse"]
    for round_ in range(40):
        for group in sample_pairs(config.seed, round_, [c.node_id for c in fleet], pairs=2):
            sender, receiver = (fleet[int(i[-1])] for i in (group.senders[0], group.aggregator))
            step = Step(round_, group)
            defkt.aggregate(receiver, step, [defkt.transmit(sender, step)])
        for ctx in alone:  # as many passes as the busiest node made
            ctx.model.load_state_dict(ctx.trained_copy(round_).state_dict())
    fleet_rmse = [task.evaluate(ctx.model, test).score for ctx in fleet]
    alone_rmse = [task.evaluate(ctx.model, test).score for ctx in alone]
    assert all(f < a for f, a in zip(fleet_rmse, alone_rmse, strict=True)), (fleet_rmse, alone_rmse)
    assert max(fleet_rmse) < before.score / 3


def test_an_autoencoder_flags_what_lies_off_the_normal_samples() -> None:
    """Normal samples lie on a 2-D plane of an 8-D space; anomalies off it. Trained on the normal ones (a flagged
    sample of the training data is left out), the reconstruction error ranks the anomalies first."""
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(2, 8, generator=g)
    normal = torch.randn(400, 2, generator=g) @ basis
    odd = torch.randn(40, 8, generator=g) * normal.std()
    train = ArrayDataset(torch.cat([normal[:300], odd[:5]]), torch.tensor([0] * 300 + [1] * 5), 2)
    held_out = ArrayDataset(torch.cat([normal[300:], odd[5:]]), torch.tensor([0] * 100 + [1] * 35), 2)
    config = SharedSettings(task="anomaly", model="mlp", hidden=[4], lr=0.05, batch_size=20, local_epochs=60)
    task = task_of(config)
    spec = ModelSpec("mlp", (4,))
    ctx = NodeContext("node-0", spec.build((8,), task.outputs(train), seed=0), spec, train, train.subset(range(50)),
                      config)
    assert len(ctx.train) == 300 and ctx.train.y.shape == (300, 8)  # normal samples, each its own target
    untrained = task.evaluate(ctx.model, held_out)
    ctx.model.load_state_dict(ctx.trained_copy(0).state_dict())
    judged = task.evaluate(ctx.model, held_out)
    assert judged.score > 0.95 > untrained.score and judged.metrics["auc"] == judged.score
    threshold = Anomaly(quantile=0.99).threshold(ctx.model, ArrayDataset(normal[300:], torch.zeros(100).long(), 2))
    flagged = Anomaly().scores(ctx.model, held_out) > threshold
    assert flagged[100:].float().mean() > 0.8 and flagged[:100].float().mean() < 0.1


def test_an_algorithm_that_needs_classes_refuses_another_task_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    algorithm, why = "defkt-select", "class scores"  # 001's selection: the one built-in that needs classes
    monkeypatch.chdir(tmp_path)
    for verb in (("simulate", "--quiet"), START):
        result = invoke(*verb, "--algorithm", algorithm, "--task", "regression")
        assert result.exit_code == 2, result.output
        [line] = error_lines(result)
        assert re.search(f"{algorithm} learns classification only .*{why}.*not regression", line), line
    with pytest.raises(ValueError, match="learns classification only"):
        ExperimentConfig.model_validate({"algorithms": ["defkt", algorithm], "task": "anomaly"})
    for agnostic in ("defkt", "fullavg", "combo", "fedavg", "gossip", "dfml", "fml", "heterofl", "fairavg"):
        NodeConfig.model_validate({"algorithm": agnostic, "task": "regression", **NODE})


def test_accuracy_gates_and_wsm_need_classes() -> None:
    with pytest.raises(ValueError, match="--min-accuracy compare accuracies: the regression task has none"):
        NodeConfig.model_validate({"task": "regression", "min_accuracy": 0.5, **NODE})
    with pytest.raises(ValueError, match="--relative-gate compare accuracies"):
        ExperimentConfig.model_validate({"task": "anomaly", "relative_gate": 0.1})
    with pytest.raises(ValueError, match="supervision wsm weights classes"):
        SharedSettings(task="regression", supervision="wsm")


def test_a_csv_file_gives_its_target_columns_as_float_targets(tmp_path: Path) -> None:
    path = tmp_path / "meter.csv"
    path.write_text("h0,h1,h2,next0,next1\n1,2,3,4.5,5.5\n2,3,4,5.5,6.5\n")
    samples = read_samples(path, DataFormat(target_column=["next0", "next1"]), targets=True)
    assert samples.x.tolist() == [[1, 2, 3], [2, 3, 4]] and samples.y.dtype == np.float32
    assert samples.y.tolist() == [[4.5, 5.5], [5.5, 6.5]] and samples.num_classes == 2
    one = read_samples(path, DataFormat(label_column="next1"), targets=True)  # default: the label column
    assert one.y.tolist() == [[5.5], [6.5]] and one.x.shape == (2, 4)


def test_digits_classify_as_they_always_did() -> None:
    train, test = load_dataset("digits")
    model = ModelSpec("mlp", (16,)).build((1, 8, 8), 10, seed=0)
    ours = Classification().evaluate(model, test)
    assert ours.metrics == {"accuracy": ours.score} and 0 <= ours.score <= 1 and ours.samples == len(test)
