"""Async mode: no global clock, as a real IoT fleet runs.

Each tick (``interval`` seconds, jittered) a node volunteers with probability ``participation``
("only plugged-in devices volunteer"); a volunteer trains, then pushes to live peers in a random
order until one accepts — a busy receiver refuses at the header and the sender tries the next.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

from dfl_node.algorithms.base import derive_seed
from dfl_node.net.codec import TransferRejected
from dfl_node.net.proto import dfl_pb2 as pb

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)


class AsyncScheduler:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.finished = asyncio.Event()
        self.rng = random.Random(derive_seed(node.config.seed, node.config.id, "async"))

    async def run(self) -> None:
        node, cfg = self.node, self.node.config
        await node.peers.wait_for(cfg.min_peers)
        deadline = time.monotonic() + cfg.duration if cfg.duration else None
        while deadline is None or time.monotonic() < deadline:
            await asyncio.sleep(cfg.interval * self.rng.uniform(0.5, 1.5))
            if self.rng.random() >= cfg.participation or node.role != "idle":
                continue
            peers = node.peers.alive_ids()
            self.rng.shuffle(peers)
            targets = [(p, node.peers.address_of(p)) for p in peers]
            try:
                if await node.send(node.round, 0, targets) is not None:
                    node.round += 1
            except TransferRejected:
                continue  # a transfer to us took the role first
        node.done = True
        await node.save()
        self.finished.set()

    def on_join(self, peer_id: str, restarted: bool) -> None:
        """Nothing to tell a newcomer: there is no shared round state in async mode."""

    async def assign(self, request: pb.RoundAssignment) -> pb.Ack:
        return pb.Ack(ok=False, reason="async_mode")

    async def token(self, request: pb.RoundToken) -> pb.Ack:
        return pb.Ack(ok=False, reason="async_mode")
