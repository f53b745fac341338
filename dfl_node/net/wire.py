"""What both ends of a node's gRPC connection share: the service's name, the channel options, and the
:class:`WireIdentity` a model is encoded with on the way out and checked against on the way in.

A module of its own because the server (:mod:`dfl_node.net.servicer`, :mod:`dfl_node.net.server`) and the
client (:mod:`dfl_node.net.client`) both need these, and neither side should import the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.hashes import DEFAULT_HASH, OFFERED_HASHES
from dfl_node.net.assembler import MessageAssembler
from dfl_node.net.buffers import BufferPool
from dfl_node.net.encoder import Outgoing, prepare
from dfl_node.net.manifest import Limits, Manifest, Resolver
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.wire_dtypes import EXACT

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DflNode"].full_name


def channel_options(limits: Limits) -> list[tuple[str, int]]:
    """Explicit message limits (gRPC's 4 MiB default fails with a misleading INTERNAL error) and fast reconnects."""
    return [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        # A peer that restarts must be reachable again within a heartbeat or two, not after gRPC's
        # default exponential reconnect backoff (up to 120 s) on the channel we keep to it.
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


@dataclass(frozen=True)
class WireIdentity:
    """What a received model must agree with: our swarm, and our architecture (``model``, its fingerprint
    and manifest) or another one that ``resolve`` builds from our registry for an algorithm that fuses it;
    a digest under one of the ``hashes`` we offer; and floating tensors encoded as our ``wire_dtype`` sends
    them (:mod:`dfl_node.peering.wire_dtypes`), which is also how we encode ours."""

    swarm: str
    model: str
    fingerprint: str
    manifest: Manifest
    limits: Limits
    resolve: Resolver | None = field(default=None, compare=False)
    buffers: BufferPool = field(default_factory=BufferPool, compare=False)  # receive buffers, reused across transfers
    hashes: tuple[str, ...] = OFFERED_HASHES  # the payload digests we accept, preferred first (hashes.negotiate)
    wire_dtype: str = EXACT

    def assembler(self) -> MessageAssembler:
        return MessageAssembler(
            swarm=self.swarm, fingerprint=self.fingerprint, manifest=self.manifest, limits=self.limits,
            buffers=self.buffers, model=self.model, resolve=self.resolve, hashes=self.hashes,
            wire_dtype=self.wire_dtype,
        )  # fmt: skip

    def fingerprint_of(self, model: str) -> str:
        """The fingerprint a ``model`` model has here (a FedAvg reply may be of another architecture);
        ``ValueError`` for an architecture this node cannot fuse."""
        if model == self.model:
            return self.fingerprint
        if self.resolve is None:
            raise ValueError(f"{model!r} is not our architecture ({self.model})")
        return self.resolve(model)[0]

    def prepare(self, message: ModelMessage, epoch: int = 0, hash: str = DEFAULT_HASH) -> Outgoing:
        """The frames of ``message`` with a digest under ``hash`` (one the receiver offered), encoded from CPU
        tensors (a model on another device is copied here) as our wire dtype sends them."""
        message = on_device(message, "cpu")
        return prepare(message, swarm=self.swarm, fingerprint=self.fingerprint_of(message.model), epoch=epoch,
                       hash=hash, wire_dtype=self.wire_dtype)


def wire_bytes(header: pb.TransferHeader) -> int:
    """The bytes a transfer took on the wire (its payload and header), as both ends count them."""
    return header.total_size + header.ByteSize()
