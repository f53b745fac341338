"""The round holder plans with the fleet the token names, not with a peer table that is still filling.

A CI run once had the holder of round 1 plan before it had confirmed two of its three peers (they
had not answered its first Hellos yet): it paired a different couple than the simulator, and the
fleet's models differed from the simulator's. Here the real :class:`RoundScheduler` and a real
:class:`PeerTable` play the holder over a minimal node: the token for round 1 names four members,
the holder's table knows two of them, and a third answers only later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from dfl_node.algorithms import NodeProfile, make_algorithm
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.membership.peers import PeerTable
from dfl_node.node.schedule.ports import SchedulerPort
from dfl_node.node.schedule.rounds import RoundScheduler
from dfl_node.peering.messages import Ack, HelloReply, Progress, Token
from dfl_node.records.metrics import NodeMetrics
from dfl_node.settings.node import MembershipSettings, ScheduleSettings
from tests.helpers.fleet import FLEET

MEMBERS = ["node-0", "node-1", "node-2", "node-3"]


class TableMembers:
    """The members of a node as a bare peer table knows them (:class:`~dfl_node.node.membership.membership.Members`)."""

    def __init__(self, node_id: str, table: PeerTable) -> None:
        self.node_id, self.table = node_id, table

    def alive_ids(self) -> list[str]:
        return self.table.alive_ids()

    def dead_ids(self) -> list[str]:
        return self.table.dead_ids()

    def profiles(self) -> list[NodeProfile]:
        return [NodeProfile(self.node_id, "mlp:32,32", 1), *self.table.profiles()]

    def progress(self) -> dict[str, Progress]:
        return self.table.progress()

    def address_of(self, node_id: str) -> str | None:
        return f"{node_id}:1"

    def incarnations(self, ids: list[str]) -> dict[str, str | None]:
        return self.table.incarnations(ids)

    def work_of(self, node_id: str) -> float:
        return self.table.work_of(node_id)

    async def wait_for(self, count: int) -> None:
        await self.table.wait_for(count)

    async def wait_alive(self, ids: Collection[str], timeout: float) -> None:
        await self.table.wait_alive(ids, timeout)

    async def refresh(self) -> None:
        await self.table.refresh()


class MinimalNode:
    """What a holder is given of a node that plays no role itself (a :class:`SchedulerPort`): a real peer table
    behind its members, real progress, and roles that record what they are asked to give out; the token goes
    nowhere (it is also its own network and link)."""

    def __init__(self, node_id: str, peer_timeout: float) -> None:
        self.node_id = node_id
        self.clock = Clock()
        self.peers = PeerTable(node_id, self._no_hello, self.clock, heartbeat=0.05, timeout=peer_timeout, static=[])
        self.progress = RoundProgress(self.clock)
        self.dispatched: list[tuple[str, Assignment]] = []
        self.work_s = 0.0  # as its roles: it has computed nothing (its groups' deadlines are round_timeout)
        metrics = NodeMetrics(node_id, lambda: None)  # type: ignore[arg-type,return-value]  # never scraped
        self.port = SchedulerPort(
            node_id, FLEET.learning.seed, ScheduleSettings(rounds=2),
            MembershipSettings(peer_timeout=peer_timeout, heartbeat=0.05), self.clock,
            make_algorithm("combo", FLEET.learning, FLEET.per_algorithm), TableMembers(node_id, self.peers),
            self.progress, self, self, Tally(self.clock, metrics, self.progress),  # type: ignore[arg-type]
            lambda: Progress(round=self.progress.round, epoch=self.progress.epoch), self._finish, self._finish)

    async def _no_hello(self, address: str, timeout: float) -> HelloReply | None:
        return None

    async def _finish(self, *_: object) -> None:
        raise AssertionError("the run does not end in these tests")

    def join(self, peer_id: str) -> None:
        """``peer_id`` answered a Hello of ours."""
        self.peers.seen(HelloReply(node_id=peer_id, grpc_address=f"{peer_id}:1", boot_id="b", model="mlp:32,32",
                                   num_samples=1))

    async def dispatch(self, node_id: str, order: Assignment) -> Ack:  # its roles: recorded
        self.dispatched.append((node_id, order))
        return Ack(ok=True)

    def link(self, address: str) -> MinimalNode:  # its network
        return self

    async def pass_token(self, token: Token, timeout: float) -> Ack:
        return Ack(ok=True)


async def _hold_round_one(node: MinimalNode, late: str, after: float) -> list[tuple[str, str]]:
    """Hand ``node`` the token of round 1 naming :data:`MEMBERS`; ``late`` is confirmed ``after`` seconds on.
    Returns the (node, role) pairs the holder gave out for round 1."""
    scheduler = RoundScheduler(node.port)
    joining = asyncio.get_running_loop().call_later(after, node.join, late)
    token = Token(round=1, epoch=1, holder=node.node_id, seed=FLEET.learning.seed, members=tuple(MEMBERS))
    try:
        assert (await scheduler.token(token)).ok
        while node.progress.holding:
            await asyncio.sleep(0.01)
    finally:
        joining.cancel()
    return [(who, order.role.value) for who, order in node.dispatched if order.step.round == 1]


def _expected_round_one(members: list[str]) -> list[tuple[str, str]]:
    algorithm = make_algorithm("combo", FLEET.learning, FLEET.per_algorithm)
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
