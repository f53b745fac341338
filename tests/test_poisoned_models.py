"""Well-formed but poisoned models: NaN/Inf weights, and models below an accuracy floor.

The codec cannot see them (the bytes match the header and its sha256) and neither can the algorithm
(the right purpose, architecture and tensors), so before this check a NaN model was accepted, fused
and checkpointed. Each is refused with a reason counted in /status, and nothing changes on the node.
"""

from __future__ import annotations

import math

import grpc
import pytest
import torch

from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import build_model
from dfl_node.net.client_streams import open_transfer
from tests.helpers.codec import frames_of
from tests.helpers.hostile import Target, assert_still_serving


def poisoned(t: Target, value: float) -> ModelMessage:
    cfg = t.node.config
    state = build_model(cfg.learning.model, (1, 8, 8), 10, hidden=cfg.learning.hidden, seed=99).state_dict()
    first = next(iter(state))
    state[first] = state[first].clone()
    state[first].view(-1)[3] = value
    return ModelMessage(sender="stranger", round=0, purpose="defkt.model", num_samples=100,
                        parts=parts_from_state(state), model=t.node.identity.model)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_a_non_finite_model_is_refused_and_changes_nothing(target: Target, value: float) -> None:
    node = target.node
    digest, history = node.learner.digest, len(node.history())
    await target.expect()
    frames = frames_of(poisoned(target, value), 4096, swarm=node.config.swarm, fingerprint=node.identity.fingerprint)
    verdict = await target.transfer(frames)
    assert not verdict.accepted and verdict.reason == "non_finite", verdict
    await node.roles.settled()
    assert (await target.rejected()) == {"non_finite": 1}
    assert node.learner.digest == digest and len(node.history()) == history
    assert node.tally.counters["fusions"] == 0 and node.tally.counters["models_received"] == 0
    saved = node.learner.checkpoint.load(node.identity.fingerprint)
    assert saved is None or all(torch.isfinite(v).all() for v in saved[0].values() if v.is_floating_point())
    await assert_still_serving(target)


async def test_the_accuracy_gate_refuses_a_model_below_the_floor(target: Target) -> None:
    """An untrained model (about 10 % on digits) passes with the gate off and is refused with a floor of 0.5."""
    node = target.node
    node.config.roles.min_accuracy = 0.5
    digest = node.learner.digest
    await target.expect()
    verdict = await target.transfer(target.frames())
    assert not verdict.accepted and verdict.reason == "low_accuracy", verdict
    await node.roles.settled()
    assert (await target.rejected()) == {"low_accuracy": 1} and node.learner.digest == digest
    node.config.roles.min_accuracy = 0.0
    await assert_still_serving(target)


async def test_the_norm_bound_refuses_a_sign_flipped_model_once_its_group_is_in(target: Target) -> None:
    """Over real gRPC: the transfer is accepted whole, then screened with its group; its stream ends
    ABORTED with the reason, the refusal is counted once, the model is untouched, and the node keeps serving."""
    node = target.node
    node.config.defences.norm_bound = 0.5
    digest = node.learner.digest
    await target.expect()
    flipped = {k: -v if v.is_floating_point() else v for k, v in node.learner.ctx.model.state_dict().items()}
    message = ModelMessage(sender="stranger", round=0, purpose="defkt.model", num_samples=100,
                           parts=parts_from_state(flipped), model=node.identity.model)
    frames = frames_of(message, 4096, swarm=node.config.swarm, fingerprint=node.identity.fingerprint)
    verdict, call, _ = await open_transfer(target.stub.Transfer, frames, timeout=10)
    assert verdict.accepted, verdict  # whole and well-formed: the defence judges it with its group
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await call.read()
    assert ended.value.code() == grpc.StatusCode.ABORTED and ended.value.details().startswith("norm_bound: ")
    await node.roles.settled()
    assert (await target.rejected()) == {"norm_bound": 1} and node.learner.digest == digest
    node.config.defences.norm_bound = None
    await assert_still_serving(target)
