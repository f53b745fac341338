"""A sender that dies mid-stream (run as a subprocess by test_aggregator.py, then SIGKILLed).

It pushes the start of a genuine FedAvg message of the test fleet's architecture — the header and a few small
chunks, which the test encodes with the node's own codec (:func:`first_frames`) and writes to its stdin — to
``ADDRESS``'s ``METHOD`` (the Transfer RPC), prints ``stalled`` and waits to be killed: the aggregator sees a live
stream go dead halfway. The process itself imports gRPC alone, not torch and the node: it is up in a fraction of a
second rather than several.

    python tests/stalled_sender.py ADDRESS METHOD < FRAMES
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import sys
from typing import BinaryIO

import grpc

_LENGTH = struct.Struct(">I")


def first_frames(sender: str, swarm: str, spec: str, input_size: int, classes: int, count: int = 4) -> list[bytes]:
    """The first ``count`` encoded frames of ``sender``'s FedAvg message for round 0 (the header and ``count - 1``
    chunks of many), a model of ``spec`` for ``input_size``² inputs and ``classes`` classes."""
    from dfl_node.algorithms.messages import ModelMessage, parts_from_state  # noqa: PLC0415
    from dfl_node.learning.models import ModelSpec, fingerprint  # noqa: PLC0415
    from dfl_node.net.encoder import prepare  # noqa: PLC0415
    from dfl_node.net.frames import encode_frame  # noqa: PLC0415

    parsed = ModelSpec.parse(spec)
    state = parsed.build((1, input_size, input_size), classes, seed=7).state_dict()
    message = ModelMessage(sender=sender, round=0, purpose="fedavg.model", num_samples=50,
                           parts=parts_from_state(state), model=spec)
    frames = prepare(message, swarm=swarm, fingerprint=fingerprint(parsed.name, state)).frames(chunk_size=512)
    return [encode_frame(frame) for frame in itertools.islice(frames, count)]


def pack(frames: list[bytes]) -> bytes:
    """``frames`` as this script reads them from its stdin: each one after its length."""
    return b"".join(_LENGTH.pack(len(frame)) + frame for frame in frames)


def unpack(stream: BinaryIO) -> list[bytes]:
    frames = []
    while header := stream.read(_LENGTH.size):
        frames.append(stream.read(_LENGTH.unpack(header)[0]))
    return frames


async def main(address: str, method: str, frames: list[bytes]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(method)(timeout=120)  # no serializers: the frames go as the bytes they are
        for frame in frames:
            await call.write(frame)
        print("stalled", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    address, method = sys.argv[1:]
    asyncio.run(main(address, method, unpack(sys.stdin.buffer)))
