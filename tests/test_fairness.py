"""002: eqs. 4–5 by hand (with the clipping edges), the fairness-aware aggregation, and the fairness view
of a run's results (its scenarios' partitions are in test_data_partitions.py)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dfl_node.algorithms import Group, NodeContext, Step, make_algorithm
from dfl_node.cli import cli
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fairness import fairness_weight
from dfl_node.learning.models import ModelSpec
from dfl_node.results import EvalRecord, NodeResult, RunResult, fairness, write_results
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import ConfigError, load_config


@pytest.mark.parametrize(("own", "other", "settings", "expected"), [
    (0.9, 0.6, {}, 0.3 / 1.8 + 0.5),  # pef_max = 0.9: 2/3 for the better own model
    (0.6, 0.9, {}, 0.5 - 0.3 / 1.8),  # 1/3: the pulled model is better on this node's data
    (0.8, 0.8, {}, 0.5),  # equal: plain average
    (1.0, 0.0, {}, 1.0),  # edge: the pulled model gets nothing right here: keep the own model
    (0.0, 0.5, {}, 0.0),  # edge: the own model gets nothing right: take the pulled one
    (0.0, 0.0, {}, 0.5),  # pef_max = 0: nothing tells them apart, P_i = C
    (0.9, 0.6, {"c": 0.7}, 0.3 / 1.8 + 0.7),  # another C, inside [0, 1]: no clipping
    (1.0, 0.0, {"c": 0.7}, 1.0),  # 1.2 clipped to 1
    (0.0, 1.0, {"c": 0.2}, 0.0),  # −0.3 clipped to 0
    (1.0, 0.0, {"low": 0.1, "high": 0.9}, 0.9),  # a narrower interval always keeps some of both
    (0.0, 1.0, {"low": 0.1, "high": 0.9}, 0.1),
    (0.5, 0.4, {"low": 0.1, "high": 0.9}, 0.1 / 1.0 + 0.5),
])
def test_eq4_weights_by_hand(own: float, other: float, settings: dict, expected: float) -> None:
    p_i = fairness_weight(own, other, **settings)
    assert p_i == pytest.approx(expected, abs=1e-12)
    assert 0.0 <= p_i <= 1.0 and 1.0 - p_i == pytest.approx(1.0 - expected)  # eq. 5: P_j = 1 − P_i


def test_eq4_refuses_what_is_not_an_accuracy_or_an_interval() -> None:
    for args in ((1.2, 0.5), (0.5, -0.1), (float("nan"), 0.5)):
        with pytest.raises(ValueError, match="accuracy"):
            fairness_weight(*args)
    with pytest.raises(ValueError, match="interval"):
        fairness_weight(0.5, 0.5, low=0.8, high=0.2)
    with pytest.raises(ConfigError, match="fair_weight_min"):
        load_config(ExperimentConfig, overrides={"fair_weight_min": 0.8, "fair_weight_max": 0.2})


SPEC = ModelSpec("mlp", (8,))


def _node(label_of_model: int, config: SharedSettings) -> NodeContext:
    """A node whose data is all class 3, holding a constant predictor of ``label_of_model``."""
    data = ArrayDataset(torch.randn(20, 1, 8, 8, generator=torch.Generator().manual_seed(label_of_model)),
                        torch.full((20,), 3), 10)
    model = SPEC.build((1, 8, 8), 10)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model[3].bias[label_of_model] = 5.0
    return NodeContext(f"n{label_of_model}", model, SPEC, data, data.subset(range(10)), config)


def _vector(ctx: NodeContext) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ctx.model.state_dict().values()])


@pytest.mark.parametrize(("own", "pulled", "p_i"), [(3, 5, 1.0), (5, 3, 0.0)])
def test_fairavg_keeps_the_model_that_is_right_on_its_own_data(own: int, pulled: int, p_i: float) -> None:
    config = SharedSettings(hidden=[8], lr=0.01)
    algo = make_algorithm("fairavg", config)
    node, source = _node(own, config), _node(pulled, config)
    step = Step(0, Group(node.node_id, (source.node_id,), pull=True))
    message = algo.transmit(source, step)
    mine, theirs = _vector(node).clone(), _vector(source).clone()
    assert algo.weight(node, message) == p_i
    algo.aggregate(node, step, [message])
    assert torch.allclose(_vector(node), p_i * mine + (1 - p_i) * theirs)


def test_fairavg_is_alg1_trained_then_pulled_then_weighted() -> None:
    config = SharedSettings(hidden=[16], lr=0.1, batch_size=8)
    g = torch.Generator().manual_seed(1)
    data = ArrayDataset(torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 10, (40,), generator=g), 10)
    node = NodeContext("a", SPEC.build((1, 8, 8), 10, seed=1), SPEC, data.subset(range(30)), data.subset(range(30, 40)),
                       config)
    source = NodeContext("b", SPEC.build((1, 8, 8), 10, seed=2), SPEC, data.subset(range(30)),
                         data.subset(range(30, 40)), config)
    algo = make_algorithm("fairavg", config)
    plan = algo.plan_round(0, [node.profile(), source.profile()], {})
    assert all(g.pull and len(g.senders) == 1 for g in plan)
    step = Step(0, Group("a", ("b",), pull=True))
    algo.local_step(node, step)  # Alg. 1 line 3: local training first
    trained, pulled = _vector(node).clone(), algo.transmit(source, step)
    p_i = algo.weight(node, pulled)
    algo.aggregate(node, step, [pulled])
    expected = p_i * trained + (1 - p_i) * torch.cat([p.values for p in pulled.parts])
    assert torch.allclose(_vector(node), expected, atol=1e-7) and 0.0 <= p_i <= 1.0


# ----- the fairness view of results --------------------------------------------------------------------


def _result(algorithm: str, local: list[float], name: str = "case") -> RunResult:
    nodes = [NodeResult(id=f"n{i}", global_accuracy=0.5, local_accuracy=a, param_sha256="", num_train=1)
             for i, a in enumerate(local)]
    last = EvalRecord(round=1, global_accuracy=0.5, local_accuracy=sum(local) / len(local),
                      per_node_global={n.id: 0.5 for n in nodes},
                      per_node_local={n.id: n.local_accuracy for n in nodes},
                      bytes_transmitted=0, wall_time_s=0.0)
    return RunResult(driver="simulate", algorithm=algorithm, config={"name": name}, rounds=1, history=[last],
                     nodes=nodes, bytes_transmitted=0, models_transmitted=0, wall_time_s=0.0)


def test_fairness_counts_and_histogram_by_hand(tmp_path) -> None:
    local = [0.5, 0.79, 0.8, 0.85, 0.91, 0.92, 0.96, 1.0, 0.97, 0.3]
    view = fairness(local)
    counts = {t.threshold: (t.below, t.over) for t in view.thresholds}
    assert counts[0.8] == (3, 7) and counts[0.9] == (5, 5) and counts[0.92] == (6, 4) and counts[0.96] == (7, 3)
    assert sum(view.histogram) == 10 and view.histogram[-1] == 3 and view.histogram[6] == 1  # [.95, 1], [.3, .35)
    assert (view.min, view.max, view.worst_decile) == (0.3, 1.0, 0.3)
    json_path, _ = write_results(_result("fairavg", local), tmp_path)
    written = json.loads(json_path.read_text())["fairness"]
    assert written["histogram"] == view.histogram and written["thresholds"][2] == {"threshold": 0.8, "below": 3,
                                                                                   "over": 7}


def test_plot_draws_the_distributions(tmp_path) -> None:
    paths = []
    for case, algorithm, local in (("a", "fairavg", [0.9, 0.95]), ("a", "fullavg", [0.6, 0.97]),
                                   ("b", "fairavg", [0.7, 0.75])):
        folder = tmp_path / case
        paths.append(write_results(_result(algorithm, local, case), folder)[0])
    out = tmp_path / "dist.png"
    result = CliRunner().invoke(cli, ["plot", "--distribution", *map(str, paths), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 10_000
