"""A real node for hostile input (in-process, real gRPC and HTTP on loopback): :class:`Target`, what the attacks
reach it through; :func:`targeted`, the node run for a test (the ``target`` fixture, ``tests/conftest.py``, is it
with no settings changed); and what it must still do after an attack."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import build_model
from dfl_node.net.client_streams import open_transfer
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.node.node import Node
from dfl_node.service.run import run_node
from dfl_node.service.wiring import Daemon
from dfl_node.testbed.launcher import free_port
from tests.helpers.codec import frames_of
from tests.helpers.fleet import fleet_node_config
from tests.helpers.nodes import order


@dataclass
class Target:
    node: Node
    stub: pb_grpc.DflNodeStub
    url: str

    async def rejected(self) -> dict[str, int]:
        async with httpx.AsyncClient(trust_env=False) as http:
            return (await http.get(f"{self.url}/status")).json()["rejected"]

    async def expect(self, sender: str = "stranger", round_: int = 0) -> None:
        """Make the node the aggregator of a group of ``round_`` whose one sender is ``sender`` (as a holder
        would). A node plays each round once: after a fusion, the next group must be of a later round."""
        ack = await self.node.roles.play(order(round=round_, role="aggregator", aggregator=self.node.config.id,
                                               senders=(sender,), deadline_s=30))
        assert ack.ok and ack.reason != "already_played", ack

    async def transfer(self, frames: Iterable[pb.Frame]) -> pb.TransferResult:
        """Send raw frames with the node's own client path and return the receiver's verdict."""
        result, call, _ = await open_transfer(self.stub.Transfer, frames, timeout=10)
        call.cancel()
        return result

    def message(self, seed: int = 99, round_: int = 0) -> ModelMessage:
        cfg = self.node.config
        model = build_model(cfg.learning.model, (1, 8, 8), 10, hidden=cfg.learning.hidden, seed=seed)
        return ModelMessage(sender="stranger", round=round_, purpose="defkt.model", num_samples=100,
                            parts=parts_from_state(model.state_dict()), model=self.node.identity.model)

    def frames(self, chunk_size: int = 4096, round_: int = 0) -> list[pb.Frame]:
        return frames_of(self.message(round_=round_), chunk_size, swarm=self.node.config.swarm,
                         fingerprint=self.node.identity.fingerprint)


@contextlib.asynccontextmanager
async def targeted(fleet_shards: Path, tmp_path: Path, **settings: object) -> AsyncIterator[Target]:
    """A real node on gRPC and REST, ``settings`` given (flat keys), and a stub that reaches it."""
    config = fleet_node_config(**{
        "id": "node-0", "data": fleet_shards / "node-0", "test_data": fleet_shards / "test.safetensors",
        "grpc_port": free_port(), "http_port": free_port(), "mdns": False, "swarm": f"hostile-{uuid.uuid4().hex[:6]}",
        "state_dir": tmp_path / "state", **settings})
    served = Daemon.build(config)
    node = served.node
    stop = asyncio.Event()
    task = asyncio.create_task(run_node(served, stop))
    await node.ready.wait()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{config.network.grpc_port}",
                                        options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        yield Target(node, pb_grpc.DflNodeStub(channel), f"http://127.0.0.1:{config.api.http_port}")
    finally:
        await channel.close()
        stop.set()
        await task


async def assert_still_serving(t: Target) -> None:
    """A genuine model is still accepted and fused after the attack."""
    before = t.node.tally.counters["fusions"]
    round_ = t.node.progress.played + 1  # the next round this node has not played
    await t.expect(round_=round_)
    verdict = await t.transfer(t.frames(round_=round_))
    assert verdict.accepted, verdict
    await t.node.roles.settled()  # the verdict comes once the model is validated; fusing follows
    assert t.node.tally.counters["fusions"] == before + 1
    assert t.node.roles.role.value == "idle" and t.node.history()[-1].event == "fusion"


def stranger_hello(t: Target, **changes: object) -> pb.HelloRequest:
    """A Hello to ``t`` from "stranger", compatible in every field but ``changes``."""
    fields = dict(protocol_version=PROTOCOL_VERSION, swarm=t.node.config.swarm, node_id="stranger",
                  fingerprint=t.node.identity.fingerprint, algorithm="defkt", grpc_address="127.0.0.1:1", boot_id="b",
                  model=t.node.identity.model, sample_shape=[1, 8, 8], num_classes=10)
    return pb.HelloRequest(**{**fields, **changes})
