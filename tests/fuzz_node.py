"""A real node for the gRPC fuzz cases (test_fuzz_grpc.py), and how they send it raw bytes.

:class:`LiveNode` runs ``run_node`` (gRPC, REST, checkpoints) in a thread with its own event loop, so
that synchronous hypothesis tests can drive it; everything that touches it runs on that loop.
:func:`flood` sends a batch of malformed requests at once and checks that each was refused and counted
once, under the reason the peer was told, and that nothing on the node changed (:class:`Snapshot`).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import torch

from dfl_node.algorithms import Group, Role, Step
from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.learning.models import build_model
from dfl_node.net.client_streams import open_transfer
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.node import Node
from dfl_node.peering.messages import Ack
from dfl_node.service.run import run_node
from dfl_node.service.wiring import Daemon
from dfl_node.settings.node import NodeConfig
from tests.fuzz_figures import MIN_GRPC_INPUTS, Figures
from tests.fuzz_strategies import CLASSES, INPUT_SHAPE
from tests.helpers.codec import encoded_frames

T = TypeVar("T")

FIGURES = Figures("gRPC, all six RPCs of a real node (RSS and fds from the node up)", MIN_GRPC_INPUTS)
STATE_CHANGES: list[str] = []  # what a flood of refused input changed on the node
# Probes refused "busy": a concurrent probe met the node answering another one of the same flood (it answers one
# at a time). That is no hostile input to count, so the node does not, and neither does the flood's check.
BUSY: list[str] = []


@dataclass(frozen=True)
class Snapshot:
    """What a refused request must not change on the node."""

    weights: str  # sha256 of every value of the model (and the algorithm's extra models)
    files: tuple[tuple[str, str], ...]  # checkpoint files and their sha256
    peers: tuple[str, ...]
    pending: tuple[str, ...]
    clients: tuple[str, ...]
    progress: tuple[Any, ...]  # round, epoch, token state, holding, holder, done, role, history length, collector

    def changes(self, other: Snapshot) -> list[str]:
        return [name for name in self.__dataclass_fields__ if getattr(self, name) != getattr(other, name)]


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name, t in sorted(state.items()):
        digest.update(name.encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class LiveNode:
    """A real node (``run_node``: gRPC, REST, checkpoints) in a thread with its own event loop, and a channel to
    it; :meth:`start` also records what the flood must leave as it is (``baseline``)."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzzed-node", daemon=True)
        self.stop = asyncio.Event()
        self.node: Node
        self.task: asyncio.Task[None]
        self.channel: grpc.aio.Channel
        self.baseline: Snapshot
        model = build_model(config.learning.model, INPUT_SHAPE, CLASSES, hidden=config.learning.hidden, seed=99)
        self.genuine_state = model.state_dict()

    def run(self, coro: Awaitable[T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def call(self, fn: Callable[[], T]) -> T:
        async def on_loop() -> T:
            return fn()

        return self.run(on_loop())

    def start(self) -> None:
        self.thread.start()
        self.node = self.run(self._start(), timeout=180)
        self.genuine_frames = encoded_frames(self.message(), 4096, swarm=self.config.swarm,
                                             fingerprint=self.node.identity.fingerprint)
        self.baseline = self.snapshot()

    async def _start(self) -> Node:
        served = Daemon.build(self.config)
        node = served.node
        self.task = asyncio.create_task(run_node(served, self.stop))
        ready = asyncio.create_task(node.ready.wait())
        await asyncio.wait({self.task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            self.task.result()  # it failed to start: say why
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.config.network.grpc_port}",
                                                 options=[("grpc.max_send_message_length", 8 << 20)])
        return node

    def close(self) -> None:
        async def shut() -> None:
            if hasattr(self, "channel"):
                await self.channel.close()
            self.stop.set()
            if hasattr(self, "task"):
                await self.task
            await self.loop.shutdown_default_executor()

        try:
            self.run(shut())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()

    # ----- what the tests look at ---------------------------------------------------------------
    def rejected(self) -> Counter[str]:
        return self.call(lambda: Counter(self.node.tally.rejected))

    def snapshot(self) -> Snapshot:
        def take() -> Snapshot:
            node, state = self.node, self.node.progress
            folder = node.learner.checkpoint.directory
            files = tuple(sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest())
                                 for p in folder.iterdir() if p.is_file()))
            return Snapshot(
                weights=weights_digest(node.learner.ctx.checkpoint_state()), files=files,
                peers=tuple(sorted(node.membership.table.peers)), pending=tuple(sorted(node.membership.table.pending)),
                clients=tuple(sorted(node.network.clients)),
                progress=(state.round, state.epoch, state.token_state, state.holding,
                          getattr(node.scheduler, "holder", None), state.done, node.roles.role, len(node.history()),
                          node.roles.collector is None),
            )

        return self.call(take)

    def message(self, state: dict[str, torch.Tensor] | None = None) -> ModelMessage:
        """A genuine model (a fresh one of our architecture, or ``state``) from the sender "stranger"."""
        return ModelMessage(sender="stranger", round=0, purpose=f"{self.config.algorithm}.model", num_samples=100,
                            parts=parts_from_state(self.genuine_state if state is None else state),
                            model=self.node.identity.model)

    def expect(self) -> None:
        """Make the node the aggregator of a round-0 group whose one sender is "stranger" (as a holder would)."""
        async def play() -> Ack:
            await self.node.roles.settled()
            return await self.node.roles.play(Assignment(Role.AGGREGATOR, Step(0, Group(self.config.id, ("stranger",))),
                                                    deadline_s=30))

        ack = self.run(play())
        assert ack.ok, ack

    def settle(self) -> None:
        self.run(self.node.roles.settled())


def identity(raw: bytes) -> bytes:
    """Bytes as they are: a request serializer that sends what the test made, malformed or not."""
    return raw


RESPONSES: dict[str, Any] = {"Hello": pb.HelloReply, "Probe": pb.ProbeReply, "Assign": pb.Ack, "PassToken": pb.Ack}
REQUESTS: dict[str, Any] = {"Hello": pb.HelloRequest, "Probe": pb.ProbeRequest, "Assign": pb.RoundAssignment,
                            "PassToken": pb.RoundToken, "Pull": pb.PullRequest}


async def send(channel: grpc.aio.Channel, method: str, request: bytes | list[bytes]) -> str:
    """Send raw bytes as the request of ``method`` (a list of frames for Transfer); the reason the node gave
    for refusing it. Anything but a refusal fails the test."""
    path = f"/dfl.v1.DflNode/{method}"
    try:
        if method in RESPONSES:
            reply = await channel.unary_unary(path, request_serializer=identity,
                                              response_deserializer=RESPONSES[method].FromString)(request, timeout=20)
            refused = not (reply.accepted if method == "Hello" else reply.ok)
            assert refused and reply.reason, f"{method} was not refused: {reply}"
            return reply.reason
        if method == "Pull":
            call = channel.unary_stream(path, request_serializer=identity, response_deserializer=pb.Frame.FromString)
            replies = [frame async for frame in call(request, timeout=20)]
        else:  # as a node's client writes: concurrently with reading the verdict, which may come first
            transfer = channel.stream_stream(path, request_serializer=identity,
                                             response_deserializer=pb.Frame.FromString)
            result, stream, _ = await open_transfer(transfer, request, timeout=20)
            stream.cancel()
            assert not result.accepted and result.reason, f"Transfer was not refused: {result}"
            return result.reason
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
            FIGURES.crashes.append(f"{method}: {exc.code().name}: {exc.details()}")
            raise
        return "undecodable"
    assert len(replies) == 1 and replies[0].WhichOneof("kind") == "result", replies[:2]
    result = replies[0].result
    assert not result.accepted and result.reason, f"{method} was not refused: {result}"
    return result.reason


def flood(live: LiveNode, method: str, requests: list[bytes | list[bytes]], expected: bool = False) -> list[str]:
    """Send ``requests`` concurrently; each must be refused and counted once, under the reason it was given,
    and nothing else may change. ``expected``: the node aggregates a group that waits for them, first."""
    was = live.snapshot()
    if expected:
        live.expect()
    before = live.rejected()

    async def all_at_once() -> list[str]:
        return await asyncio.gather(*(send(live.channel, method, r) for r in requests))

    reasons = live.run(all_at_once())
    FIGURES.count(f"grpc: {method}", len(requests))
    BUSY.extend(r for r in reasons if r == "busy" and method == "Probe")
    after = live.rejected()
    counted = Counter(r for r in reasons if not (r == "busy" and method == "Probe"))
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == counted, reasons
    live.settle()
    now = live.snapshot()
    changed = was.changes(now)
    if changed:
        STATE_CHANGES.append(f"{method}: {', '.join(changed)}")
    assert not changed, f"{method}: refused input changed {changed}: {[getattr(was, c) for c in changed]} -> " \
                        f"{[getattr(now, c) for c in changed]}"
    return reasons


async def send_genuine(live: LiveNode) -> tuple[bool, str]:
    transfer = live.channel.stream_stream("/dfl.v1.DflNode/Transfer", request_serializer=identity,
                                          response_deserializer=pb.Frame.FromString)
    result, call, _ = await open_transfer(transfer, live.genuine_frames, timeout=30)
    call.cancel()
    return result.accepted, result.reason
