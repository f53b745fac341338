"""The simulator's NAT relay slots: a node behind NAT holds a slot on a relay, an address that others dial and
that reaches it through its relay.

A slot is the relay's host and a port of its own (an address like any other), routed by the fabric through both
hops (:meth:`~dfl_node.sim.reachability.Reachability.listening`, :meth:`~dfl_node.sim.medium.Medium.cost`). A relay
gives at most its node's ``--relay-slots`` and counts what it carried (:class:`~dfl_node.peering.relays.RelayLoad`);
a slot is lost when its relay stops or a partition cuts its node off (:class:`MemoryReservation`, the
:class:`~dfl_node.peering.relays.Reservation` a node holds). :class:`RelaySlots` is a part of
:class:`~dfl_node.sim.network.MemoryFabric`.
"""

from __future__ import annotations

from collections import defaultdict

from dfl_node.peering.relays import RelayLoad
from dfl_node.sim.reachability import Reachability

SLOT_PORTS = 40_000  # a relay slot is the relay's host and a port from here on: an address like any other


class RelaySlots(Reachability):
    """The slots each relay gives, to whom, and what each relay carried (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.relay_slots: dict[str, int] = {}  # address -> the slots its node gives at most (--relay-slots)
        self.loads: dict[str, RelayLoad] = defaultdict(RelayLoad)  # address -> what it carried as a relay
        self._slot_ports = 0
        self._held: dict[str, str] = {}  # a node's address -> the slot it holds

    def reserve(self, relay: str, node: str) -> str | None:
        """A slot on ``relay`` for ``node`` (one it held before replaced): its address, or None where ``relay`` has
        none left (its node's ``--relay-slots``)."""
        if (held := self._held.get(node)) is not None:
            self.release(held)
        if self.loads[relay].slots >= self.relay_slots.get(relay, 0):
            self.loads[relay].refused += 1
            return None
        self._slot_ports += 1
        slot = f"{relay.rpartition(':')[0]}:{SLOT_PORTS + self._slot_ports}"
        self.slots[slot], self._held[node] = (relay, node), slot
        self.loads[relay].slots += 1
        self._notify(slot)
        return slot

    def release(self, slot: str) -> None:
        relay, node = self.slots.pop(slot, (None, None))
        if relay is not None and node is not None:
            self.loads[relay].slots -= 1
            del self._held[node]
            self._notify(slot)

    def relayed(self, slot: str, nbytes: int) -> None:
        """A message of ``nbytes`` through ``slot``: counted by its relay."""
        relay, _ = self.slots[slot]
        self.loads[relay].connections += 1
        self.loads[relay].bytes += nbytes

    async def until_lost(self, slot: str) -> str:
        """Until ``slot`` stops carrying: its relay or its node died, or a partition cut them apart; why."""
        while True:
            if slot not in self.slots:
                return "released"
            relay, node = self.slots[slot]
            if not self.listening(relay):
                return "the relay stopped"
            if self.cut(node, relay):
                return "cut off from the relay"
            await self._until_changed((slot, relay, node))



class MemoryReservation:
    """A relay slot on the fabric (:class:`~dfl_node.peering.relays.Reservation`): lost when the relay stops or a
    partition cuts its node from it."""

    def __init__(self, fabric: RelaySlots, relay: str, address: str, relay_id: str) -> None:
        self.fabric, self.relay, self.address, self.relay_id = fabric, relay, address, relay_id

    async def lost(self) -> str:
        return await self.fabric.until_lost(self.address)

    async def close(self) -> None:
        self.fabric.release(self.address)

