"""Who answers at an address of the simulator's fabric, who can connect to whom, and waiting until that changes.

A node answers where it serves until it is killed; a partition cuts the links between its sides; nobody dials an
address behind NAT, whose node is reached through a relay slot instead (the slots themselves:
:mod:`dfl_node.sim.relays`). Whoever waits for a peer to become reachable (gRPC's ``wait_for_ready``, a relay slot
that may be lost) waits on the addresses it depends on, and wakes only when one of them changes.
:class:`Reachability` is a part of :class:`~dfl_node.sim.network.MemoryFabric`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

from dfl_node.peering.port import PeerHandler


class Reachability:
    """Which addresses answer and which links are cut, on the fabric (see the module's docstring)."""

    def __init__(self) -> None:
        self.handlers: dict[str, PeerHandler] = {}
        self.ids: dict[str, str] = {}  # address -> the id of the node serving there (a relay says its id)
        self.nat: set[str] = set()  # addresses behind NAT: nobody dials them; their nodes are reached by relays
        self.slots: dict[str, tuple[str, str]] = {}  # a relay slot's address -> (its relay's, its node's)
        self.down: set[str] = set()
        self.groups: dict[str, int] = {}  # a partition: address -> its side (addresses not listed reach everyone)
        # who waits for reachability at an address to change: each waiter's event under every address it depends
        # on, so a change wakes only those it concerns (a thousand nodes each waiting on its slot, a thousand slots
        # reserved at a start: not a million wake-ups)
        self._watchers: dict[str, set[asyncio.Event]] = defaultdict(set)

    def partition(self, *sides: set[str]) -> None:
        """Cut the links between ``sides`` (each a set of addresses) until :meth:`heal`."""
        self.groups = {address: i for i, side in enumerate(sides) for address in side}
        self._notify()

    def heal(self) -> None:
        self.groups = {}
        self._notify()

    def _notify(self, *addresses: str) -> None:
        """Reachability changed at ``addresses`` (none given: anywhere, as a partition changes it)."""
        for address in addresses or list(self._watchers):
            for event in self._watchers.pop(address, ()):
                event.set()

    async def _until_changed(self, addresses: Iterable[str]) -> None:
        """Until reachability changes at one of ``addresses``."""
        event, watched = asyncio.Event(), set(addresses)
        for address in watched:
            self._watchers[address].add(event)
        try:
            await event.wait()
        finally:
            for address in watched:
                waiting = self._watchers.get(address)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._watchers[address]

    def _depends(self, address: str) -> tuple[str, ...]:
        """The addresses whose changes change whether ``address`` answers: itself, and a slot's relay and node."""
        return (address, *self.slots.get(address, ()))

    # ----- reachability -------------------------------------------------------------------
    def listening(self, address: str) -> bool:
        """Whether anything answers a connection to ``address``: its node (through its relay, for a slot)."""
        if address in self.slots:
            relay, node = self.slots[address]
            return self.listening(relay) and self.listening(node) and not self.cut(node, relay)
        return address in self.handlers and address not in self.down

    def cut(self, src: str, dst: str) -> bool:
        """Whether a connection from ``src`` to ``dst`` cannot be made: a partition between them (or between a slot's
        relay and its node), or ``dst`` behind NAT."""
        if dst in self.slots:
            relay, node = self.slots[dst]
            return self.cut(src, relay) or self.cut(node, relay)
        if dst in self.nat and src != dst:
            return True
        a, b = self.groups.get(src), self.groups.get(dst)
        return a is not None and b is not None and a != b

    def reachable(self, src: str, dst: str) -> bool:
        return self.listening(dst) and not self.cut(src, dst)

    async def until_reachable(self, src: str, dst: str, timeout: float) -> bool:
        """Whether ``dst`` became reachable from ``src`` within ``timeout`` (at once if it is)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.reachable(src, dst):
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._until_changed((*self._depends(dst), src)), left)
            except TimeoutError:
                return False
        return True

