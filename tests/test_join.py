"""Joining through any member (``--join``): real nodes on loopback, no mDNS.

A node given a join address that nobody serves yet tries it again with backoff, joins once a member is there, and
then leaves the seed to the membership (a seed that goes down is not greeted again); a third node joining through
the second is known to all, and knows all. A member that gossip tells of enters the peer table — what schedulers
pick from — only once our own Hello is answered: a rumoured member nobody serves is never used, and is declared dead
and forgotten like any member that stops answering, the Hellos in flight within the pending table's bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dfl_node.node.membership.swim_member import ALIVE
from dfl_node.node.node import Node
from dfl_node.peering.messages import MAX_UPDATES, MemberUpdate, Ping
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import quiet_node_config, running

WITHIN = 15.0  # seconds: each wait here is for a few periods of 0.2 s


async def membership_shows(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (a membership's state: no event says a third node learned a fourth) until it holds."""
    async with asyncio.timeout(WITHIN):
        while not check():
            await asyncio.sleep(0.05)
    assert check(), what


async def test_a_node_joins_through_a_seed_that_comes_up_late_and_then_leaves_it_be(fleet_shards: Path,
                                                                                 tmp_path: Path) -> None:
    seed = f"127.0.0.1:{free_port()}"
    b_config = quiet_node_config(fleet_shards, tmp_path / "b", id="node-1", data=fleet_shards / "node-1", join=[seed])
    async with running(b_config) as b:
        seeds = b.membership.seeds
        await membership_shows(lambda: seeds.tries >= 2, "the seed tried again while nobody serves there")
        assert not seeds.joined and not b.membership.alive_ids()
        a_config = quiet_node_config(fleet_shards, tmp_path / "a", grpc_port=int(seed.rsplit(":", 1)[1]))
        async with contextlib.AsyncExitStack() as stack:
            a = await stack.enter_async_context(running(a_config))
            await membership_shows(lambda: seeds.joined, "b joined through a")
            c_config = quiet_node_config(fleet_shards, tmp_path / "c", id="node-2", data=fleet_shards / "node-2",
                                         join=[b.address])
            c = await stack.enter_async_context(running(c_config))
            nodes = {"node-0": a, "node-1": b, "node-2": c}
            await membership_shows(
                lambda: all(n.membership.alive_ids() == sorted(set(nodes) - {i}) for i, n in nodes.items()),
                "every node knows every other")
            tries = seeds.tries
        # a (b's seed) is down: b, which joined, does not greet its seed again
        await asyncio.sleep(1.0)  # five periods, in which a node not yet joined would have tried its seed
        assert seeds.tries == tries and seeds.joined


def ghosts(node: Node, count: int, address: str) -> list[MemberUpdate]:
    """``count`` members nobody serves (at ``address``), as an authenticated member's gossip would tell of them:
    each with a Hello this node finds compatible."""
    own = node.membership.swim.own().hello
    return [MemberUpdate(state=ALIVE, incarnation=1, node_id=f"ghost-{i}",
                         hello=replace(own, node_id=f"ghost-{i}", grpc_address=address, boot_id=f"boot-{i}"))
            for i in range(count)]


async def test_gossiped_members_are_used_only_once_they_answer_our_hello(fleet_shards: Path, tmp_path: Path) -> None:
    # periods of 0.05 s, suspicions that time out unconfirmed within ~2 s and the dead forgotten a second later:
    # 64 rumours are probed, suspected, declared dead and forgotten in seconds
    a_config = quiet_node_config(fleet_shards, tmp_path / "a", peer_timeout=1.0, heartbeat=0.05, suspicion_max=1.0,
                                 peer_expiry=1.0)
    b_config = quiet_node_config(fleet_shards, tmp_path / "b", id="node-1", data=fleet_shards / "node-1",
                                 peer_timeout=1.0)
    async with running(a_config) as a, running(b_config) as b:
        membership, nobody = a.membership, f"127.0.0.1:{free_port()}"
        updates = ghosts(a, 64, nobody)
        # b's gossip: b itself (a real member) and, batch by batch, 64 members that nobody serves
        b_says = b.membership.swim.own()
        for start in range(0, len(updates), MAX_UPDATES - 1):
            await membership.ping(Ping(sender="node-1", updates=(b_says, *updates[start:start + MAX_UPDATES - 1])))
        ghost_ids = {u.node_id for u in updates}
        assert ghost_ids <= set(membership.swim.members)  # in SWIM's view, as gossip told of them: probed there

        def checked() -> bool:  # never more Hellos in flight than the pending table holds, no ghost ever used
            table = membership.table
            assert len(table.pending) <= table.max_pending and not ghost_ids & set(membership.alive_ids())
            return True

        await membership_shows(lambda: checked() and "node-1" in membership.alive_ids(), "the real member confirmed")
        await membership_shows(lambda: checked() and not ghost_ids & set(membership.swim.members),
                               "every ghost probed, declared dead and forgotten")
        assert membership.alive_ids() == ["node-1"] and set(membership.swim.members) == {"node-1"}
