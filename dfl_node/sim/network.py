"""The peer network port in memory: K real nodes in one process, each a :class:`PeerHandler` at an address.

:class:`MemoryFabric` is the medium every node shares: which address serves which node's handler, which
addresses are down (a killed node) or cut off from each other (a partition), and what each link costs
(:class:`~dfl_node.sim.link_profiles.LinkProfile`). A node gets its own :class:`MemoryNetwork` from it (its side of
every link), and passes it to :class:`~dfl_node.node.node.Node` in place of the gRPC network.

The fabric is made of parts with one job each: who answers and who can connect (:mod:`dfl_node.sim.reachability`),
the NAT relay slots (:mod:`dfl_node.sim.relays`), whose work each task is (:mod:`dfl_node.sim.owners`), what a call
crosses (:mod:`dfl_node.sim.medium`); a node's side of it and its links are :mod:`dfl_node.sim.endpoints`.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from dfl_node.peering.port import PeerHandler
from dfl_node.peering.wire_dtypes import EXACT
from dfl_node.sim.endpoints import MemoryNetwork
from dfl_node.sim.medium import Medium


class MemoryFabric(Medium):
    """The medium shared by all nodes of a simulation (see the module's docstring)."""

    def endpoint(self, address: str, *, connect_timeout: float = 5.0, wire_dtype: str = EXACT,
                 max_upload: float = 0.0, max_download: float = 0.0, relay_slots: int = 0,
                 behind_nat: bool = False) -> MemoryNetwork:
        """The network of the node that will serve at ``address`` (:meth:`serve` it once it is built); its models
        and those sent to it cross as a ``wire_dtype`` wire delivers them (the same on every node: Hello), no
        faster than its caps (bytes/s; 0: none); it relays up to ``relay_slots`` nodes; ``behind_nat``: nobody
        can dial it."""
        if max_upload or max_download:
            self.caps[address] = (max_upload or math.inf, max_download or math.inf)
        self.relay_slots[address] = relay_slots
        if behind_nat:
            self.nat.add(address)
        return MemoryNetwork(self, address, connect_timeout, wire_dtype)

    def serve(self, address: str, handler: PeerHandler, node_id: str = "") -> None:
        """``handler`` (node ``node_id``'s) answers at ``address`` from now on (a node started, or restarted)."""
        self.handlers[address] = handler
        self.ids[address] = node_id
        self.down.discard(address)
        self._notify(address)

    def kill(self, address: str) -> list[asyncio.Task[Any]]:
        """kill -9 of the node at ``address``: nothing answers there any more, the calls it was serving are
        cancelled (its callers see the connection drop), and so is every task of its own (:meth:`install`).
        Returns those tasks, for whoever must wait until they have ended."""
        self.down.add(address)
        self.handlers.pop(address, None)
        tasks = [*self.served.pop(address, ()), *self.owned.pop(address, ())]
        for task in tasks:
            task.cancel()
        self._notify(address)
        return tasks

