"""The defences a receiver screens a group's messages with: each refuses (or bounds) what it is for,
keeps what it is not for, and is off unless its setting is given."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from dfl_node.algorithms import Group, NodeContext, Step, make_algorithm
from dfl_node.algorithms.defences import screen
from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.algorithm_settings import AlgorithmOptions, DefenceSettings, SharedSettings
from dfl_node.learning.datasets import load_dataset
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.training import SgdParams, evaluate, local_sgd

SPEC = ModelSpec("mlp", (16,))


@pytest.fixture(scope="module")
def trained() -> torch.nn.Module:
    """An MLP trained on digits (about 90 % on held-out digits): a receiver worth defending."""
    train, _ = load_dataset("digits")
    model = SPEC.build((1, 8, 8), 10, seed=0)
    local_sgd(model, train.subset(range(600)), SgdParams(lr=0.1, momentum=0.5, batch_size=20, epochs=8),
              torch.Generator().manual_seed(0))
    return model


def receiver(model: torch.nn.Module) -> NodeContext:
    train, _ = load_dataset("digits")
    return NodeContext("me", copy.deepcopy(model), SPEC, train.subset(range(600, 700)), train.subset(range(700, 800)),
                       SharedSettings())


def message(model: torch.nn.Module, sender: str = "peer", num_samples: int = 100, scale: float = 1.0) -> ModelMessage:
    state = {k: v * scale if v.is_floating_point() else v for k, v in model.state_dict().items()}
    return ModelMessage(sender=sender, round=0, purpose="fedavg.model", num_samples=num_samples,
                        parts=parts_from_state(state), model=str(SPEC))


def test_every_defence_is_off_by_default() -> None:
    assert not DefenceSettings().on
    assert DefenceSettings(norm_bound=1.0).on and DefenceSettings(sample_cap=2).on
    assert DefenceSettings(relative_gate=0.1).on


def test_the_norm_bound_refuses_a_sign_flipped_model_and_keeps_a_near_one(trained: torch.nn.Module) -> None:
    ctx, defences = receiver(trained), DefenceSettings(norm_bound=0.5)
    near = copy.deepcopy(trained)
    with torch.no_grad():
        for p in near.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    kept, refused = screen(ctx, [message(trained, "flipper", scale=-1.0), message(near, "honest")], defences)
    assert [m.sender for m in kept] == ["honest"]
    assert [(r.sender, r.reason, r.kept) for r in refused] == [("flipper", "norm_bound", False)]
    assert "2 of our model's norm away" in refused[0].detail


def test_the_sample_cap_bounds_a_claim_and_fuses_the_message_all_the_same(trained: torch.nn.Module) -> None:
    ctx = receiver(trained)  # ours: 100 training samples
    kept, refused = screen(ctx, [message(trained, "liar", 10**9), message(trained, "honest", 150)],
                           DefenceSettings(sample_cap=2.0))
    assert [(m.sender, m.num_samples) for m in kept] == [("liar", 200), ("honest", 150)]
    assert [(r.sender, r.reason, r.kept) for r in refused] == [("liar", "sample_count", True)]


def test_the_relative_gate_refuses_a_model_far_worse_on_our_validation_split(trained: torch.nn.Module) -> None:
    ctx = receiver(trained)
    untrained = SPEC.build((1, 8, 8), 10, seed=5)
    assert evaluate(trained, ctx.val).score - evaluate(untrained, ctx.val).score > 0.5  # the premise
    kept, refused = screen(ctx, [message(untrained, "poor"), message(trained, "good")],
                           DefenceSettings(relative_gate=0.2))
    assert [m.sender for m in kept] == ["good"] and [(r.sender, r.reason) for r in refused] == [("poor",
                                                                                                "relative_accuracy")]
    wide = DefenceSettings(relative_gate=1.0)  # a margin nothing falls below: nothing refused
    assert screen(ctx, [message(untrained, "poor")], wide)[1] == []


def test_the_relative_gate_judges_another_architecture_by_building_it(trained: torch.nn.Module) -> None:
    ctx = receiver(trained)
    other = ModelSpec("mlp", (8,))
    poor = ModelMessage(sender="other", round=0, purpose="dfml.model", num_samples=100, model=str(other),
                        parts=parts_from_state(other.build((1, 8, 8), 10, seed=3).state_dict()))
    # no distance to another architecture; its accuracy, yes
    kept, refused = screen(ctx, [poor], DefenceSettings(relative_gate=0.2, norm_bound=0.5))
    assert kept == [] and [r.reason for r in refused] == ["relative_accuracy"]


def test_fedavg_with_the_median_is_robust_to_one_huge_model() -> None:
    """FedAvg's aggregator with ``aggregation: median``: a sender's model ×1000 moves no coordinate far."""
    config = SharedSettings(hidden=[8])
    algo = make_algorithm("fedavg", config, AlgorithmOptions(aggregation="median"))
    spec = ModelSpec("mlp", (8,))
    train, _ = load_dataset("digits")
    models = [spec.build((1, 8, 8), 10, seed=s) for s in range(4)]
    ctx = NodeContext("a", models[0], spec, train.subset(range(40)), train.subset(range(40, 50)), config)
    own = {k: v.clone() for k, v in models[0].state_dict().items()}
    messages = [replace(message(m, f"s{i}"), purpose="fedavg.model", model=str(spec))
                for i, m in enumerate(models[1:])]
    messages[0] = replace(message(models[1], "s0", scale=1000.0), model=str(spec))
    algo.aggregate(ctx, Step(0, Group("a", ("s0", "s1", "s2"))), messages)
    for name, fused in ctx.model.state_dict().items():
        others = [m.state_dict()[name] for m in models[2:]]
        column = torch.stack([own[name], *others, 1000 * models[1].state_dict()[name]])
        ordered = column.sort(dim=0).values
        assert torch.allclose(fused, (ordered[1] + ordered[2]) / 2)  # of four: the mean of the middle two
        assert fused.abs().max() < 10  # nowhere near the ×1000 model
