"""dfl_node.net's encoder and assembler: model ⇄ frames round trips, chunking, memory bounds and async assembly.

Every rejection (TransferRejected reasons, the pickle attack) is tested in
``test_codec_rejections.py``; the helpers both files use are in ``tests/helpers/codec.py``.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import hashlib
import platform
import tracemalloc

import pytest
import torch

import dfl_node
from dfl_node import heap
from dfl_node.algorithms.messages import ModelMessage, TensorPart
from dfl_node.net import buffers
from dfl_node.net.assembler import assemble
from dfl_node.net.convert import transfer_result
from dfl_node.net.encoder import prepare
from dfl_node.net.frames import decode_frame, encode_frame
from dfl_node.net.manifest import CHUNK_SIZE, Limits
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.errors import TransferRejected
from tests.helpers.codec import (
    FP,
    SWARM,
    assembler,
    assert_same_parts,
    feed_all,
    frames_of,
    make_msg,
    make_state,
    read_frames_of,
)

# --- round trips -------------------------------------------------------------------------------------


@pytest.mark.parametrize("decoded", [frames_of, read_frames_of], ids=["protobuf", "fast"])
def test_full_model_round_trip_is_exact_and_keeps_header_fields(decoded) -> None:
    msg = make_msg()
    header, got = feed_all(assembler(), decoded(msg, epoch=7, chunk_size=256))
    assert_same_parts(got.parts, msg.parts)
    assert (got.sender, got.round, got.purpose, got.num_samples) == ("node-1", 42, "mkt", 600)
    assert got.metadata == {"alpha": "0.5"} and got.model == ""
    assert header.epoch == 7 and header.swarm == SWARM and header.fingerprint == FP
    assert header.protocol_version == dfl_node.PROTOCOL_VERSION
    assert header.total_size == msg.nbytes and len(header.digest) == 32 and header.hash == "sha256"
    state = {p.name: p.values.reshape(p.shape) for p in got.parts}
    for name, t in make_state().items():
        assert state[name].shape == t.shape and torch.equal(state[name], t)


def test_segment_round_trip_with_slices_of_tensors() -> None:
    state = make_state()
    flat_w, flat_fc = state["conv.weight"].reshape(-1), state["fc.weight"].reshape(-1)
    parts = (
        TensorPart("conv.weight", (8, 3, 5, 5), 100, flat_w[100:].clone()),  # tail of one tensor
        TensorPart("conv.bias", (8,), 0, state["conv.bias"].clone()),  # a whole one
        TensorPart("fc.weight", (10, 33), 0, flat_fc[:5].clone()),  # and two ranges of another
        TensorPart("fc.weight", (10, 33), 17, flat_fc[17:300].clone()),
        TensorPart("half", (3, 7), 20, state["half"].reshape(-1)[20:].clone()),
    )
    msg = ModelMessage("node-2", 9, "combo", 123, parts, metadata={"k": "v", "e": ""})
    header, got = feed_all(assembler(state), frames_of(msg, chunk_size=1000))
    assert_same_parts(got.parts, parts)
    assert (got.sender, got.round, got.purpose, got.num_samples) == ("node-2", 9, "combo", 123)
    assert got.metadata == {"k": "v", "e": ""}
    assert [e.start for e in header.manifest] == [100, 0, 0, 17, 20]
    assert [tuple(e.shape) for e in header.manifest][0] == (8, 3, 5, 5)  # the FULL shape travels


def test_received_tensors_are_writable_and_independent_of_later_feeds() -> None:
    msg = make_msg()
    _, got = feed_all(assembler(), frames_of(msg))
    got.parts[0].values.add_(1.0)  # the receiver may fuse in place
    assert torch.equal(got.parts[0].values, msg.parts[0].values + 1.0)
    assert torch.equal(got.parts[1].values, msg.parts[1].values)


def test_bool_payload_bytes_are_normalised() -> None:
    state = {"mask": torch.tensor([True, False, True])}
    frames = frames_of(make_msg(state))
    raw = b"\x02\x00\xff"  # a hostile sender's non-0/1 bools, with a correct sha256
    frames[0].header.digest = hashlib.sha256(raw).digest()
    frames[1].chunk.data = raw
    _, got = feed_all(assembler(state), frames)
    assert got.parts[0].values.tolist() == [True, False, True]


# --- chunking ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 4096, CHUNK_SIZE])
def test_chunks_are_bounded_and_packed(chunk_size: int) -> None:
    msg = make_msg()
    frames = frames_of(msg, chunk_size=chunk_size)
    assert frames[0].WhichOneof("kind") == "header"
    sizes = [len(f.chunk.data) for f in frames[1:]]
    assert all(f.WhichOneof("kind") == "chunk" for f in frames[1:])
    assert sum(sizes) == msg.nbytes and max(sizes) <= chunk_size
    assert all(s == chunk_size for s in sizes[:-1])  # small tensors share chunks
    _, got = feed_all(assembler(), frames)
    assert_same_parts(got.parts, msg.parts)


def test_model_spanning_many_default_chunks() -> None:
    state = {"big": torch.randn(3 * 262144 + 1000), "small": torch.randn(3)}  # ~3 MiB float32
    msg = make_msg(state)
    frames = frames_of(msg)
    assert [len(f.chunk.data) for f in frames[1:]] == [CHUNK_SIZE] * 3 + [4000 + 12]
    _, got = feed_all(assembler(state), frames)
    assert_same_parts(got.parts, msg.parts)


def test_empty_tensors_and_empty_model() -> None:
    state = {"none": torch.empty(0), "flat": torch.empty(2, 0, dtype=torch.int64), "one": torch.ones(1)}
    msg = make_msg(state)
    frames = frames_of(msg)
    assert len(frames) == 2 and [e.nbytes for e in frames[0].header.manifest] == [0, 0, 4]
    _, got = feed_all(assembler(state), frames)
    assert_same_parts(got.parts, msg.parts)

    empty = ModelMessage("n", 0, "ping", 0, ())
    frames = frames_of(empty)
    assert len(frames) == 1 and frames[0].header.total_size == 0
    assert frames[0].header.digest == hashlib.sha256(b"").digest()
    header, got = feed_all(assembler({}), frames)
    assert got.parts == () and header.sender == "n"


def test_encoder_streams_lazily() -> None:
    state = {"w": torch.randn(4 << 20)}  # 16 MiB
    msg = make_msg(state)
    tracemalloc.start()
    try:
        gen = prepare(msg, swarm=SWARM, fingerprint=FP).frames()
        next(gen)  # the header needs a hashing pass, not a copy of the payload
        _, after_header = tracemalloc.get_traced_memory()
        n = sum(1 for _ in gen)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 16
    assert after_header < 1 << 20 and peak < 4 * CHUNK_SIZE


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def test_receiver_peak_memory_is_bounded() -> None:
    """100 MB model: the receiver's extra peak RSS stays ≤ 3× the model size (Linux peak-RSS counter)."""
    state = {"a": torch.arange(20_000_000, dtype=torch.float32), "b": torch.full((5_000_000,), 0.25)}  # 100 MB
    msg = make_msg(state)
    frames = prepare(msg, swarm=SWARM, fingerprint=FP).frames()
    with open("/proc/self/clear_refs", "w") as f:  # Linux: reset VmHWM to the current RSS
        f.write("5")
    base = _rss_kib("VmHWM")
    asm = assembler(state)
    for f in frames:
        asm.feed(decode_frame(encode_frame(f)))  # as a node's server reads them
    _, got = asm.finish()
    ratio = (_rss_kib("VmHWM") - base) * 1024 / msg.nbytes
    assert_same_parts(got.parts, msg.parts)
    assert 0.9 <= ratio <= 3.0, ratio  # ≥ 0.9: the payload buffer itself must have been counted


# --- async assembly (both directions of a Transfer stream) --------------------------------------------


async def _aiter(frames: list[pb.Frame]):
    for f in frames:
        await asyncio.sleep(0)
        yield f


async def test_assemble_reads_a_stream_to_its_end() -> None:
    msg = make_msg()
    frames = frames_of(msg, chunk_size=300)
    header, got = await assemble(_aiter(frames), assembler())
    assert header.round == 42
    assert_same_parts(got.parts, msg.parts)
    with pytest.raises(TransferRejected, match="trailing_data"):
        await assemble(_aiter(frames + [frames[-1]]), assembler())
    with pytest.raises(TransferRejected, match="truncated"):
        await assemble(_aiter(frames[:-2]), assembler())


async def test_transfer_over_real_grpc_on_loopback() -> None:
    """Header + chunks up, result + reply model down, through the generated stubs on 127.0.0.1."""
    import grpc

    from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc

    state = {"w": torch.randn(700_000), "n": torch.tensor(3)}  # ~2.8 MB: several 1 MiB chunks
    limits = Limits()
    opts = [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
    ]

    class Servicer(pb_grpc.DflNodeServicer):
        async def Transfer(self, request_iterator, context):
            try:
                _, got = await assemble(request_iterator, assembler(state))
            except TransferRejected as e:
                yield pb.Frame(result=transfer_result(e))
                return
            yield pb.Frame(result=pb.TransferResult(accepted=True))
            doubled = tuple(
                TensorPart(p.name, p.shape, p.start, p.values * 2 if p.values.is_floating_point() else p.values)
                for p in got.parts
            )
            reply = ModelMessage("server", got.round, "reply", 1, doubled)
            for f in frames_of(reply):
                yield f

    server = grpc.aio.server(options=opts)
    pb_grpc.add_DflNodeServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts) as channel:
            stub = pb_grpc.DflNodeStub(channel)
            call = stub.Transfer(iter(frames_of(make_msg(state))))
            stream = call.__aiter__()
            first = await stream.__anext__()
            assert first.WhichOneof("kind") == "result" and first.result.accepted
            header, got = await asyncio.wait_for(assemble(stream, assembler(state)), 10)
            assert header.sender == "server" and torch.equal(got.parts[0].values, state["w"] * 2)

            # the header alone: the server refuses at the header and ends the call, and chunks still being
            # written by the client then would race that end (gRPC sometimes reports it as INTERNAL)
            call = stub.Transfer(iter(frames_of(make_msg(state), swarm="other")[:1]))
            frames = [f async for f in call]
            assert len(frames) == 1 and frames[0].result.reason == "swarm_mismatch"
    finally:
        await server.stop(None)


# --- receive buffers -----------------------------------------------------------------------------------


def test_buffer_pool_reuses_a_buffer_only_once_nothing_refers_to_it() -> None:
    pool = buffers.BufferPool(keep=2)
    first = pool.take(64)
    first_id = id(first)
    view = torch.frombuffer(first, dtype=torch.float32)  # a received tensor still in use
    del first
    second = pool.take(64)
    assert id(second) != first_id
    del view
    assert id(pool.take(64)) == first_id  # free again: reused, not reallocated
    assert len(pool.take(32)) == 32  # another size: a new buffer, the pool stays bounded
    assert len(pool._buffers) == 2


def test_pooled_assembly_never_overwrites_a_message_still_in_use() -> None:
    pool = buffers.BufferPool()
    state = make_state()
    first_msg = make_msg(state)
    second_msg = make_msg({k: v + 1 if v.is_floating_point() else v for k, v in state.items()})
    _, first = feed_all(assembler(state, buffers=pool), read_frames_of(first_msg))
    _, second = feed_all(assembler(state, buffers=pool), read_frames_of(second_msg))
    assert_same_parts(first.parts, first_msg.parts)  # untouched by the second transfer
    assert_same_parts(second.parts, second_msg.parts)
    pooled = [id(b) for b in pool._buffers]
    del first
    _, third = feed_all(assembler(state, buffers=pool), read_frames_of(first_msg))
    assert [id(b) for b in pool._buffers] == pooled  # the first transfer's buffer, reused
    assert_same_parts(third.parts, first_msg.parts)
    assert_same_parts(second.parts, second_msg.parts)


def test_trim_heap_trims_where_malloc_is_glibcs_and_does_nothing_elsewhere() -> None:
    glibc = platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c") is not None
    chunks = [bytearray(64 << 10) for _ in range(256)]  # 16 MiB in heap-sized pieces, then freed
    del chunks
    assert heap.trim_heap() is glibc
    assert heap.trim_heap() is glibc  # idempotent, and cheap once there is nothing left to hand back
