"""The algorithm roles: planning, what travels, what each side keeps."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from dfl_node.algorithms import Algorithm, AlgorithmError, Group, NodeContext, NodeProfile, Step, make_algorithm
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.learning.algorithm_settings import SharedSettings
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.fusion import segment_ranges
from dfl_node.learning.models import ModelSpec, build_model

STEP = Step(0, Group("b", ("a",)))  # round 0: node a sends to node b


def _node(node_id: str, seed: int, config: SharedSettings, model: torch.nn.Module) -> NodeContext:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 10, (40,), generator=g)
    data = ArrayDataset(x, y, 10)
    spec = ModelSpec("mlp", tuple(config.hidden or ()) or None)
    return NodeContext(node_id, copy.deepcopy(model), spec, data.subset(range(32)), data.subset(range(32, 40)), config)


def _fuse(algo: Algorithm, receiver: NodeContext, message: ModelMessage) -> ModelMessage | None:
    """The aggregator of a pair: fuse the one message, return the reply to its sender (if any)."""
    return algo.aggregate(receiver, STEP, [message]).get(message.sender)


@pytest.fixture
def config() -> SharedSettings:
    return SharedSettings(batch_size=8, mkt_batch_size=8, lr=0.1, hidden=[16, 16])


@pytest.fixture
def pair(config: SharedSettings) -> tuple[NodeContext, NodeContext]:
    w0 = build_model("mlp", (1, 8, 8), 10, hidden=config.hidden, seed=0)
    return _node("a", 1, config, w0), _node("b", 2, config, w0)


def _flat(ctx: NodeContext) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ctx.model.state_dict().values()])


def test_plan_picks_disjoint_senders_and_receivers_deterministically(config: SharedSettings) -> None:
    algo = make_algorithm("defkt", config.model_copy(update={"pairs": 3}))
    peers = [f"n{i}" for i in range(10)]
    profiles = [NodeProfile(p, "mlp:16,16", 32) for p in peers]
    plan = algo.plan_round(7, profiles, {})
    senders = {s for g in plan for s in g.senders}
    receivers = {g.aggregator for g in plan}
    assert len(senders) == len(receivers) == 3 and not senders & receivers
    assert all(len(g.senders) == 1 and not g.pull for g in plan)
    assert plan == algo.plan_round(7, list(reversed(profiles)), {})  # order of discovery does not matter
    assert any(algo.plan_round(t, profiles, {}) != plan for t in range(8, 12))
    with pytest.raises(ValueError):
        algo.plan_round(0, profiles[:5], {})


def test_defkt_receiver_keeps_the_received_model_after_mkt(config: SharedSettings, pair) -> None:
    sender, receiver = pair
    algo = make_algorithm("defkt", config)
    before_sender = _flat(sender)
    message = algo.transmit(sender, STEP)
    assert torch.equal(_flat(sender), before_sender)  # 000: the sender keeps its pre-round model
    sent = torch.cat([p.values for p in message.parts])
    assert not torch.equal(sent, before_sender)  # ... and transmits its trained one
    assert _fuse(algo, receiver, message) is None
    assert not torch.equal(_flat(receiver), sent)  # MKT moved the received model on the receiver's data


def test_sender_keeps_trained_variant(config: SharedSettings, pair) -> None:
    sender, _ = pair
    algo = make_algorithm("defkt", config.model_copy(update={"sender_keeps_trained": True}))
    message = algo.transmit(sender, STEP)
    assert torch.equal(_flat(sender), torch.cat([p.values for p in message.parts]))


def test_fullavg_receiver_is_eq9_of_both(config: SharedSettings, pair) -> None:
    sender, receiver = pair
    algo = make_algorithm("fullavg", config)
    local = _flat(receiver)
    message = algo.transmit(sender, STEP)
    _fuse(algo, receiver, message)
    expected = local + 0.5 * (torch.cat([p.values for p in message.parts]) - local)  # equal sample counts
    assert torch.allclose(_flat(receiver), expected)


def test_combo_swaps_complementary_segments_and_traffic_is_one_model(config: SharedSettings, pair) -> None:
    sender, receiver = pair
    algo = make_algorithm("combo", config)
    receiver.model.load_state_dict({k: v + 1.0 for k, v in receiver.model.state_dict().items()})
    receiver_before = _flat(receiver)
    message = algo.transmit(sender, STEP)
    sender_trained = _flat(sender)
    reply = _fuse(algo, receiver, message)
    algo.finish(sender, STEP, reply)

    model_bytes = sum(t.numel() * t.element_size() for t in sender.model.state_dict().values())
    assert message.nbytes + reply.nbytes == model_bytes
    half = sum(stop - start for _, start, stop in segment_ranges(sender.model.state_dict(), 2)[0])
    # receiver: first segment untouched, second averaged; sender: the other way round
    assert torch.equal(_flat(receiver)[:half], receiver_before[:half])
    assert torch.allclose(_flat(receiver)[half:], (receiver_before[half:] + sender_trained[half:]) / 2)
    assert torch.equal(_flat(sender)[half:], sender_trained[half:])
    assert torch.allclose(_flat(sender)[:half], (sender_trained[:half] + receiver_before[:half]) / 2)


def test_combo_rejects_a_message_with_the_wrong_segments(config: SharedSettings, pair) -> None:
    sender, receiver = pair
    algo = make_algorithm("combo", config)
    message = algo.transmit(sender, STEP)
    forged = type(message)(**{**message.__dict__, "parts": message.parts[1:]})
    with pytest.raises(AlgorithmError):
        _fuse(algo, receiver, forged)


def test_receiver_refuses_another_algorithms_message(config: SharedSettings, pair) -> None:
    sender, receiver = pair
    message = make_algorithm("fullavg", config).transmit(sender, STEP)
    with pytest.raises(AlgorithmError):
        _fuse(make_algorithm("defkt", config), receiver, message)


@pytest.mark.parametrize("name", ["defkt", "fullavg"])
def test_whole_model_algorithms_refuse_a_partial_model_before_touching_anything(
    config: SharedSettings, pair, name: str
) -> None:
    sender, receiver = pair
    algo = make_algorithm(name, config)
    message = algo.transmit(sender, STEP)
    algo.check_message(receiver, message)  # the genuine message passes
    before = _flat(receiver).clone()
    for parts in (message.parts[1:], (replace(message.parts[0], start=1, values=message.parts[0].values[1:]),)):
        forged = replace(message, parts=parts)
        with pytest.raises(AlgorithmError, match="whole"):
            algo.check_message(receiver, forged)
        with pytest.raises(AlgorithmError):
            _fuse(algo, receiver, forged)
    assert torch.equal(_flat(receiver), before)
