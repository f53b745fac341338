"""Relays, as the node sees them: a reservation it holds on a relay (a member its peers can dial), and what a relay
carries for the members it relays. The bytes are the network's (:mod:`dfl_node.net.relay` over TCP; the
simulator's fabric, :mod:`dfl_node.sim.relays`); who relays whom, and when, is the node's
(:mod:`dfl_node.node.membership.reach`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class RelayLoad:
    """What a relay carries: the slots it holds, and what crossed them."""

    slots: int = 0  # nodes it relays now
    connections: int = 0  # connections it spliced to them
    bytes: int = 0  # bytes it carried, both ways
    refused: int = 0  # reservations it refused: no slot left


class Reservation(Protocol):
    """A slot this node holds on a relay: peers reach it at :attr:`address`, through the relay at :attr:`relay`."""

    relay: str  # the relay's address (where the reservation was made)
    relay_id: str  # the relay's node id, as it said ("": it did not say)
    address: str  # where peers reach this node through it

    async def lost(self) -> str: ...  # until the slot is lost (the relay died, the link to it broke): why
    async def close(self) -> None: ...  # give the slot back
