"""A node's own step that goes non-finite is undone, never kept (one scaled member once killed an honest one).

A fusion of finite but huge values (a `scale` adversary's model) goes NaN; the node must keep exactly what it had,
answer nobody, refuse the fused messages as ``non_finite_result`` — and in a fleet, finish with every honest model
and checkpoint finite, where without the guard an honest node's checkpoints all failed to verify and it died.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from dfl_node.algorithms import Group, NodeContext, Step, make_algorithm
from dfl_node.algorithms.base import equip, sample_pairs
from dfl_node.algorithms.defences import Refusal
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.runner import play_aggregator, play_sender
from dfl_node.algorithms.step_guard import NonFinite, first_non_finite, guarded
from dfl_node.learning.provision import fleet_ids
from dfl_node.node.model.persistence import MODEL_FILE, PREVIOUS, read_trained
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim import run_fleet
from tests.helpers.contexts import TINY_SETTINGS, tiny_context

FUSE = Step(0, Group("b", ("a",)))  # round 0: node b fuses node a's model
SCALE = 1e30  # finite in float32 (max 3.4e38); a mutual learning's KL on its logits is not


class Recorded:
    """The round runner's transport, in-process: computes inline, hands over ``messages``, keeps what it is told;
    its node ``ctx`` began its role (its durable checkpoint) as it is when the transport is made."""

    def __init__(self, ctx: NodeContext, messages: list[ModelMessage]) -> None:
        self.ctx, self.durable = ctx, ctx.snapshot()
        self.restores = 0
        self.messages = messages
        self.pushed: list[ModelMessage] = []
        self.refused: list[Refusal] = []
        self.warned: list[str] = []  # what diverged() was told
        self.replies: Mapping[str, ModelMessage] | None = None

    async def compute(self, fn: Callable[..., Any], *args: object) -> Any:
        return fn(*args)

    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None:
        self.pushed.append(message)
        return None

    async def gather(self, step: Step) -> list[ModelMessage]:
        return self.messages

    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None:
        self.replies = replies

    def refuse(self, refusal: Refusal) -> None:
        self.refused.append(refusal)

    def diverged(self, detail: str) -> None:
        self.warned.append(detail)

    async def restore(self) -> None:
        self.restores += 1
        self.ctx.restore_checkpoint(self.durable, exact=True)


def pair(algorithm_name: str) -> tuple[Any, NodeContext, ModelMessage]:
    """An aggregator b (DFML: with its peak model, and α_n set by an earlier fusion) and node a's message to it."""
    algorithm = make_algorithm(algorithm_name, TINY_SETTINGS)
    a, b = tiny_context("a", seed=1), tiny_context("b", seed=2)
    for ctx in (a, b):
        equip(algorithm, ctx, seed=0)
    if algorithm_name == "dfml":
        b.scalars["alpha_n"] = 0.25
    return algorithm, b, algorithm.transmit(a, FUSE)


def scaled(message: ModelMessage, factor: float) -> ModelMessage:
    return replace(message, parts=tuple(replace(p, values=p.values * factor) for p in message.parts))


def same_state(ctx: NodeContext, state: dict[str, torch.Tensor]) -> bool:
    now = ctx.checkpoint_state()
    return now.keys() == state.keys() and all(torch.equal(now[k], state[k]) for k in state)


@pytest.mark.parametrize("algorithm_name", ["defkt", "dfml"])
def test_a_fusion_that_goes_non_finite_is_undone_bit_for_bit_refused_and_answers_nobody(algorithm_name: str) -> None:
    algorithm, b, message = pair(algorithm_name)
    poisoned = scaled(message, SCALE)
    assert first_non_finite(b, [poisoned]) is None  # finite: the gate lets it through
    trained = copy.deepcopy(b)
    algorithm.local_step(trained, FUSE)  # the role's own local step (DFML trains), which the node keeps
    before = trained.snapshot()
    unguarded = copy.deepcopy(trained)
    replies = algorithm.aggregate(unguarded, FUSE, [poisoned])
    assert not same_state(unguarded, before)  # the fusion changes the node (DFML: its peak model and α_n too) …
    assert first_non_finite(unguarded, replies.values()) is not None  # … and leaves NaN/Inf (DFML: in its reply)

    transport = Recorded(b, [poisoned])
    assert asyncio.run(play_aggregator(algorithm, b, FUSE, transport)) == 1  # the group completes, fusing nothing
    assert same_state(b, before) and b.scalars == trained.scalars  # model, auxiliaries and scalars, bit for bit
    assert transport.replies == {}  # no reply built from the undone fusion
    assert transport.restores == 1  # undone from the role's start (and its local step played again), not a copy
    assert [(r.sender, r.reason, r.kept) for r in transport.refused] == [("a", "non_finite_result", False)]
    assert not transport.warned


def test_a_sender_whose_own_training_diverges_is_undone_says_so_and_sends_nothing() -> None:
    # SGD that blows up, kept in place
    config = TINY_SETTINGS.model_copy(update={"lr": 1e30, "sender_keeps_trained": True})
    a = tiny_context("a")
    a.config = config
    before = a.snapshot()
    transport = Recorded(a, [])
    with pytest.raises(NonFinite, match="1.weight"):
        asyncio.run(play_sender(make_algorithm("defkt", config), a, FUSE, transport))
    assert same_state(a, before) and not transport.pushed  # its model as it was, and nothing left the node
    assert len(transport.warned) == 1 and "training to send left 1.weight; undone" in transport.warned[0]
    assert not transport.refused  # nobody else to blame


def test_a_step_that_adds_a_non_finite_scalar_is_caught_and_the_restore_leaves_no_trace_of_it() -> None:
    _, b, _ = pair("dfml")
    before = b.snapshot()

    def diverge() -> None:
        next(iter(b.model.parameters())).data.fill_(1.0)
        b.scalars["new"] = float("nan")

    with pytest.raises(NonFinite, match="scalar new"):
        guarded(b, diverge)()
    b.restore_checkpoint(before, exact=True)  # what undoing it does (the runner, through its transport)
    assert b.scalars == {"alpha_n": 0.25} and same_state(b, before)


def test_a_finite_fusion_under_the_guard_is_the_unguarded_fusion_bit_for_bit() -> None:
    algorithm, b, message = pair("dfml")
    plain = copy.deepcopy(b)
    replies = guarded(b, algorithm.aggregate)(b, FUSE, [message])
    plain_replies = algorithm.aggregate(plain, FUSE, [message])
    assert same_state(b, plain.checkpoint_state()) and b.scalars == plain.scalars
    assert [p.values.tolist() for p in replies["a"].parts] == [p.values.tolist() for p in plain_replies["a"].parts]


# ----------------------------------------------------------------------------- a fleet with a scaled member

FLEET = ExperimentConfig(nodes=5, partition="iid", seed=3, rounds=8, eval_every=8, batch_size=20, mkt_batch_size=20,
                         lr=0.05, hidden=[16], pairs=2, threads=1, adversaries=[f"scale:0.2:{SCALE:g}"])


@pytest.mark.timeout(60)  # without the guard the fleet never finishes: a node is dead, the others wait
def test_a_scaled_member_no_longer_kills_the_honest_nodes_that_fuse_its_models(tmp_path: Path) -> None:
    result = run_fleet(FLEET, "defkt", tmp_path)  # before the guard: OperatorError, node-3's checkpoints all NaN
    [adversary] = result.adversaries
    assert result.rounds == FLEET.rounds
    for n in result.honest:
        folder = tmp_path / "defkt" / n.id
        for name in (MODEL_FILE, PREVIOUS[MODEL_FILE]):
            assert all(t.isfinite().all() for t in load_file(str(folder / name)).values() if t.is_floating_point())
        assert read_trained(folder).state  # the checkpoint verifies: the node would restart from it
    refused: Counter[str] = Counter()
    for n in result.nodes:
        refused.update(n.rejected)
    sends = sum(adversary in g.senders for r in range(FLEET.rounds)
                for g in sample_pairs(FLEET.learning.seed, r, fleet_ids(5), FLEET.learning.pairs))
    assert sends > 0 and refused == {"non_finite_result": sends}  # each fusion of its models, and nothing else
    assert not any(n.rejected for n in result.nodes if n.id == adversary)
