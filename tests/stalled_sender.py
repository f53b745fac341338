"""A sender that dies mid-stream (run as a subprocess by test_aggregator.py, then SIGKILLed).

It pushes a genuine FedAvg message of the test fleet's architecture to ``ADDRESS`` as sender
``SENDER`` for round 0, but stops after the header and a few small chunks, prints ``stalled``
and waits to be killed: the aggregator sees a live stream go dead halfway.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import ModelSpec, fingerprint
from dfl_node.net.codec import prepare
from dfl_node.net.frames import decode_frame, encode_frame
from dfl_node.net.wire import SERVICE_NAME


async def main(address: str, sender: str, swarm: str, spec: str, input_size: int, classes: int) -> None:
    parsed = ModelSpec.parse(spec)
    state = parsed.build((1, input_size, input_size), classes, seed=7).state_dict()
    message = ModelMessage(sender=sender, round=0, purpose="fedavg.model", num_samples=50,
                           parts=parts_from_state(state), model=spec)
    frames = list(prepare(message, swarm=swarm, fingerprint=fingerprint(parsed.name, state)).frames(chunk_size=512))
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(f"/{SERVICE_NAME}/Transfer", request_serializer=encode_frame,
                                     response_deserializer=decode_frame)(timeout=120)
        for frame in frames[:4]:  # the header and three chunks of many
            await call.write(frame)
        print("stalled", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    address, sender, swarm, spec, size, classes = sys.argv[1:]
    asyncio.run(main(address, sender, swarm, spec, int(size), int(classes)))
