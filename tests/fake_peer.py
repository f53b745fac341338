"""A peer that is alive but misbehaves: :class:`FakeNode`, on the in-memory network, or run as a subprocess
over gRPC (tests/test_selection_failures.py).

It answers Hello as a compatible node of the test fleet (same swarm, algorithm and architecture), so
real daemons count it as alive and plan with it, and it refuses every role (Assign, PassToken, Transfer:
``busy``). Then, by ``MODE``:

* ``silent-probe`` — it never answers a selection Probe (the call hangs until the caller gives up);
* ``stalled-pull`` — it answers a Pull with a genuine header and a few chunks of its model, prints
  ``stalled`` and waits to be SIGKILLed: the pulling aggregator sees the stream die mid-way.

Usage: ``fake_peer.py MODE PORT NODE_ID SWARM ALGORITHM SPEC INPUT_SIZE CLASSES``; prints ``ready``.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator

import grpc

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import ModelSpec, fingerprint
from dfl_node.net.encoder import prepare
from dfl_node.net.handlers import method_handlers
from dfl_node.net.manifest import Limits, manifest_of
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.servicer import DflServicer
from dfl_node.net.wire import SERVICE_NAME, WireIdentity
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import Ack, Assignment, Hello, HelloReply, Offer, Ping, PingAck, PullRequest, Token
from dfl_node.peering.probes import ProbeReply, ProbeRequest


class FakeNode:
    """The PeerHandler of a node that is compatible on paper and useless in practice."""

    def __init__(self, node_id: str, swarm: str, algorithm: str, spec: str, size: int, classes: int, port: int) -> None:
        parsed = ModelSpec.parse(spec)
        self.state = parsed.build((1, size, size), classes, seed=7).state_dict()
        self.node_id, self.swarm, self.algorithm, self.spec = node_id, swarm, algorithm, spec
        self.fingerprint = fingerprint(parsed.name, self.state)
        self.address = f"127.0.0.1:{port}"
        self.wire = WireIdentity(swarm, spec, self.fingerprint, manifest_of(self.state), Limits())
        self.idle_timeout = 30.0
        self.boot_id = uuid.uuid4().hex

    def hello(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        return HelloReply(protocol_version=PROTOCOL_VERSION, swarm=self.swarm, node_id=self.node_id,
                          fingerprint=self.fingerprint, algorithm=self.algorithm, boot_id=self.boot_id,
                          grpc_address=self.address, model=self.spec, num_samples=50, accepted=True)

    async def admit(self, offer: Offer) -> None:
        raise TransferRejected("busy", "a fake peer")

    async def assign(self, request: Assignment) -> Ack:
        return Ack(ok=False, reason="busy")

    async def probe(self, request: ProbeRequest) -> ProbeReply:
        """Never answers (in process: on the in-memory network; over gRPC, :class:`Misbehaving` says it)."""
        await asyncio.Event().wait()
        return ProbeReply(ok=False)

    async def pull(self, request: PullRequest) -> ModelMessage:
        raise TransferRejected("busy", "a fake peer")

    async def ping(self, request: Ping) -> PingAck:
        """Alive to the membership's probes (so it stays a member that schedulers pick), with no gossip."""
        return PingAck(ok=True)

    async def token(self, request: Token) -> Ack:
        return Ack(ok=False, reason="busy")

    def on_rejected(self, reason: str, detail: str, sender: str) -> None:
        pass

    def on_transferred(self, sent: int, received: int) -> None:
        pass


class Misbehaving(DflServicer):
    async def Probe(self, request: pb.ProbeRequest, context: grpc.aio.ServicerContext) -> pb.ProbeReply:
        print("probed", flush=True)
        await asyncio.sleep(3600)  # never answers
        return pb.ProbeReply(ok=False)

    async def Pull(self, request: pb.PullRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        node: FakeNode = self.node  # type: ignore[assignment]
        message = ModelMessage(sender=node.node_id, round=request.round, purpose=f"{node.algorithm}.model",
                               num_samples=50, parts=parts_from_state(node.state), model=node.spec)
        frames = list(prepare(message, swarm=node.swarm, fingerprint=node.fingerprint,
                              epoch=request.epoch).frames(chunk_size=512))
        for frame in frames[:4]:  # the header and three chunks of many
            yield frame
        print("stalled", flush=True)
        await asyncio.sleep(3600)


async def main(port: int, node_id: str, swarm: str, algorithm: str, spec: str, size: int,
               classes: int) -> None:
    node = FakeNode(node_id, swarm, algorithm, spec, size, classes, port)
    server = grpc.aio.server()
    handlers = method_handlers(Misbehaving(node, node.wire, node.idle_timeout))  # type: ignore[arg-type]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    port, node_id, swarm, algorithm, spec, size, classes = sys.argv[1:]
    asyncio.run(main(int(port), node_id, swarm, algorithm, spec, int(size), int(classes)))
