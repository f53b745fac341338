"""A node's checkpoint writes: one at a time, and from outside a role only once no role runs.

An async fleet once logged ``FileNotFoundError`` from ``os.replace``: a node whose time budget ended
checkpointed (it holds no role) while a fusion it had accepted checkpointed too, and the two writes
raced on the same temporary files.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dfl_node.algorithms import Role
from dfl_node.node.node import Node
from tests.helpers.fleet import daemon


def _node(shards: Path, state: Path) -> Node:
    return daemon(id="node-0", data=shards / "node-0", http_port=0, mdns=False, state_dir=state, evaluate=False).node


@pytest.mark.asyncio
async def test_concurrent_saves_are_written_one_after_another(fleet_shards: Path, tmp_path: Path) -> None:
    node = _node(fleet_shards, tmp_path / "state")
    await asyncio.gather(*(node.save(copy=i % 2 == 0) for i in range(8)))  # raced on the .tmp files before
    assert node.learner.checkpoint.generation == 8
    assert node.learner.checkpoint.load(node.identity.fingerprint) is not None


@pytest.mark.asyncio
async def test_a_save_from_outside_a_role_waits_for_the_role_and_takes_its_model(fleet_shards: Path,
                                                                                 tmp_path: Path) -> None:
    node = _node(fleet_shards, tmp_path / "state")
    node.roles.take(Role.SOURCE)  # as a pull being served
    saving = asyncio.create_task(node.save(copy=True))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not saving.done()  # it waits while the role runs …
    with torch.no_grad():
        for parameter in node.learner.ctx.model.parameters():
            parameter.fill_(0.25)  # … whose work changes the model …
    node.roles.release()
    await saving
    saved = load_file(str(node.learner.checkpoint.model_path))
    # … then saves it
    assert all(torch.all(t == 0.25) for name, t in saved.items() if "weight" in name or "bias" in name)


@pytest.mark.asyncio
async def test_a_volunteer_stopped_while_inviting_gives_its_role_back(fleet_shards: Path, tmp_path: Path) -> None:
    """Shutdown cancels the async scheduler; a node cancelled while its invitations were out kept the
    aggregator role for good, and its last checkpoint (which waits for no role to run) never came."""
    node = _node(fleet_shards, tmp_path / "state")
    invited = asyncio.Event()

    async def peer_that_never_answers(node_id: str, order: object) -> object:
        invited.set()
        await asyncio.Event().wait()

    node.roles.dispatch = peer_that_never_answers  # type: ignore[method-assign]
    leading = asyncio.create_task(node.roles.lead(0, ["node-1"], 1))
    await invited.wait()
    assert node.roles.role is Role.AGGREGATOR and node.roles.collector is not None
    leading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leading
    assert node.roles.role is Role.IDLE and node.roles.collector is None
    await asyncio.wait_for(node.save(copy=True), 10)


@pytest.mark.asyncio
async def test_a_role_that_fails_leaves_the_model_as_its_checkpoint_has_it(fleet_shards: Path, tmp_path: Path) -> None:
    """A role no longer copies the model before it starts (a second model in memory for the whole
    role); a role that does not complete reads the models back from the newest checkpoint."""
    node = _node(fleet_shards, tmp_path / "state")
    assert node.learner.checkpoint.generation is None  # a new node writes nothing until it serves (or a role starts)
    await node.learner.checkpointed()  # its w0, as the role's start writes it
    assert node.learner.checkpoint.generation == 1
    before = {name: tensor.clone() for name, tensor in node.learner.ctx.checkpoint_state().items()}
    with torch.no_grad():
        for parameter in node.learner.ctx.model.parameters():
            parameter.add_(1.0)  # as a failed role's local training left it
    await node.learner.restore_durable()
    after = node.learner.ctx.checkpoint_state()
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())


@pytest.mark.asyncio
async def test_a_node_says_done_only_once_its_final_figures_are_in(fleet_shards: Path, tmp_path: Path) -> None:
    """A fleet read in CI once said done with the figures of round 15: the node marked itself done, then
    evaluated its final model. A status that says done has the final figures."""
    node = daemon(id="node-0", data=fleet_shards / "node-0", http_port=0, mdns=False, state_dir=tmp_path / "state",
                  evaluate=True).node
    evaluating, release = threading.Event(), threading.Event()
    evaluate = node.learner.evaluate

    def held_evaluation() -> object:
        evaluating.set()
        release.wait(10)
        return evaluate()

    node.learner.evaluate = held_evaluation  # type: ignore[method-assign]
    finishing = asyncio.create_task(node.finish(10))
    await asyncio.to_thread(evaluating.wait, 10)
    assert not node.status().done  # the final model is being evaluated: not done yet
    release.set()
    await finishing
    status = node.status()
    assert status.done and status.round == 10
    assert (status.local_accuracy, status.global_accuracy) == node.learner.accuracy != (None, None)
