"""PeerClient over real gRPC on loopback: how a call ends.

A client that cancels a call as soon as it has the last frame it needs races the status the server is
sending: gRPC's server then fails its send and logs ``ExecuteBatchError`` at ERROR (seen in CI, a
``Traceback`` in an async fleet's log). The client therefore reads every call to its end, the server's
status, before it leaves it; these tests hold a server's handler open after its last frame and check that
the handler ends by itself, never cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.net.client import PeerClient
from dfl_node.net.manifest import Limits, manifest_of
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.wire import WireIdentity
from dfl_node.peering.errors import TransferRefused
from dfl_node.peering.messages import PullRequest
from tests.helpers.codec import FP, SWARM, frames_of, make_msg, make_state


class LingeringPeer(pb_grpc.DflNodeServicer):
    """Answers a Pull, or a Transfer once it has read it, with ``frames``, then lingers a moment before it
    returns: long enough that a client cancelling at its last frame cancels the handler, as a loaded peer's
    status would race that cancel."""

    def __init__(self, frames: list[pb.Frame]) -> None:
        self.frames = frames
        self.endings: list[str] = []

    async def Pull(self, request: pb.PullRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Frame]:
        async for frame in self._answer():
            yield frame

    async def Transfer(self, request_iterator: AsyncIterator[pb.Frame], context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[pb.Frame]:
        async for _ in request_iterator:
            pass
        yield pb.Frame(result=pb.TransferResult(accepted=True))
        async for frame in self._answer():
            yield frame

    async def _answer(self) -> AsyncIterator[pb.Frame]:
        try:
            for frame in self.frames:
                yield frame
            await asyncio.sleep(0.2)
            self.endings.append("returned")
        except asyncio.CancelledError:
            self.endings.append("cancelled")
            raise


async def _pull_from(peer: LingeringPeer) -> ModelMessage:
    async with _client_of(peer) as client:
        message, _ = await client.pull(PullRequest(aggregator="node-0", swarm=SWARM, round=42), timeout=10)
        return message


@contextlib.asynccontextmanager
async def _client_of(peer: LingeringPeer) -> AsyncIterator[PeerClient]:
    server = grpc.aio.server()
    pb_grpc.add_DflNodeServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    wire = WireIdentity(swarm=SWARM, model="", fingerprint=FP, manifest=manifest_of(make_state()), limits=Limits())
    client = PeerClient(f"127.0.0.1:{port}", wire)
    try:
        yield client
    finally:
        await client.close()
        await server.stop(None)


async def test_a_pulled_model_is_read_to_the_end_of_the_call() -> None:
    sent = make_msg()
    source = LingeringPeer(frames_of(sent, chunk_size=300))
    got = await _pull_from(source)
    assert got.round == sent.round and len(got.parts) == len(sent.parts)
    assert source.endings == ["returned"]  # the client waited for the status rather than cancelling


async def test_a_refusal_is_read_to_the_end_of_the_call() -> None:
    source = LingeringPeer([pb.Frame(result=pb.TransferResult(accepted=False, reason="busy", detail="x"))])
    with pytest.raises(TransferRefused, match="x"):
        await _pull_from(source)
    assert source.endings == ["returned"]


async def test_frames_after_the_pulled_model_are_refused() -> None:
    frames = frames_of(make_msg(), chunk_size=300)
    source = LingeringPeer(frames + frames[-1:])
    with pytest.raises(TransferRefused) as refused:
        await _pull_from(source)
    assert refused.value.reason == "trailing_data"


async def test_a_reply_model_is_read_to_the_end_of_the_call() -> None:
    reply = make_msg(purpose="combo-reply")
    peer = LingeringPeer(frames_of(reply, chunk_size=300))
    async with _client_of(peer) as client:
        got, _, _ = await client.push(make_msg(), 0, timeout=10)
    assert got is not None and got.purpose == "combo-reply"
    assert peer.endings == ["returned"]
