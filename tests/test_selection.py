"""001's client selection: open-group plans, both selection rules on crafted fleets, probes on the wire."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dfl_node.algorithms import Group, NodeContext, NodeProfile, Step, make_algorithm
from dfl_node.algorithms.base import sample_pairs
from dfl_node.algorithms.selection import (
    Probe,
    ProbeAnswer,
    SelectionError,
    check_answer,
    check_probe,
    least_certain,
    probe_budget,
    rank_by_profile,
    rank_by_samples,
)
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.provision import provision
from dfl_node.net.convert import from_wire, to_wire
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.probes import ProbeRequest, answer_from_reply, probe_from_request, probe_reply, probe_request
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim import run_fleet

SPEC = ModelSpec("mlp", (10, 10))
CONFIG = SharedSettings(hidden=[10, 10], batch_size=4, mkt_batch_size=4, lr=0.01, momentum=0.0)
OPTIONS = AlgorithmOptions(selection_samples=3)


def _data(labels: list[int], confident: list[bool]) -> ArrayDataset:
    """8x8 samples: a confident one of class c has pixel c at 10 (the sender's crafted model reads it), an
    uncertain one is all zeros."""
    x = torch.zeros(len(labels), 1, 8, 8)
    for i, (c, sure) in enumerate(zip(labels, confident)):
        if sure:
            x[i, 0, 0, c] = 10.0
    return ArrayDataset(x, torch.tensor(labels), 10)


def _reader() -> torch.nn.Module:
    """Logits = pixels 0..9 of the first row: sure where one of them is lit; nearly uniform (max entropy) on
    zeros, where a small bias says class 0."""
    model = SPEC.build((1, 8, 8), 10)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model[1].weight[:, :10] = torch.eye(10)
        model[3].weight.copy_(torch.eye(10))
        model[5].weight.copy_(torch.eye(10))
        model[5].bias[0] = 0.5
    return model


def _always(label: int) -> torch.nn.Module:
    """A constant predictor of ``label``."""
    model = SPEC.build((1, 8, 8), 10)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model[5].bias[label] = 5.0
    return model


def _node(node_id: str, model: torch.nn.Module, val: ArrayDataset, config: SharedSettings = CONFIG) -> NodeContext:
    return NodeContext(node_id, model, SPEC, val, val, config)


def _fleet(selection: str) -> dict[str, NodeContext]:
    """Sender ``s`` knows class 0 and is unsure of (and wrong on) class 1. Candidates: ``a`` always says 0,
    ``b`` always says 1 (the right receiver: it knows what ``s`` does not), ``c`` always says 2."""
    config = CONFIG.model_copy(update={"sender_keeps_trained": True})
    sender_val = _data([0, 0, 0, 0, 1, 1, 1, 1], [True] * 4 + [False] * 4)
    mixed = _data([0, 1, 2, 0, 1, 2], [True] * 6)
    nodes = {"s": _node("s", _reader(), sender_val, config)}
    for node_id, label in (("a", 0), ("b", 1), ("c", 2)):
        nodes[node_id] = _node(node_id, _always(label), mixed, config)
    return nodes


STEP = Step(0, Group("", ("s",), candidates=("a", "b", "c")))


@pytest.mark.parametrize("selection", ["class-profile", "probe-samples"])
def test_the_sender_chooses_the_candidate_that_knows_what_it_does_not(selection: str) -> None:
    nodes = _fleet(selection)
    algo = make_algorithm("defkt-select", nodes["s"].config, OPTIONS.model_copy(update={"selection": selection}))
    message = algo.transmit(nodes["s"], STEP)
    probe = algo.probe(nodes["s"], STEP, message)
    answers = {c: algo.answer(nodes[c], probe) for c in ("a", "b", "c")}
    for answer in answers.values():
        check_answer(answer, probe, 10)
    assert algo.rank(nodes["s"], STEP, probe, answers)[0] == "b"
    if selection == "probe-samples":  # the probe is the sender's 3 least certain samples: its class-1 ones
        assert probe.samples == 3 and probe.y.tolist() == [1, 1, 1] and bool((probe.x == 0).all())
        assert [answers[c].correct for c in "abc"] == [0, 3, 0]
    else:  # nothing but the mode travels; the candidates answer with their per-class accuracy
        assert probe.x is None and probe.y is None
        assert answers["b"].class_accuracy[:3] == (0.0, 1.0, 0.0) and math.isnan(answers["b"].class_accuracy[5])
        assert probe.weights[1] > probe.weights[0] > 0 and probe.weights[2] == 0  # errors in 1; 2 not held


def test_rules_break_ties_by_loss_then_id() -> None:
    answers = {"n3": ProbeAnswer("n3", 4, 3, 0.5), "n1": ProbeAnswer("n1", 4, 3, 0.5),
               "n2": ProbeAnswer("n2", 4, 3, 0.4), "n0": ProbeAnswer("n0", 4, 2, 0.1)}
    assert rank_by_samples(answers) == ["n2", "n1", "n3", "n0"]
    weights = (0.75, 0.25, 0.0)
    profiles = {"x": ProbeAnswer("x", class_accuracy=(0.2, 1.0, 1.0)),  # 0.15 + 0.25 = 0.40
                "y": ProbeAnswer("y", class_accuracy=(0.6, math.nan, 0.0)),  # 0.45: a class it lacks counts 0
                "z": ProbeAnswer("z", class_accuracy=(0.6, 0.0, 0.3))}  # 0.45, tie with y: id order
    assert rank_by_profile(weights, profiles) == ["y", "z", "x"]


def test_least_certain_is_highest_entropy_first() -> None:
    data = _data([3, 1, 4, 1, 5], [True, False, True, False, True])
    assert least_certain(_reader(), data, 2).tolist() == [1, 3]  # the blank ones, lower index first
    assert least_certain(_reader(), data, 0).numel() == 0


def test_open_plans_deal_disjoint_candidate_pools_to_the_random_senders() -> None:
    ids = [f"n{i}" for i in range(11)]
    profiles = [NodeProfile(i, "mlp:10,10", 5) for i in ids]
    config = CONFIG.model_copy(update={"pairs": 3, "seed": 4})
    plan = make_algorithm("defkt-select", config, OPTIONS).plan_round(6, profiles, {})
    senders = [g.senders[0] for g in sample_pairs(4, 6, ids, 3)]
    assert [g.senders[0] for g in plan] == senders  # the same I_A as Def-KT draws: only receivers differ
    pools = [set(g.candidates) for g in plan]
    assert all(g.open and g.aggregator == "" for g in plan)
    assert set().union(*pools) == set(ids) - set(senders) and sum(map(len, pools)) == 8  # disjoint, all others
    assert plan == make_algorithm("defkt-select", config, OPTIONS).plan_round(6, list(reversed(profiles)), {})
    limited = make_algorithm("defkt-select", config, OPTIONS.model_copy(update={"selection_candidates": 2}))
    assert [len(g.candidates) for g in limited.plan_round(6, profiles, {})] == [2, 2, 2]
    random = make_algorithm("defkt-select", config, OPTIONS.model_copy(update={"selection": "random"}))
    assert random.plan_round(6, profiles, {}).groups == sample_pairs(4, 6, ids, 3)  # Procedure 1
    assert STEP.group.bound("b") == Group("b", ("s",)) and STEP.group.members == ("s", "a", "b", "c")
    with pytest.raises(ValueError):
        STEP.group.bound("s")


def test_001s_algorithm_keeps_the_senders_trained_model_by_default() -> None:
    assert "defkt-select (001) yes" in SharedSettings.model_fields["sender_keeps_trained"].description
    nodes = _fleet("class-profile")
    ctx = nodes["s"]
    ctx.config = CONFIG  # sender_keeps_trained unset: the algorithm's default
    message = make_algorithm("defkt-select", CONFIG, OPTIONS).transmit(ctx, STEP)
    sent = torch.cat([p.values for p in message.parts])
    assert torch.equal(torch.cat([t.reshape(-1) for t in ctx.model.state_dict().values()]), sent)


def test_selection_in_the_simulator_fuses_once_a_round_and_is_seeded() -> None:
    config = ExperimentConfig(nodes=5, rounds=6, eval_every=6, batch_size=20, mkt_batch_size=20, lr=0.05,
                              hidden=[16], partition="shards", zeta=2)
    fleet = provision(config)
    runs = [run_fleet(config, "defkt-select", data=fleet) for _ in range(2)]
    assert runs[0].models_transmitted == 6
    assert [n.param_sha256 for n in runs[0].nodes] == [n.param_sha256 for n in runs[1].nodes]


# ----- the wire ----------------------------------------------------------------------------------------


def _probe(n: int = 3) -> Probe:
    return Probe("s", 2, "probe-samples", x=torch.rand(n, 1, 28, 28), y=torch.tensor([1, 2, 9][:n]))


def test_a_probe_round_trips_the_wire_and_its_bounds_hold() -> None:
    probe = _probe()
    on_the_wire = to_wire(probe_request(probe, swarm="w", epoch=3))
    back = probe_from_request(from_wire(on_the_wire), input_shape=(1, 28, 28), num_classes=10)
    assert torch.equal(back.x, probe.x) and torch.equal(back.y, probe.y) and back.sender == "s" and back.round == 2
    profile = probe_from_request(probe_request(Probe("s", 0, "class-profile", weights=(1.0,)), swarm="w", epoch=0),
                                 input_shape=(1, 28, 28), num_classes=10)
    assert profile.x is None and profile.weights == ()  # the sender's weights never travel
    assert probe_budget(20, (1, 28, 28)) == 20 and probe_budget(500, (1, 28, 28)) == 167  # 512 KiB of 28x28
    assert probe_budget(500, (3, 32, 32)) == 42 and probe_budget(500, (1, 8, 8)) == 256
    answer = ProbeAnswer("b", class_accuracy=(0.5, math.nan))
    again = answer_from_reply(from_wire(to_wire(probe_reply(answer))), "b")
    assert again.class_accuracy[0] == 0.5 and math.isnan(again.class_accuracy[1])


def _request(**changes: object) -> ProbeRequest:
    changed = {name: tuple(value) if isinstance(value, list) else value for name, value in changes.items()}
    return dataclasses.replace(probe_request(_probe(), swarm="w", epoch=0), **changed)


@pytest.mark.parametrize("changes", [
    {"mode": "everything"}, {"dtype": "float64"}, {"shape": [3, 1, 28, 27]}, {"shape": [3, 28, 28]},
    {"shape": [300, 1, 28, 28]}, {"shape": [0, 1, 28, 28]}, {"samples": b"\0" * 100}, {"labels": [1, 2]},
    {"labels": [1, 2, 10]}, {"mode": "class-profile"},
], ids=["mode", "dtype", "shape", "rank", "too-many", "none", "bytes", "label-count", "label-range", "profile+data"])
def test_a_malformed_probe_is_refused_before_any_tensor_is_built(changes: dict) -> None:
    with pytest.raises(TransferRejected) as caught:
        probe_from_request(_request(**changes), input_shape=(1, 28, 28), num_classes=10)
    assert caught.value.reason == "bad_probe"


def test_probe_values_and_answers_are_checked() -> None:
    nan_probe = Probe("s", 0, "probe-samples", x=torch.full((2, 1, 28, 28), math.nan), y=torch.tensor([0, 1]))
    with pytest.raises(SelectionError):
        check_probe(nan_probe, (1, 28, 28), 10, "probe-samples")
    with pytest.raises(SelectionError, match="mode"):
        check_probe(_probe(), (1, 28, 28), 10, "class-profile")
    probe = _probe()
    check_answer(ProbeAnswer("b", 3, 2, 0.7), probe, 10)
    for bad in (ProbeAnswer("b", 2, 2, 0.7), ProbeAnswer("b", 3, 4, 0.7), ProbeAnswer("b", 3, 1, -1.0),
                ProbeAnswer("b", 3, 1, math.inf), ProbeAnswer("b", 3, 1, 0.1, (0.5,))):
        with pytest.raises(SelectionError):
            check_answer(bad, probe, 10)
    profile = Probe("s", 0, "class-profile")
    check_answer(ProbeAnswer("b", class_accuracy=(math.nan,) * 9 + (1.0,)), profile, 10)
    for acc in ((0.5,) * 9, (1.5,) + (0.5,) * 9, (-0.1,) * 10):
        with pytest.raises(SelectionError):
            check_answer(ProbeAnswer("b", class_accuracy=acc), profile, 10)


def test_plot_labels_tell_runs_of_one_algorithm_apart() -> None:
    from dfl_node.cli.plot import run_labels
    from dfl_node.results import RunResult

    def run(algorithm: str, **config: object) -> RunResult:
        return RunResult(driver="simulate", algorithm=algorithm, config={"name": "x", "seed": 0, **config}, rounds=0,
                         history=[], nodes=[], bytes_transmitted=0, models_transmitted=0, wall_time_s=0.0)

    runs = [run("defkt-select", selection="random"), run("defkt-select", selection="class-profile"), run("defkt")]
    assert run_labels(runs) == ["defkt-select selection=random", "defkt-select selection=class-profile", "defkt"]
