"""Async mode: no global clock, as a real IoT fleet runs.

Each tick (``interval`` seconds, jittered) a node volunteers with probability ``participation``
("only plugged-in devices volunteer"). A volunteer becomes the aggregator of a group of its own:
it invites live peers, in a random order, to send to it — as many as its algorithm wants per
group (one for Def-KT, FullAvg and Combo; a share of the fleet for FedAvg) — and aggregates what
the peers that answer within the window send (at least one). A busy peer refuses the invitation
and the next is asked. Pull algorithms pull from the chosen peers instead of inviting them. Peers over a link that
was cut or failed lately (:mod:`.link_quality`) are asked last.
"""

from __future__ import annotations

import asyncio
import logging
import random

from dfl_node.algorithms.base import derive_seed
from dfl_node.algorithms.plan import Role
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.schedule.ports import SchedulerPort
from dfl_node.peering.messages import Ack, Token

log = logging.getLogger(__name__)


class AsyncScheduler:
    def __init__(self, node: SchedulerPort) -> None:
        self.node = node
        self.finished = asyncio.Event()
        self.rng = random.Random(derive_seed(node.seed, node.node_id, "async"))

    async def run(self) -> None:
        node, settings = self.node, self.node.settings
        await node.members.wait_for(settings.min_peers)
        deadline = node.clock.monotonic() + settings.duration if settings.duration else None
        while deadline is None or node.clock.monotonic() < deadline:
            tick = settings.interval * self.rng.uniform(0.5, 1.5)
            if deadline is not None and node.clock.monotonic() + tick >= deadline:
                # the next tick falls past the end of the run: wake at the end, not at the tick (an --interval
                # longer than --duration would otherwise keep the node, and the fleet's heartbeats, for it)
                await asyncio.sleep(max(0.0, deadline - node.clock.monotonic()))
                break
            await asyncio.sleep(tick)
            if self.rng.random() >= settings.participation or node.roles.role is not Role.IDLE:
                continue
            peers = node.members.alive_ids()
            self.rng.shuffle(peers)
            peers.sort(key=node.roles.links.weak)  # peers over a weak link last (their order otherwise kept)
            if peers:
                await node.roles.lead(node.progress.round, peers, node.algorithm.invitations(len(peers)))
        await node.stop_volunteering()
        self.finished.set()

    def on_join(self, peer_id: str, restarted: bool) -> None:
        """Nothing to tell a newcomer: there is no shared round state in async mode."""

    async def play(self, order: Assignment) -> Ack:
        """An invitation from a volunteering aggregator (epoch 0): taken if this node is free."""
        if order.epoch != 0:
            return Ack(ok=False, reason="async_mode")
        return await self.node.roles.play(order)

    async def token(self, request: Token) -> Ack:
        return Ack(ok=False, reason="async_mode")
