"""Hostile input against a real node (in-process, real gRPC and HTTP on loopback): every bad
Hello or transfer is refused with a reason counted in /status.rejected, and the node keeps serving."""

from __future__ import annotations

import logging
import pickle
import threading

import grpc
import httpx
import pytest

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms import Role
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.server import start_server
from tests.helpers.codec import frames_of
from tests.helpers.hostile import Target, assert_still_serving, stranger_hello
from tests.helpers.nodes import order
from tests.helpers.waiting import until


@pytest.mark.parametrize(("change", "reason"), [
    ({"swarm": "someone-elses"}, "swarm_mismatch"),
    ({"fingerprint": "0" * 64}, "fingerprint_mismatch"),
    ({"model": "mlp:7"}, "architecture_mismatch"),
    ({"protocol_version": PROTOCOL_VERSION + 1}, "protocol_version"),
    ({"wire_dtype": "int8"}, "wire_dtype_mismatch"),  # a lossy swarm's node, and we send exactly
    ({"model": "os:system"}, "unknown_model"),  # a reference this node was not configured with: nothing is imported
    ({"model": "nonesuch-plugin"}, "unknown_model"),  # a plugin not installed here
    ({"algorithm": "nonesuch-algorithm"}, "unknown_algorithm"),
    ({"fingerprint": "0" * 64, "sample_shape": [5]}, "sample_shape_mismatch"),  # a device with other data
    ({"fingerprint": "0" * 64, "num_classes": 3}, "num_classes_mismatch"),
])
async def test_incompatible_peer_is_refused_at_hello(target: Target, change: dict, reason: str) -> None:
    reply = await target.stub.Hello(stranger_hello(target, **change), timeout=5)
    assert not reply.accepted and reply.reason == reason
    assert (await target.rejected()) == {reason: 1}
    async with httpx.AsyncClient(trust_env=False) as http:
        [refused] = (await http.get(f"{target.url}/status")).json()["refused_peers"]
    assert (refused["id"], refused["reason"], refused["by"], refused["address"]) == ("stranger", reason, "us",
                                                                                    "127.0.0.1:1")
    table = target.node.membership.table
    assert "stranger" not in table.peers and "stranger" not in table.pending
    ok = await target.stub.Hello(stranger_hello(target), timeout=5)
    assert ok.accepted and "stranger" in table.pending  # a peer only once it answers a Hello of ours


def _truncated(f: list[pb.Frame]) -> list[pb.Frame]:
    return f[:-1]


def _bad_sha(f: list[pb.Frame]) -> list[pb.Frame]:
    data = bytearray(f[1].chunk.data)
    data[0] ^= 0xFF
    return [f[0], pb.Frame(chunk=pb.Chunk(data=bytes(data))), *f[2:]]


def _huge_header(f: list[pb.Frame]) -> list[pb.Frame]:
    header = pb.TransferHeader()
    header.CopyFrom(f[0].header)
    header.metadata["padding"] = "x" * ((1 << 20) - 200)  # over the 1 MiB header limit, under gRPC's frame limit
    return [pb.Frame(header=header), *f[1:]]


def _huge_chunk(f: list[pb.Frame]) -> list[pb.Frame]:
    payload = b"".join(fr.chunk.data for fr in f[1:])
    return [f[0], pb.Frame(chunk=pb.Chunk(data=payload[: (1 << 20) + 512] or payload))]


def _wrong_shape(f: list[pb.Frame]) -> list[pb.Frame]:
    header = pb.TransferHeader()
    header.CopyFrom(f[0].header)
    header.manifest[0].shape[0] += 1
    return [pb.Frame(header=header), *f[1:]]


def _pickle_payload(f: list[pb.Frame]) -> list[pb.Frame]:
    """A pickled state dict in place of the raw tensor bytes, with an honest-looking header."""
    blob = pickle.dumps({"weight": list(range(1000))})
    header = pb.TransferHeader()
    header.CopyFrom(f[0].header)
    return [pb.Frame(header=header), pb.Frame(chunk=pb.Chunk(data=blob))]


def _pickle_dtype(f: list[pb.Frame]) -> list[pb.Frame]:
    header = pb.TransferHeader()
    header.CopyFrom(f[0].header)
    header.manifest[0].dtype = "object"
    return [pb.Frame(header=header), *f[1:]]


def _unknown_hash(f: list[pb.Frame]) -> list[pb.Frame]:
    """A header naming a hash the node never offered: refused at the header, with its name."""
    header = pb.TransferHeader()
    header.CopyFrom(f[0].header)
    header.hash = "md5"
    return [pb.Frame(header=header), *f[1:]]


def _lossy_entry(f: list[pb.Frame]) -> list[pb.Frame]:
    """An entry that says it travels as int8 to a node whose wire is exact: refused before any decoding."""
    header = pb.TransferHeader()
    header.CopyFrom(f[0].header)
    header.manifest[0].encoding = "int8"
    header.manifest[0].scale = 0.01
    return [pb.Frame(header=header), *f[1:]]


@pytest.mark.parametrize(("tamper", "reason"), [
    (_truncated, "truncated"),
    (_bad_sha, "bad_sha256"),
    (_huge_header, "header_too_large"),
    (_wrong_shape, "shape_mismatch"),
    (_pickle_payload, "truncated"),
    (_pickle_dtype, "dtype_not_allowed"),
    (_unknown_hash, "hash_not_offered"),
    (_lossy_entry, "wire_dtype_mismatch"),
])
async def test_bad_transfer_is_rejected_and_node_keeps_serving(target: Target, tamper, reason: str) -> None:
    digest = target.node.learner.digest
    await target.expect()
    verdict = await target.transfer(tamper(target.frames()))
    assert not verdict.accepted and verdict.reason == reason
    assert (await target.rejected()) == {reason: 1}
    if target.node.roles.collector is not None:  # refused at the header: a forged header never cancels a real sender…
        target.node.roles.collector.close()  # …so the group would wait for its deadline; the test ends it instead
    await target.node.roles.settled()  # a failure after admission gives up on that sender at once
    # nothing fused, role released
    assert target.node.learner.digest == digest and target.node.roles.role.value == "idle"
    assert target.node.tally.counters["senders_abandoned"] == 1
    await assert_still_serving(target)


async def test_oversized_chunk_is_rejected(target: Target) -> None:
    big = target.message()
    # the whole ~10 KB model in one chunk is fine…
    frames = frames_of(big, 1 << 30, swarm=target.node.config.swarm, fingerprint=target.node.identity.fingerprint)
    await target.expect()
    assert (await target.transfer(frames)).accepted
    await target.node.roles.settled()
    await target.expect(round_=1)  # round 0 is fused: the oversized chunks come for round 1
    header = pb.TransferHeader()
    header.CopyFrom(frames[0].header)
    header.round = 1
    oversized = [pb.Frame(header=header), pb.Frame(chunk=pb.Chunk(data=b"\0" * ((1 << 20) + 512)))]
    verdict = await target.transfer(oversized)  # …but a chunk over 1 MiB is refused before it is copied
    assert verdict.reason == "chunk_too_large"
    await target.node.roles.settled()
    await target.expect(round_=1)  # nothing was fused: round 1 is still to play
    with pytest.raises(grpc.aio.AioRpcError) as err:  # over gRPC's frame limit: refused by gRPC itself
        await target.transfer([pb.Frame(header=header), pb.Frame(chunk=pb.Chunk(data=b"\0" * (8 << 20)))])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await assert_still_serving(target)


async def test_a_transfer_nobody_expects_is_refused(target: Target) -> None:
    """Only an aggregator takes transfers, and only from the senders of its group, once each."""
    assert (await target.transfer(target.frames())).reason == "not_expected"
    await target.expect("someone-else")
    assert (await target.transfer(target.frames())).reason == "not_expected"  # a sender of another group
    assert (await target.rejected()) == {"not_expected": 2}
    target.node.roles.collector.close()  # the expected sender never comes: the test ends the group before its deadline
    await target.node.roles.settled()
    await assert_still_serving(target)


async def test_an_assignment_while_busy_is_refused(target: Target) -> None:
    target.node.roles.take(Role.SENDER)
    try:
        ack = await target.node.roles.play(order(round=0, role="aggregator", aggregator="node-0",
                                                      senders=("stranger",)))
        assert not ack.ok and ack.reason == "busy"
    finally:
        target.node.roles.release()
    await assert_still_serving(target)


HEALTH = "/grpc.health.v1.Health/"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
# Bytes no protobuf message decodes from: a truncated tag, a length past the end, an unterminated group,
# field number 0, and a pickle (of an exception, as p2pfl-style peers would send).
GARBAGE = [b"\xff", b"\x0a\x05ab", b"\x0b", b"\x07", pickle.dumps(RuntimeError("boom"))]


async def _raw_call(channel: grpc.aio.Channel, path: str, raw: bytes, *, client_streams: bool = False,
                    server_streams: bool = False) -> grpc.StatusCode:
    """Send ``raw`` as the request of ``path`` (bytes as they are, no serializer) and return the status."""
    try:
        if client_streams:
            async for _ in channel.stream_stream(path)(iter([raw]), timeout=5):
                pass
        elif server_streams:
            async for _ in channel.unary_stream(path)(raw, timeout=5):
                pass
        else:
            await channel.unary_unary(path)(raw, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records that are ERRORs or carry a traceback: what a peer's garbage must never cause."""
    return [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_standard_grpc_services_refuse_garbage_without_a_traceback(
        target: Target, caplog: pytest.LogCaptureFixture) -> None:
    """Health decodes its requests itself, as the node's own RPCs do: garbage is INVALID_ARGUMENT, counted
    (``undecodable``), with no ERROR line; reflection is not served unless asked (UNIMPLEMENTED, no log).

    Reflection is called unary here, though it is a bidi stream: an unknown method's answer does not depend on
    how it is called, and a streaming client that is still writing when that answer comes sees INTERNAL
    ("execute_batch") about half the time, a race in grpcio's client (grpc/grpc#36066), not the node's answer."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{target.node.config.network.grpc_port}")
    try:
        with caplog.at_level(logging.WARNING):
            codes = {(path, raw): await _raw_call(channel, path, raw, **kinds) for path, kinds in [
                (HEALTH + "Check", {}), (HEALTH + "List", {}), (HEALTH + "Watch", {"server_streams": True}),
                (REFLECTION, {})] for raw in GARBAGE}
        assert {code for (path, _), code in codes.items() if path.startswith(HEALTH)} == \
            {grpc.StatusCode.INVALID_ARGUMENT}
        assert {code for (path, _), code in codes.items() if path == REFLECTION} == {grpc.StatusCode.UNIMPLEMENTED}
        assert _tracebacks(caplog) == []
        assert (await target.rejected()) == {"undecodable": 3 * len(GARBAGE)}
        reply = await target.stub.Hello(stranger_hello(target), timeout=5)  # and the node still serves
        assert reply.accepted
    finally:
        await channel.close()


async def test_standard_grpc_health_answers_check_and_list(target: Target) -> None:
    """What grpc_health_probe and Kubernetes' gRPC probes ask (Check) answers SERVING for the server and the
    node's service, NOT_FOUND for another; List names both; Watch is refused plainly (poll Check)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{target.node.config.network.grpc_port}")
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "dfl.v1.DflNode"):
            health = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await stub.List(health_pb2.HealthListRequest(), timeout=5)
        assert {name: s.status for name, s in listed.statuses.items()} == {
            "": health_pb2.HealthCheckResponse.SERVING, "dfl.v1.DflNode": health_pb2.HealthCheckResponse.SERVING}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5):
                pass
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await channel.close()
    assert (await target.rejected()) == {}


async def test_reflection_when_asked_answers_and_refuses_garbage_without_a_traceback(
        target: Target, caplog: pytest.LogCaptureFixture) -> None:
    """``--reflection`` serves gRPC server reflection (grpcurl), decoded like every other request."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    wire = target.node.network.wire  # type: ignore[attr-defined]  # a daemon's: gRPC
    server, port = await start_server(target.node.requests, wire, 30.0, "127.0.0.1", 0, reflection=True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        services = {s.name async for r in stream for s in r.list_services_response.service}
        assert services == {"dfl.v1.DflNode", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
        with caplog.at_level(logging.WARNING):
            codes = [await _raw_call(channel, REFLECTION, raw, client_streams=True, server_streams=True)
                     for raw in GARBAGE]
        assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * len(GARBAGE)
        assert _tracebacks(caplog) == []
        assert (await target.rejected()) == {"undecodable": len(GARBAGE)}
    finally:
        await channel.close()
        await server.stop(None)


async def test_sender_is_answered_once_the_model_is_validated_not_after_fusion(target: Target, monkeypatch) -> None:
    """Def-KT's fusion (E epochs of MKT) can take long: the sender is told "accepted" as soon as the
    payload is validated, and the receiver keeps its role until the fusion is settled."""
    release = threading.Event()
    fuse = target.node.learner.algorithm.aggregate

    def slow_fusion(ctx, step, messages):
        assert release.wait(30)
        return fuse(ctx, step, messages)

    monkeypatch.setattr(target.node.learner.algorithm, "aggregate", slow_fusion)
    node = target.node
    digest, fusions = node.learner.digest, node.tally.counters["fusions"]
    await target.expect()
    verdict = await target.transfer(target.frames())
    assert verdict.accepted
    await until(lambda: node.roles.fusing, 30, "the aggregation")  # the group is complete: it runs in a thread
    assert node.roles.role.value == "aggregator" and node.roles.max_fusing == 1
    assert node.tally.counters["fusions"] == fusions
    release.set()
    await node.roles.settled()
    assert node.tally.counters["fusions"] == fusions + 1 and node.learner.digest != digest
    assert node.roles.role.value == "idle"
