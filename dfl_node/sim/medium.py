"""What a call crosses on the simulator's fabric: each link's cost, and the call itself, run as a task of its
callee's that a deadline, a dropping link or the callee's death ends.

:class:`Medium` is all of :class:`~dfl_node.sim.network.MemoryFabric` that a link uses
(:mod:`dfl_node.sim.endpoints`): reachability, relay slots and task ownership, with the costs and the calls; the
fabric adds the fleet's side (endpoints, serving, killing).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from dfl_node.peering.errors import PeerUnreachable, TransferCut
from dfl_node.sim.link_profiles import LinkProfile, ProfileFn
from dfl_node.sim.owners import TaskOwners
from dfl_node.sim.relays import RelaySlots

T = TypeVar("T")

_UNCAPPED = (math.inf, math.inf)


class Medium(RelaySlots, TaskOwners):
    """The links and the calls over them (see the module's docstring)."""

    def __init__(self, profile: ProfileFn | None = None, seed: int = 0) -> None:
        RelaySlots.__init__(self)
        TaskOwners.__init__(self)
        self.cuts = random.Random(f"{seed}-cuts")  # how long each connection over a link that drops lasts
        self.caps: dict[str, tuple[float, float]] = {}  # address -> its node's (upload, download) caps, bytes/s
        self.profile: ProfileFn = profile or (lambda src, dst: LinkProfile())
        self.served: dict[str, set[asyncio.Task[Any]]] = defaultdict(set)  # calls in progress, by callee

    def cost(self, src: str, dst: str) -> LinkProfile:
        """What the link from ``src`` to ``dst`` costs now: its profile, its bandwidth held to the sender's upload
        cap and the receiver's download cap; through a slot, both hops (their latencies added, the slower's
        bandwidth, the shorter-lived's connections)."""
        if dst in self.slots:
            relay, node = self.slots[dst]
            a, b = self.cost(src, relay), self.cost(relay, node)
            return LinkProfile(a.latency_s + b.latency_s, min(a.bandwidth, b.bandwidth), min(a.mtbf_s, b.mtbf_s))
        if src in self.slots:  # an answer back through a slot: the way it came
            relay, node = self.slots[src]
            a, b = self.cost(node, relay), self.cost(relay, dst)
            return LinkProfile(a.latency_s + b.latency_s, min(a.bandwidth, b.bandwidth), min(a.mtbf_s, b.mtbf_s))
        link = self.profile(src, dst)
        if not self.caps:  # every membership message asks: no lookups where no node has a cap
            return link
        capped = min(link.bandwidth, self.caps.get(src, _UNCAPPED)[0], self.caps.get(dst, _UNCAPPED)[1])
        return link if capped == link.bandwidth else replace(link, bandwidth=capped)

    async def call(self, dst: str, work: Coroutine[Any, Any, T], timeout: float, *, lifetime: float = math.inf,
                   stream: bool = False) -> T:
        """Run ``work`` as a call served by ``dst`` (a task of its own), for at most ``timeout`` seconds, over a
        connection the link cuts after ``lifetime``; a ``stream`` (a push, a pull) whose callee dies is cut too."""
        relay, callee = self.slots.get(dst, (None, dst))  # through a slot: its node serves it, over its relay
        task = asyncio.get_running_loop().create_task(work, context=self._as(callee))  # the callee's work
        for carrier in (callee, relay) if relay is not None else (callee,):  # either one's death drops it
            served = self.served[carrier]
            served.add(task)
            task.add_done_callback(served.discard)
        try:
            async with asyncio.timeout(min(timeout, lifetime)):  # cancels the call's task then, as wait_for would
                return await task
        except TimeoutError:
            if lifetime < timeout:
                raise TransferCut(f"the link dropped the connection after {lifetime:.3g} s") from None
            raise PeerUnreachable("deadline_exceeded", f"does not answer within {timeout:g} s") from None
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():
                raise  # our own task is cancelled (the call was cancelled with it)
            if stream:
                raise TransferCut("the connection closed (the peer stopped)") from None
            raise PeerUnreachable("unavailable", "closed the connection (it stopped)") from None

