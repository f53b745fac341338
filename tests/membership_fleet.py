"""A fleet of the daemon's memberships alone, on the simulator's fabric and virtual clock: SWIM, the peer table and
the Hello handshake (:class:`~dfl_node.node.membership.membership.Membership`) as a node runs them, with the default
settings and every other node a static peer as the simulator plans a fleet, but without models or data — so that a
thousand members cost about a second of wall time per virtual second, and the membership's bounds at N = 1,000 can be
checked by a test (``tests/test_swim.py``). Kills are kill -9 as the simulator's fleet plays them (every task of the
node cancelled, its calls dropped); a restart is a new boot at the same address. The figures are the simulator's
(:class:`~dfl_node.sim.membership.MembershipRecord`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms.base import derive_seed
from dfl_node.algorithms.plan import NodeProfile
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.membership.membership import Membership
from dfl_node.peering.messages import Hello, HelloReply, Ping, PingAck
from dfl_node.peering.wire_dtypes import EXACT
from dfl_node.records.metrics import NodeMetrics
from dfl_node.settings.node import MembershipSettings
from dfl_node.sim.clock import VirtualClock, run_virtual
from dfl_node.sim.membership import MembershipRecord
from dfl_node.sim.network import MemoryFabric

MODEL, FINGERPRINT, SAMPLES = "mlp:16", "f" * 64, 100  # one architecture for all: every member compatible


def member_hello(node_id: str, address: str, boot_id: str) -> Hello:
    """The Hello of a member of these fleets (every member compatible with every other)."""
    return Hello(protocol_version=PROTOCOL_VERSION, node_id=node_id, fingerprint=FINGERPRINT, algorithm="defkt",
                 boot_id=boot_id, grpc_address=address, model=MODEL, num_samples=SAMPLES, wire_dtype=EXACT,
                 sample_shape=(64,), num_classes=10)


@dataclass(frozen=True)
class Kill:
    """kill -9 of ``node`` at virtual second ``at``; it starts again (a new boot) ``down_for`` seconds later."""

    at: float
    node: str
    down_for: float = float("inf")


class Member:
    """One node's membership, serving Hellos and membership pings at its address (a node's other calls never come:
    nothing here plays a round)."""

    def __init__(self, node_id: str, address: str, peers: list[str], boot: int, record: MembershipRecord,
                 fabric: MemoryFabric) -> None:
        self.node_id, self.address, self.boot_id = node_id, address, f"{node_id}/{boot}"
        self._hello = member_hello(node_id, address, self.boot_id)  # one object, as a node's while it stands still
        clock = VirtualClock()
        progress = RoundProgress(clock)
        tally = Tally(clock, NodeMetrics(node_id, status=lambda: None), progress)  # type: ignore[arg-type,return-value]
        network = fabric.endpoint(address)
        record.started(node_id, asyncio.get_running_loop().time(), network)
        settings = MembershipSettings(peers=peers)
        self.membership = Membership(node_id, address, settings, clock, hello=self.says, profile=self.profile,
                                     fingerprint_of=lambda model: FINGERPRINT, network=network, tally=tally,
                                     on_join=lambda peer, restarted: None, on_lost=lambda peer: None,
                                     seed=derive_seed(boot, node_id, "membership"))  # as a daemon seeds it
        self.membership.swim.listeners.append(record.observer(node_id))

    def says(self) -> Hello:
        return self._hello

    def profile(self) -> NodeProfile:
        return NodeProfile(self.node_id, MODEL, SAMPLES)

    # what the fabric calls (the membership's part of a PeerHandler)
    def hello(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        return self.membership.answer(request, peer, refused)

    async def ping(self, request: Ping) -> PingAck:
        return await self.membership.ping(request)


def run_members(nodes: int, duration: float, kills: tuple[Kill, ...] = (),
                newcomers: tuple[float, ...] = ()) -> tuple[dict[str, Any], MembershipRecord]:
    """``nodes`` members started together at virtual time 0 (each listing the others as static peers), ``kills``
    played, a new member started at each time of ``newcomers`` (``new-0``, ``new-1``…: it lists the fleet, nobody
    lists it), for ``duration`` virtual seconds: the simulator's membership figures (messages per node and second,
    suspicions, detections, joins) and the record they were made from."""
    record = MembershipRecord(MembershipSettings())

    async def main() -> dict[str, Any]:
        fabric = MemoryFabric()
        fabric.install(asyncio.get_running_loop())
        ids = [f"node-{i}" for i in range(nodes)] + [f"new-{i}" for i in range(len(newcomers))]
        addresses = {node_id: f"127.0.0.1:{50_000 + i}" for i, node_id in enumerate(ids)}
        fleet = [addresses[node_id] for node_id in ids[:nodes]]
        boots = dict.fromkeys(ids, 0)

        def start(node_id: str) -> None:
            address = addresses[node_id]
            member = Member(node_id, address, [a for a in fleet if a != address], boots[node_id], record, fabric)
            boots[node_id] += 1
            fabric.serve(address, member)  # type: ignore[arg-type]
            fabric.spawn(address, member.membership.run())

        def kill(node_id: str, down_for: float) -> None:
            record.killed(node_id, loop.time())
            ending.update(fabric.kill(addresses[node_id]))
            if down_for != float("inf"):
                loop.call_later(down_for, start, node_id)

        loop, ending = asyncio.get_running_loop(), set[asyncio.Task[Any]]()
        for node_id in ids[:nodes]:
            start(node_id)
        for k in kills:
            loop.call_at(k.at, kill, k.node, k.down_for)
        for i, at in enumerate(newcomers):
            loop.call_at(at, start, f"new-{i}")
        await asyncio.sleep(duration)
        for address in addresses.values():
            ending.update(fabric.kill(address))
        await asyncio.gather(*ending, return_exceptions=True)
        return record.figures(duration)

    return run_virtual(main()), record
