"""Heartbeats (issue 21): of two confirmed peers only the lower id sends the Hello of each heartbeat; the other
hears the peer's identity and progress from it, and sends its own only when it has not heard from the peer for
1.5 heartbeats. A pair's heartbeats were most of an idle node's CPU (two Hellos a second per pair)."""

from __future__ import annotations

import asyncio

from dfl_node.node.clock import Clock
from dfl_node.node.peers import PeerTable
from dfl_node.peering.messages import Hello, HelloReply, Progress

HEARTBEAT = 1.0


def hello_of(node_id: str, round_: int = 0) -> HelloReply:
    return HelloReply(node_id=node_id, grpc_address=f"{node_id}:1", boot_id=node_id, accepted=True,
                      progress=Progress(round=round_))


async def one_heartbeat(table: PeerTable) -> list[str]:
    """The addresses ``table`` says Hello to in one pass of its heartbeat loop."""
    probed: list[str] = []
    first_pass = asyncio.Event()

    async def hello(address: str) -> HelloReply | None:
        probed.append(address)
        first_pass.set()
        return None

    table.hello = hello
    loop = asyncio.create_task(table.run())
    try:
        await asyncio.wait_for(first_pass.wait(), 5)
        await asyncio.sleep(0)  # the rest of the pass's gather
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
