"""A control message added as its definition and its handler only (:mod:`dfl_node.peering.control`): ``Echo`` below
exists in this file alone, and two real nodes answer it over the simulator's network and over real gRPC (the real
servicer and client); what a node cannot read is refused, counted, and the node answers on."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dfl_node.net.envelopes import MAX_BODY, refusal
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.node.node import Node
from dfl_node.node.requests import PeerRequests
from dfl_node.peering.control import answer, control_message, handles, kind_named
from dfl_node.peering.errors import PeerUnreachable, TransferRefused, TransferRejected
from dfl_node.service.run import run_node
from dfl_node.service.wiring import Daemon
from dfl_node.sim.clock import run_virtual
from dfl_node.sim.link_profiles import LinkProfile
from dfl_node.testbed.launcher import free_port
from tests.helpers.fleet import FLEET, fleet_node_config, virtual_fleet

ROOT = Path(__file__).resolve().parent.parent


# ----- the new message: its definition and its handler, nothing else -----------------------------------------
@dataclass(frozen=True, kw_only=True)
class EchoReply:
    text: str = ""
    node_id: str = ""  # who answered
    round: int = 0  # where it stands


@control_message("test.echo", reply=EchoReply)
@dataclass(frozen=True, kw_only=True)
class Echo:
    """Say ``text`` back ``times`` times."""

    text: str = ""
    times: int = 1
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.times <= 8:
            raise ValueError(f"times {self.times} is not within [0, 8]")


@handles(Echo)
async def echo(node: PeerRequests, message: Echo) -> EchoReply:
    if message.text == "busy":
        raise TransferRejected("busy", "asked to be busy")  # a refusal, as a node answers (not counted)
    return EchoReply(text=message.text * message.times, node_id=node.node_id, round=node.progress.round)
# ---------------------------------------------------------------------------------------------------------------


@control_message("test.unanswered", reply=EchoReply)
@dataclass(frozen=True, kw_only=True)
class Unanswered:
    """Known to the registry, but no handler here: as a kind a peer does not know."""


@dataclass(frozen=True)
class Unregistered:
    text: str = ""


def test_the_registry_refuses_a_kind_a_type_or_a_handler_twice() -> None:
    @dataclass(frozen=True)
    class Other:
        pass

    with pytest.raises(ValueError, match="registered already"):
        control_message("test.echo", reply=EchoReply)(Other)
    with pytest.raises(ValueError, match="registered already"):
        control_message("test.echo-again", reply=EchoReply)(Echo)
    with pytest.raises(ValueError, match="has a handler already"):
        handles(Echo)(echo)
    with pytest.raises(ValueError, match="no registered control message"):
        handles(Other)
    with pytest.raises(TypeError, match="frozen dataclass"):
        control_message("test.mutable", reply=EchoReply)(type("Mutable", (), {}))
    with pytest.raises(ValueError, match="kind"):
        control_message("Not A Kind", reply=EchoReply)


def test_between_two_nodes_of_the_simulator(fleet_shards: Path, tmp_path: Path) -> None:
    """Answered as a round RPC is: over the link's latency both ways, refused across a partition and by a dead
    node at the deadline; counted in the caller's traffic."""
    latency = 0.25

    async def main() -> None:
        config = FLEET.model_copy(update={"nodes": 2, "rounds": 1})
        async with virtual_fleet(config, "defkt", fleet_shards, tmp_path, links=LinkProfile(latency),
                                 evaluate=False) as fleet:
            caller, callee = fleet.nodes["node-0"], fleet.nodes["node-1"]
            link = caller.network.link(fleet.addresses["node-1"])
            loop = asyncio.get_running_loop()
            began = loop.time()
            reply = await link.call(Echo(text="ab", times=2), timeout=5)
            assert reply == EchoReply(text="abab", node_id="node-1", round=callee.progress.round)
            assert loop.time() - began >= 2 * latency
            traffic = caller.network.control  # type: ignore[attr-defined]
            assert traffic.messages == 2 and traffic.bytes > 0

            with pytest.raises(TransferRefused) as refused:
                await link.call(Unanswered(), timeout=5)
            assert refused.value.reason == "unknown_control"
            with pytest.raises(TransferRefused) as refused:
                await link.call(Echo(text="busy"), timeout=5)
            assert refused.value.reason == "busy"
            assert callee.tally.rejected.get("unknown_control") == 1 and "busy" not in callee.tally.rejected
            with pytest.raises(TypeError):
                await link.call(Unregistered(), timeout=5)

            fleet.partition(["node-0"], ["node-1"])
            with pytest.raises(PeerUnreachable) as unreachable:
                await link.call(Echo(text="x"), timeout=2)
            assert unreachable.value.reason == "deadline_exceeded"
            fleet.heal()
            assert (await link.call(Echo(text="x"), timeout=5)).text == "x"
            fleet.kill("node-1")
            with pytest.raises(PeerUnreachable):
                await link.call(Echo(text="x"), timeout=2)

    run_virtual(main())


@contextlib.asynccontextmanager
async def grpc_node(shards: Path, state: Path, node_id: str, swarm: str) -> AsyncIterator[tuple[Node, str]]:
    """A real node on gRPC (as ``dfl-node start`` runs it), in this process; and its gRPC address."""
    port = free_port()
    config = fleet_node_config(id=node_id, data=shards / node_id, test_data=shards / "test.safetensors", grpc_port=port,
                         http_port=free_port(), mdns=False, swarm=swarm, state_dir=state / node_id)
    served = Daemon.build(config)
    stop = asyncio.Event()
    task = asyncio.create_task(run_node(served, stop))
    try:
        await asyncio.wait_for(served.node.ready.wait(), 60)
        yield served.node, f"127.0.0.1:{port}"
    finally:
        stop.set()
        await task


async def test_between_two_nodes_over_grpc(fleet_shards: Path, tmp_path: Path) -> None:
    """The real client and servicer: the reply, the refusals (INVALID_ARGUMENT for what the node cannot read,
    counted; a handler's own), and the node still answering after each."""
    swarm = f"control-{uuid.uuid4().hex[:6]}"
    async with (grpc_node(fleet_shards, tmp_path, "node-0", swarm) as (caller, _),
                grpc_node(fleet_shards, tmp_path, "node-1", swarm) as (callee, address)):
        link = caller.network.link(address)
        reply = await link.call(Echo(text="hi", times=3, tags=("a", "b")), timeout=10)
        assert reply == EchoReply(text="hihihi", node_id="node-1", round=callee.progress.round)

        with pytest.raises(TransferRefused) as refused:
            await link.call(Unanswered(), timeout=10)
        assert refused.value.reason == "unknown_control"
        with pytest.raises(TransferRefused) as refused:
            await link.call(Echo(text="busy"), timeout=10)
        assert (refused.value.reason, refused.value.detail) == ("busy", "asked to be busy")
        with pytest.raises(ValueError, match="over"):
            await link.call(Echo(text="x" * MAX_BODY), timeout=10)

        async with grpc.aio.insecure_channel(address) as channel:  # what a peer of no good faith may send
            stub = pb_grpc.DflNodeStub(channel)
            for kind, body, reason in [
                ("test.nonesuch", b"{}", "unknown_control"),
                ("test.echo", b'{"text": "' + b"x" * MAX_BODY + b'"}', "control_too_large"),
                ("test.echo", b'{"times": "3"}', "bad_control"),  # no coercion
                ("test.echo", b'{"times": 9}', "bad_control"),  # the dataclass's own check
                ("test.echo", b"\x80garbage", "bad_control"),
                ("test.echo", b"[]", "bad_control"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await stub.Control(pb.ControlEnvelope(kind=kind, body=body), timeout=10)
                assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (kind, body[:20])
                assert (failed.value.details() or "").startswith(f"{reason}: "), failed.value.details()
            answered = await stub.Control(pb.ControlEnvelope(kind="test.echo", body=b'{"text": "ok", "new": 1}'),
                                          timeout=10)  # a field a newer peer added is ignored
            assert answered.kind == "test.echo" and b'"text":"ok"' in answered.body

        rejected = callee.tally.rejected
        assert (rejected.get("unknown_control"), rejected.get("control_too_large"), rejected.get("bad_control")) \
            == (2, 1, 4)
        assert "busy" not in rejected
        assert (await link.call(Echo(text="still"), timeout=10)).text == "still"


def test_a_peer_older_than_control_messages_refuses_them_as_unknown() -> None:
    old = grpc.aio.AioRpcError(grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                               "Method not found!")
    refused = refusal(old)
    assert refused is not None and refused.reason == "unknown_control"
    gone = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
    assert refusal(gone) is None  # not a refusal: the port's PeerUnreachable


async def test_the_docs_example_registers_and_answers() -> None:
    """docs/control-messages.md's worked example, run as written."""
    page = (ROOT / "docs" / "control-messages.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    example: dict[str, object] = {}
    exec(compile(code, "docs/control-messages.md", "exec"), example)  # noqa: S102  (our own page)
    kind = kind_named("echo")
    assert kind.message is example["Echo"] and kind.reply is example["EchoReply"]
    node = type("Node", (), {"node_id": "node-1"})()
    reply = await answer(node, kind.message(text="hi", times=2))
    assert reply == kind.reply(text="hihi", node_id="node-1")
