"""Heartbeats (issue 21): of two confirmed peers only the lower id sends the Hello of each heartbeat; the other
hears the peer's identity and progress from it, and sends its own only when it has not heard from the peer for
1.5 heartbeats. A pair's heartbeats were most of an idle node's CPU (two Hellos a second per pair). A quiet pair (the
peer's last two heartbeats said the same, no token, no role) says Hello every 2 heartbeats, and at every heartbeat
again as soon as something changes or the peer falls silent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dfl_node.node.clock import Clock
from dfl_node.node.peers import PeerTable
from dfl_node.peering.messages import Hello, HelloReply, Progress
from dfl_node.sim.clock import run_virtual

HEARTBEAT = 1.0


def hello_of(node_id: str, round_: int = 0) -> HelloReply:
    return HelloReply(node_id=node_id, grpc_address=f"{node_id}:1", boot_id=node_id, accepted=True,
                      progress=Progress(round=round_))


async def one_heartbeat(table: PeerTable) -> list[str]:
    """The addresses ``table`` says Hello to in one pass of its heartbeat loop (the next comes a heartbeat later)."""
    probed: list[str] = []

    async def hello(address: str, timeout: float) -> HelloReply | None:
        probed.append(address)
        return None

    table.hello = hello
    loop = asyncio.create_task(table.run())
    try:
        await asyncio.sleep(0.1 * HEARTBEAT)  # the pass's Hellos are sent long before its sleep ends
    finally:
        loop.cancel()
    return sorted(probed)


async def test_the_lower_id_sends_the_heartbeat_and_the_higher_id_hears_it() -> None:
    table = PeerTable("m", hello=None, clock=Clock(), heartbeat=HEARTBEAT, timeout=4.0,  # type: ignore[arg-type]
                      static=[])
    for peer in ("a", "z"):  # a below us, z above
        table.seen(hello_of(peer))
    assert await one_heartbeat(table) == ["z:1"]  # a's Hellos to us are our heartbeat with it

    # a's own Hello (a request) carries its progress: the table learns it without asking
    table.heard(Hello(node_id="a", grpc_address="a:1", boot_id="a", progress=Progress(round=7)))
    assert table.progress()["a"].round == 7


async def test_the_higher_id_says_hello_once_the_lower_one_has_been_silent() -> None:
    table = PeerTable("m", hello=None, clock=Clock(), heartbeat=HEARTBEAT, timeout=4.0,  # type: ignore[arg-type]
                      static=["a:1"])
    table.seen(hello_of("a"))
    table.peers["a"].heard_at -= 1.5 * HEARTBEAT  # a has not said Hello for 1.5 heartbeats
    assert await one_heartbeat(table) == ["a:1"]


def quiet_table(peer: str, *, round_: int = 0, holding: bool = False) -> PeerTable:
    """``m``'s table with ``peer`` heard twice (the second time just now): the same progress both times."""
    table = PeerTable("m", hello=None, clock=Clock(), heartbeat=HEARTBEAT, timeout=4.0,  # type: ignore[arg-type]
                      static=[])
    table.seen(hello_of(peer))
    reply = hello_of(peer, round_)
    table.seen(HelloReply(node_id=reply.node_id, grpc_address=reply.grpc_address, boot_id=reply.boot_id,
                          accepted=True, progress=Progress(round=round_, holding=holding)))
    return table


async def test_a_quiet_pair_says_hello_every_two_heartbeats() -> None:
    table = quiet_table("z")  # z is above us: ours to send
    assert table.quiet_interval == 2 * HEARTBEAT
    assert await one_heartbeat(table) == []  # heard just now, and nothing changed
    table.peers["z"].heard_at -= 1.5 * HEARTBEAT  # the next heartbeat is 2 after the last Hello
    assert await one_heartbeat(table) == ["z:1"]
    table.peers["z"].heard_at -= 1.0 * HEARTBEAT  # that one was lost: sent again at the next heartbeat
    assert await one_heartbeat(table) == ["z:1"]


async def test_the_higher_id_of_a_quiet_pair_waits_for_the_lower_ones_hello() -> None:
    table = quiet_table("a")
    table.peers["a"].heard_at -= 2 * HEARTBEAT  # a's Hello of every 2 heartbeats is due, not late
    assert await one_heartbeat(table) == []
    table.peers["a"].heard_at -= 0.5 * HEARTBEAT
    assert await one_heartbeat(table) == ["a:1"]


async def test_a_pair_is_not_quiet_while_something_changes() -> None:
    moved = quiet_table("z")
    moved.seen(hello_of("z", 1))  # its progress changed: every heartbeat again
    assert await one_heartbeat(moved) == ["z:1"]
    holding = quiet_table("z", holding=True)  # a token holder is never quiet
    assert await one_heartbeat(holding) == ["z:1"]


def test_a_short_timeout_keeps_the_heartbeat() -> None:
    """Half the timeout, never more than 2 heartbeats, never less than one: a quiet pair keeps 2 tries in a timeout."""
    table = PeerTable("m", hello=None, clock=Clock(), heartbeat=1.0, timeout=1.5, static=[])  # type: ignore[arg-type]
    assert table.quiet_interval == 1.0


def test_a_pair_whose_round_trip_is_longer_than_a_heartbeat_stays_alive() -> None:
    """Found by a simulated fault case whose Hellos took a heartbeat to go and come back: a Hello waited a heartbeat
    for its answer, so the lower id never had one in time, and the higher id, hearing its Hellos, sent none of its own;
    each side marked the other dead every ``timeout``. A Hello now waits as long as a peer may be silent. Two
    tables over a link of 0.75 heartbeats each way, for 60 heartbeats of virtual time: neither loses the other."""
    latency = 0.75 * HEARTBEAT
    tables: dict[str, PeerTable] = {}
    lost: list[str] = []

    def hello_from(me: str) -> Callable[[str, float], Awaitable[HelloReply | None]]:
        async def hello(address: str, timeout: float) -> HelloReply | None:
            async def call() -> HelloReply:
                await asyncio.sleep(latency)  # our Hello reaches the peer, which hears us in it
                peer = tables[address]
                peer.heard(Hello(node_id=me, grpc_address=f"{me}:1", boot_id=me))
                await asyncio.sleep(latency)  # and its reply comes back
                return hello_of(peer.self_id)
            try:
                return await asyncio.wait_for(call(), timeout)
            except TimeoutError:
                return None
        return hello

    async def main() -> None:
        for me, other in (("a", "z"), ("z", "a")):
            tables[f"{me}:1"] = PeerTable(me, hello_from(me), Clock(), heartbeat=HEARTBEAT, timeout=4.0,
                                          static=[f"{other}:1"], on_lost=lost.append)
        beating = [asyncio.create_task(table.run()) for table in tables.values()]
        await asyncio.sleep(60 * HEARTBEAT)
        for task in beating:
            task.cancel()
        await asyncio.gather(*beating, return_exceptions=True)
        assert [t.alive_ids() for t in tables.values()] == [["z"], ["a"]]

    run_virtual(main())
    assert lost == []
