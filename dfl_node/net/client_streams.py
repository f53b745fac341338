"""The client's side of the streamed calls (a Transfer, a Pull), one step each: writing a model while reading the
peer's verdict, the receiver's answer to a resumed push, the rest of a response stream, a refusal read to its call's
end, and what a cut stream left of a reply or a pulled model.

:class:`~dfl_node.net.client.PeerClient` composes them into its push and pull; tests and the fuzz suite drive a
Transfer with :func:`open_transfer` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import grpc

from dfl_node.net.assembler import MessageAssembler
from dfl_node.net.frames import ReadFrame, WireFrame, wire_size
from dfl_node.net.pacing import NO_PACING, Pacing
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.errors import TransferRefused
from dfl_node.peering.resume import Resume


async def open_transfer(
    transfer: grpc.aio.StreamStreamMultiCallable, frames: Iterable[WireFrame], timeout: float
) -> tuple[pb.TransferResult, grpc.aio.StreamStreamCall, int]:
    """A Transfer call that writes ``frames`` while reading the peer's verdict; returns (verdict, call, bytes
    written): :func:`write_for_verdict` on a call of its own."""
    call = transfer(timeout=timeout, wait_for_ready=True)
    result, sent = await write_for_verdict(call, frames)
    return result, call, sent


async def write_for_verdict(call: grpc.aio.StreamStreamCall, frames: Iterable[WireFrame],
                            pacing: Pacing = NO_PACING,
                            wrote: Callable[[int], None] | None = None) -> tuple[pb.TransferResult, int]:
    """Write ``frames`` on ``call`` (each as ``pacing``'s upload cap allows, and told to ``wrote`` once written, so
    that a stream that breaks counts what it wrote too) while reading the peer's verdict; returns (verdict, bytes
    written).

    Writing and reading run concurrently because a receiver may refuse at the header (busy, wrong
    fingerprint…) and close the stream while we are still writing: the verdict must still reach us
    rather than a write error. After an acceptance every frame has been written.
    """
    sent = 0

    async def write_all() -> None:
        nonlocal sent
        for frame in frames:
            size = wire_size(frame)
            await pacing.sent(size)
            sent += size
            await call.write(frame)
            if wrote is not None:
                wrote(size)
        await call.done_writing()

    writer = asyncio.get_running_loop().create_task(write_all())
    try:
        first = await call.read()
    except grpc.aio.AioRpcError:
        failed = writer.exception() if writer.done() and not writer.cancelled() else None
        if failed is not None and not isinstance(failed, (grpc.aio.AioRpcError, asyncio.InvalidStateError)):
            raise failed from None  # not the call's end (which the read reports): a bug of ours
        await _stopped(writer)
        raise
    if isinstance(first, pb.Frame) and first.WhichOneof("kind") == "result" and first.result.accepted:
        await writer
        return first.result, sent
    await _stopped(writer)
    if not isinstance(first, pb.Frame) or first.WhichOneof("kind") != "result":
        raise TransferRefused("protocol", "peer sent no result frame")
    return first.result, sent


async def _stopped(writer: asyncio.Task[None]) -> None:
    """``writer`` cancelled, once its call has ended (refused, cut): what it would still write goes nowhere."""
    writer.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
        await writer


@dataclass(frozen=True)
class Held:
    """What arrived of a reply or a pulled model before its stream was cut: the payload's digest, and its bytes."""

    digest: bytes
    received: int


def held_of(resume: Resume) -> Held | None:
    """What ``resume`` holds of a reply or a pulled model from a stream that was cut (None: nothing)."""
    held = resume.held
    if not isinstance(held, MessageAssembler) or held.header is None:
        return None
    return Held(held.header.digest, held.received)


async def resume_at(call: grpc.aio.StreamStreamCall, total: int) -> int:
    """The receiver's answer to a resumed push: the payload bytes it holds (we go on from there), or its refusal."""
    first = await call.read()
    if first is grpc.aio.EOF:
        raise TransferRefused("protocol", "the receiver ended a resumed transfer without an answer")
    if isinstance(first, pb.Frame) and first.WhichOneof("kind") == "result":
        raise await read_refusal(call, first.result)
    if not isinstance(first, pb.Frame) or first.WhichOneof("kind") != "resume" or first.resume.offset > total:
        raise TransferRefused("protocol", f"a resumed transfer was answered with no offset within {total} bytes")
    return first.resume.offset


async def remaining(call: grpc.aio.StreamStreamCall | grpc.aio.UnaryStreamCall) -> AsyncIterator[ReadFrame]:
    """The rest of a response stream; ``read()`` and ``async for`` must not be mixed on one call."""
    while (frame := await call.read()) is not grpc.aio.EOF:
        yield frame


async def read_refusal(call: grpc.aio.StreamStreamCall | grpc.aio.UnaryStreamCall, result: pb.TransferResult
                       ) -> TransferRefused:
    """The peer's refusal, once its call has ended: cancelling the call at once would race the status the
    peer is sending (see :func:`~dfl_node.net.assembler.assemble`)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        async for _ in remaining(call):
            return TransferRefused("protocol", f"frames after a refusal ({result.reason})")
    return TransferRefused(result.reason, result.detail)
