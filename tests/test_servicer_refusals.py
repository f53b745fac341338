"""Which refusals a node's servicer counts in ``rejected``: requests it refused, not outcomes of its own roles.

A round-mode sender answers its holder ``not_fused`` when its aggregator did not fuse (the holder plays
the round again) and an async invitee ``transfer_failed``: neither is a hostile or stale request, so
neither may show up among a node's rejections (a fleet test once failed on a ``not_fused`` there).
"""

from __future__ import annotations

import grpc
import pytest

from dfl_node.net.manifest import Limits
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.server import start_server
from dfl_node.net.wire import WireIdentity
from dfl_node.peering.messages import Ack, Assignment


class AnsweringNode:
    """A PeerHandler that answers every Assign with the Ack it is told to, and records what it counts."""

    def __init__(self) -> None:
        self.wire = WireIdentity("s", "mlp:4", "fp", {}, Limits())
        self.idle_timeout = 5.0
        self.answer = Ack(ok=True)
        self.counted: list[str] = []

    async def assign(self, request: Assignment) -> Ack:
        return self.answer

    def on_rejected(self, reason: str, detail: str, sender: str) -> None:
        self.counted.append(reason)


@pytest.mark.asyncio
async def test_role_outcomes_are_not_counted_as_rejections_and_refusals_are() -> None:
    node = AnsweringNode()
    server, port = await start_server(node, node.wire, node.idle_timeout, "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DflNodeStub(channel)
            for reason in ("not_fused", "transfer_failed", "busy", "stale_epoch", "seed_mismatch"):
                node.answer = Ack(ok=False, reason=reason)
                ack = await stub.Assign(pb.RoundAssignment(round=1, epoch=1, role="sender", senders=["a"]), timeout=10)
                assert ack.reason == reason
    finally:
        await server.stop(None)
    assert node.counted == ["stale_epoch", "seed_mismatch"]
