"""The round holder plans with the fleet the token names, not with a peer table that is still filling.

A CI run once had the holder of round 1 plan before it had confirmed two of its three peers (they
had not answered its first Hellos yet): it paired a different couple than the simulator, and the
fleet's models differed from the simulator's. Here the real :class:`RoundScheduler` and a real
:class:`PeerTable` play the holder over a minimal node: the token for round 1 names four members,
the holder's table knows two of them, and a third answers only later.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dfl_node.algorithms import NodeProfile, make_algorithm
from dfl_node.node.clock import Clock
from dfl_node.node.config import NodeConfig
from dfl_node.node.peers import PeerTable
from dfl_node.node.rounds import RoundScheduler
from dfl_node.node.state import NodeState
from dfl_node.peering.messages import Ack, Assignment, HelloReply, Progress, Token
from tests.conftest import FLEET

MEMBERS = ["node-0", "node-1", "node-2", "node-3"]


class MinimalNode:
    """The scheduler port of a node that plays no role itself: it records the roles its holder assigns."""

    def __init__(self, node_id: str, peer_timeout: float) -> None:
        self.config = NodeConfig(id=node_id, data=Path("unused"), algorithm="combo", seed=FLEET.seed,
                                 peer_timeout=peer_timeout, rounds=2, heartbeat=0.05)
        self.algorithm = make_algorithm("combo", FLEET)
        self.clock = Clock()
        self.peers = PeerTable(node_id, self._no_hello, self.clock, heartbeat=0.05, timeout=peer_timeout, static=[])
        self.state = NodeState()
        self.node_id = node_id
        self.assigned: list[tuple[str, Assignment]] = []
        self.finished = asyncio.Event()
        self.roles = self  # the port's roles: this fake records what it is asked to assign (assign_to)

    async def _no_hello(self, address: str, timeout: float) -> HelloReply | None:
        return None

    def join(self, peer_id: str) -> None:
        """``peer_id`` answered a Hello of ours."""
        self.peers.seen(HelloReply(node_id=peer_id, grpc_address=f"{peer_id}:1", boot_id="b", model="mlp:32,32",
                                   num_samples=1))

    def profiles(self) -> list[NodeProfile]:
        return [NodeProfile(self.node_id, "mlp:32,32", 1), *self.peers.profiles()]

    def address_of(self, node_id: str) -> str | None:
        return f"{node_id}:1"

    def progress(self) -> Progress:
        return Progress(round=self.state.round, epoch=self.state.epoch)

    async def assign_to(self, node_id: str, assignment: Assignment) -> Ack:
        self.assigned.append((node_id, assignment))
        return Ack(ok=True)

    async def pass_token(self, node_id: str, token: Token) -> Ack | None:
        return Ack(ok=True)

    def enter_epoch(self, epoch: int) -> bool:
        if epoch < self.state.epoch:
            return False
        self.state.epoch = epoch
        return True

    def set_round(self, round_: int, token_state: dict[str, str]) -> None:
        self.state.round, self.state.token_state = round_, token_state

    def set_holding(self, holding: bool) -> None:
        self.state.holding = holding

    def count(self, counter: str, n: int = 1) -> None:
        self.state.counters[counter] += n


async def _hold_round_one(node: MinimalNode, late: str, after: float) -> list[tuple[str, str]]:
    """Hand ``node`` the token of round 1 naming :data:`MEMBERS`; ``late`` is confirmed ``after`` seconds on.
    Returns the (node, role) pairs the holder assigned for round 1."""
    scheduler = RoundScheduler(node)  # type: ignore[arg-type]  # the port's methods a holder uses
    joining = asyncio.get_running_loop().call_later(after, node.join, late)
    token = Token(round=1, epoch=1, holder=node.node_id, seed=FLEET.seed, members=tuple(MEMBERS))
    try:
        assert (await scheduler.token(token)).ok
        while node.state.holding:
            await asyncio.sleep(0.01)
    finally:
        joining.cancel()
    return [(who, a.role) for who, a in node.assigned if a.round == 1]


def _expected_round_one(members: list[str]) -> list[tuple[str, str]]:
    algorithm = make_algorithm("combo", FLEET)
    profiles = [NodeProfile(m, "mlp:32,32", 1) for m in members]
    (group,) = algorithm.plan_round(1, profiles, {})
    return [(group.aggregator, "aggregator"), *((s, "sender") for s in group.senders)]


@pytest.mark.asyncio
async def test_the_holder_waits_for_the_members_the_token_names_before_it_plans() -> None:
    node = MinimalNode("node-1", peer_timeout=5.0)
    node.join("node-2")
    node.join("node-0")
    assigned = await _hold_round_one(node, late="node-3", after=0.3)
    assert assigned == _expected_round_one(MEMBERS)  # the simulator's pair for round 1, not a 3-member one
    assert assigned != _expected_round_one(["node-0", "node-1", "node-2"])


@pytest.mark.asyncio
async def test_a_named_member_that_never_answers_is_left_out_after_peer_timeout() -> None:
    node = MinimalNode("node-1", peer_timeout=0.5)
    node.join("node-2")
    node.join("node-0")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assigned = await _hold_round_one(node, late="node-9", after=60)  # a member the table never confirms
    assert assigned == _expected_round_one(["node-0", "node-1", "node-2"])
    assert 0.5 <= loop.time() - started < 5
