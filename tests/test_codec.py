"""dfl_node.net.codec: model ⇄ frames round trips, chunking, and every rejection (no pickle, ever)."""

from __future__ import annotations

import asyncio
import hashlib
import pickle
import tracemalloc
from collections.abc import Callable

import pytest
import torch

import dfl_node
from dfl_node.algorithms.messages import ModelMessage, TensorPart, parts_from_state
from dfl_node.net import codec
from dfl_node.net.codec import Limits, MessageAssembler, TransferRejected, encode_message, manifest_of
from dfl_node.net.proto import dfl_pb2 as pb

SWARM, FP = "swarm-a", "fp-123"


def make_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "conv.weight": torch.randn(8, 3, 5, 5, generator=g),
        "conv.bias": torch.randn(8, generator=g),
        "bn.num_batches_tracked": torch.tensor(17, dtype=torch.int64),  # 0-d
        "half": torch.randn(3, 7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, generator=g).to(torch.float16),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i32": torch.arange(-3, 4, dtype=torch.int32),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "mask": torch.tensor([[True, False, True]]),
        "fc.weight": torch.randn(10, 33, generator=g),
    }


def make_msg(state: dict[str, torch.Tensor] | None = None, **kw) -> ModelMessage:
    fields = dict(sender="node-1", round=42, purpose="mkt", num_samples=600, metadata={"alpha": "0.5"})
    fields.update(kw)
    return ModelMessage(parts=parts_from_state(state if state is not None else make_state()), **fields)


def assembler(state: dict[str, torch.Tensor] | None = None, **kw) -> MessageAssembler:
    kw.setdefault("swarm", SWARM)
    kw.setdefault("fingerprint", FP)
    return MessageAssembler(manifest=manifest_of(state if state is not None else make_state()), **kw)


def frames_of(msg: ModelMessage, **kw) -> list[pb.Frame]:
    kw.setdefault("swarm", SWARM)
    kw.setdefault("fingerprint", FP)
    return list(encode_message(msg, **kw))


def feed_all(asm: MessageAssembler, frames: list[pb.Frame]) -> tuple[pb.TransferHeader, ModelMessage]:
    for f in frames:
        asm.feed(f)
    return asm.finish()


def assert_same_parts(got: tuple[TensorPart, ...], want: tuple[TensorPart, ...]) -> None:
    assert [(p.name, p.shape, p.start) for p in got] == [(p.name, p.shape, p.start) for p in want]
    for g, w in zip(got, want):
        assert g.values.dtype == w.values.dtype and g.values.dim() == 1
        assert torch.equal(g.values, w.values), g.name


# --- round trips -------------------------------------------------------------------------------------


def test_full_model_round_trip_is_exact_and_keeps_header_fields() -> None:
    msg = make_msg(segment=None)
    header, got = feed_all(assembler(), frames_of(msg, epoch=7, chunk_size=256))
    assert_same_parts(got.parts, msg.parts)
    assert (got.sender, got.round, got.purpose, got.num_samples) == ("node-1", 42, "mkt", 600)
    assert got.segment is None and got.metadata == {"alpha": "0.5"}
    assert header.epoch == 7 and header.swarm == SWARM and header.fingerprint == FP
    assert header.protocol_version == dfl_node.PROTOCOL_VERSION
    assert header.total_size == msg.nbytes and len(header.sha256) == 32
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
    msg = ModelMessage("node-2", 9, "combo", 123, parts, segment=(1, 4), metadata={"k": "v", "e": ""})
    header, got = feed_all(assembler(state), frames_of(msg, chunk_size=1000))
    assert_same_parts(got.parts, parts)
    assert got.segment == (1, 4) and (header.segment_index, header.segment_count) == (1, 4)
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
    frames[0].header.sha256 = hashlib.sha256(raw).digest()
    frames[1].chunk.data = raw
    _, got = feed_all(assembler(state), frames)
    assert got.parts[0].values.tolist() == [True, False, True]


# --- chunking ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 4096, codec.CHUNK_SIZE])
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
    assert [len(f.chunk.data) for f in frames[1:]] == [codec.CHUNK_SIZE] * 3 + [4000 + 12]
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
    assert frames[0].header.sha256 == hashlib.sha256(b"").digest()
    header, got = feed_all(assembler({}), frames)
    assert got.parts == () and header.sender == "n"


def test_encoder_streams_lazily() -> None:
    state = {"w": torch.randn(4 << 20)}  # 16 MiB
    msg = make_msg(state)
    tracemalloc.start()
    try:
        gen = encode_message(msg, swarm=SWARM, fingerprint=FP)
        next(gen)  # the header needs a hashing pass, not a copy of the payload
        _, after_header = tracemalloc.get_traced_memory()
        n = sum(1 for _ in gen)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 16
    assert after_header < 1 << 20 and peak < 4 * codec.CHUNK_SIZE


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":")))


def test_receiver_peak_memory_is_bounded() -> None:
    """100 MB model: the receiver's extra peak RSS stays ≤ 3× the model size (Linux peak-RSS counter)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        pytest.skip("needs Linux /proc/self/clear_refs")
    state = {"a": torch.arange(20_000_000, dtype=torch.float32), "b": torch.full((5_000_000,), 0.25)}  # 100 MB
    msg = make_msg(state)
    frames = encode_message(msg, swarm=SWARM, fingerprint=FP)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _rss_kib("VmHWM")
    asm = assembler(state)
    for f in frames:
        asm.feed(f)
    _, got = asm.finish()
    ratio = (_rss_kib("VmHWM") - base) * 1024 / msg.nbytes
    assert_same_parts(got.parts, msg.parts)
    assert 0.9 <= ratio <= 3.0, ratio  # ≥ 0.9: the payload buffer itself must have been counted


# --- rejections --------------------------------------------------------------------------------------


def reject(asm: MessageAssembler, frames: list[pb.Frame]) -> tuple[str, int]:
    """Feed until rejected; return (reason, index of the frame that was refused, len(frames) = at finish)."""
    for i, f in enumerate(frames):
        try:
            asm.feed(f)
        except TransferRejected as e:
            return e.reason, i
    with pytest.raises(TransferRejected) as info:
        asm.finish()
    return info.value.reason, len(frames)


def forged(mutate: Callable[[pb.TransferHeader], object], msg: ModelMessage | None = None) -> list[pb.Frame]:
    frames = frames_of(msg or make_msg())
    mutate(frames[0].header)
    return frames


def test_wrong_swarm_fingerprint_and_version_are_refused_at_the_header() -> None:
    assert reject(assembler(swarm="other"), frames_of(make_msg())) == ("swarm_mismatch", 0)
    assert reject(assembler(fingerprint="fp-999"), frames_of(make_msg())) == ("fingerprint_mismatch", 0)
    assert reject(assembler(protocol_version=2), frames_of(make_msg())) == ("protocol_version", 0)
    frames = forged(lambda h: setattr(h, "protocol_version", 99))
    assert reject(assembler(), frames) == ("protocol_version", 0)


def test_oversized_header_is_refused() -> None:
    frames = frames_of(make_msg(metadata={"junk": "x" * (2 << 20)}))
    assert reject(assembler(), frames) == ("header_too_large", 0)
    frames = frames_of(make_msg())
    assert reject(assembler(limits=Limits(max_header_bytes=100)), frames) == ("header_too_large", 0)


def test_ten_gigabyte_claim_is_refused_before_any_allocation() -> None:
    numel = 2_500_000_000  # 10 GB of float32, a shape our own model really has
    state_manifest = {"w": (torch.float32, (numel,))}

    def claim(h: pb.TransferHeader) -> None:
        del h.manifest[:]
        entry = pb.TensorEntry(name="w", dtype="float32", shape=[numel], count=numel, nbytes=4 * numel)
        h.manifest.append(entry)
        h.total_size = 4 * numel

    frames = forged(claim, make_msg({"w": torch.zeros(3)}))
    asm = MessageAssembler(swarm=SWARM, fingerprint=FP, manifest=state_manifest)
    tracemalloc.start()
    try:
        with pytest.raises(TransferRejected) as info:
            asm.feed(frames[0])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.reason == "too_large" and peak < 1 << 20
    with pytest.raises(TransferRejected, match="too_large"):  # rejections are sticky
        asm.feed(frames[1])
    # the same check against a configured limit, with an honest header
    state = make_state()
    assert reject(assembler(limits=Limits(max_total_bytes=1000)), frames_of(make_msg(state))) == ("too_large", 0)


def test_oversized_chunk_is_refused() -> None:
    state = {"w": torch.randn(4096)}
    frames = frames_of(make_msg(state), chunk_size=8192)
    assert reject(assembler(state, limits=Limits(max_chunk_bytes=4096)), frames) == ("chunk_too_large", 1)


def test_unknown_tensor_wrong_shape_and_dtype_are_refused() -> None:
    state = make_state()
    del state["fc.weight"]
    assert reject(assembler(state), frames_of(make_msg())) == ("unknown_tensor", 0)
    state = make_state()
    state["conv.bias"] = torch.zeros(9)
    assert reject(assembler(state), frames_of(make_msg())) == ("shape_mismatch", 0)
    state = make_state()
    state["conv.bias"] = torch.zeros(8, dtype=torch.float64)  # an allowed dtype, but not ours
    assert reject(assembler(state), frames_of(make_msg())) == ("dtype_not_allowed", 0)


@pytest.mark.parametrize("dtype", ["object", "pickle", "complex64", "", "FLOAT32", "torch.float32"])
def test_dtype_outside_the_allow_list_is_refused(dtype: str) -> None:
    frames = forged(lambda h: setattr(h.manifest[0], "dtype", dtype))
    assert reject(assembler(), frames) == ("dtype_not_allowed", 0)


def _shift_offset(h: pb.TransferHeader) -> None:
    h.manifest[1].offset += 4


def _wrong_nbytes(h: pb.TransferHeader) -> None:
    h.manifest[1].nbytes += 4


def _past_the_end(h: pb.TransferHeader) -> None:
    h.manifest[1].start = 1  # conv.bias has 8 elements, 8 are sent


def _short_total(h: pb.TransferHeader) -> None:
    h.total_size -= 1


def _overlap(h: pb.TransferHeader) -> None:
    e = h.manifest[1]
    end = e.offset + e.nbytes
    dup = pb.TensorEntry(name=e.name, dtype=e.dtype, shape=e.shape, start=7, count=1, offset=end, nbytes=4)
    h.manifest.insert(2, dup)  # element 7 of conv.bias a second time
    for later in h.manifest[3:]:
        later.offset += 4
    h.total_size += 4


def _bad_segment(h: pb.TransferHeader) -> None:
    h.segment_index, h.segment_count = 4, 4


@pytest.mark.parametrize("mutate", [_shift_offset, _wrong_nbytes, _past_the_end, _short_total, _overlap, _bad_segment])
def test_inconsistent_manifest_is_refused(mutate: Callable[[pb.TransferHeader], None]) -> None:
    assert reject(assembler(), forged(mutate)) == ("bad_manifest", 0)


def test_too_many_tensors_and_short_sha_are_refused() -> None:
    assert reject(assembler(limits=Limits(max_tensors=3)), frames_of(make_msg())) == ("bad_manifest", 0)
    assert reject(assembler(), forged(lambda h: setattr(h, "sha256", b"\x00" * 31))) == ("bad_sha256", 0)


def test_truncated_trailing_and_corrupted_streams() -> None:
    frames = frames_of(make_msg(), chunk_size=512)
    assert reject(assembler(), frames[:-1]) == ("truncated", len(frames) - 1)
    assert reject(assembler(), []) == ("truncated", 0)
    extra = pb.Frame(chunk=pb.Chunk(data=b"\x00"))
    assert reject(assembler(), frames + [extra]) == ("trailing_data", len(frames))
    flipped = frames_of(make_msg(), chunk_size=512)
    data = bytearray(flipped[3].chunk.data)
    data[10] ^= 0x01
    flipped[3].chunk.data = bytes(data)
    assert reject(assembler(), flipped) == ("bad_sha256", len(flipped))


def test_frames_out_of_order_are_refused() -> None:
    frames = frames_of(make_msg(), chunk_size=512)
    assert reject(assembler(), frames[1:]) == ("unexpected_frame", 0)
    assert reject(assembler(), [pb.Frame()] + frames) == ("unexpected_frame", 0)
    assert reject(assembler(), frames[:2] + [frames[0]]) == ("unexpected_frame", 2)
    result = pb.Frame(result=pb.TransferResult(accepted=True))
    assert reject(assembler(), frames[:1] + [result]) == ("unexpected_frame", 1)


class _Evil:
    """Unpickling this runs code; the codec must never do so."""

    def __reduce__(self):
        return (exec, ("import builtins; builtins.DFL_PWNED = True",))


def test_pickle_payload_is_never_unpickled(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*a, **k):
        raise AssertionError("the codec unpickled received bytes")

    for mod, name in [(pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(mod, name, forbidden)
    payload = pickle.dumps({"w": _Evil(), "b": torch.zeros(2)})
    state = {"w": torch.zeros((len(payload) + 3) // 4 + 8)}
    honest = frames_of(make_msg(state))  # a genuine header for this model: size and sha of the honest payload
    nbytes = honest[0].header.total_size

    def attack(data: bytes) -> list[pb.Frame]:
        return [honest[0], pb.Frame(chunk=pb.Chunk(data=data))]

    assert reject(assembler(state), attack(payload)) == ("truncated", 2)  # shorter than the header claims
    assert reject(assembler(state), attack(payload + b"\x00" * nbytes)) == ("trailing_data", 1)
    padded = payload + b"\x00" * (nbytes - len(payload))
    assert reject(assembler(state), attack(padded)) == ("bad_sha256", 2)
    # an attacker who also forges a matching sha256 gets numbers, not code execution
    honest[0].header.sha256 = hashlib.sha256(padded).digest()
    _, got = feed_all(assembler(state), attack(padded))
    assert got.parts[0].values.dtype == torch.float32
    assert got.parts[0].values.numpy().tobytes() == padded
    import builtins

    assert not hasattr(builtins, "DFL_PWNED")


def test_rejection_carries_a_result_frame() -> None:
    with pytest.raises(TransferRejected) as info:
        assembler(swarm="other").feed(frames_of(make_msg())[0])
    res = info.value.result()
    assert not res.accepted and res.reason == "swarm_mismatch" and "other" in res.detail


# --- async assembly (both directions of a Transfer stream) --------------------------------------------


async def _aiter(frames: list[pb.Frame], then_hang: bool = False):
    for f in frames:
        await asyncio.sleep(0)
        yield f
    if then_hang:
        await asyncio.Event().wait()  # a peer that keeps its stream open


async def test_assemble_reads_a_client_stream_until_half_close() -> None:
    msg = make_msg()
    frames = frames_of(msg, chunk_size=300)
    header, got = await codec.assemble(_aiter(frames), assembler())
    assert header.round == 42
    assert_same_parts(got.parts, msg.parts)
    with pytest.raises(TransferRejected, match="trailing_data"):
        await codec.assemble(_aiter(frames + [frames[-1]]), assembler())
    with pytest.raises(TransferRejected, match="truncated"):
        await codec.assemble(_aiter(frames[:-2]), assembler())


async def test_assemble_reply_stops_at_total_size_without_waiting() -> None:
    msg = make_msg(purpose="combo-reply", segment=(0, 2))
    frames = frames_of(msg, chunk_size=300)
    reading = codec.assemble(_aiter(frames, then_hang=True), assembler(), until_eof=False)
    header, got = await asyncio.wait_for(reading, 5)
    assert header.purpose == "combo-reply" and got.segment == (0, 2)
    assert_same_parts(got.parts, msg.parts)
    with pytest.raises(TransferRejected, match="truncated"):  # reply stream closed early
        await codec.assemble(_aiter(frames[:-1]), assembler(), until_eof=False)


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
                _, got = await codec.assemble(request_iterator, assembler(state))
            except TransferRejected as e:
                yield pb.Frame(result=e.result())
                return
            yield pb.Frame(result=pb.TransferResult(accepted=True))
            doubled = tuple(
                TensorPart(p.name, p.shape, p.start, p.values * 2 if p.values.is_floating_point() else p.values)
                for p in got.parts
            )
            reply = ModelMessage("server", got.round, "reply", 1, doubled)
            for f in encode_message(reply, swarm=SWARM, fingerprint=FP):
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
            header, got = await asyncio.wait_for(codec.assemble(stream, assembler(state), until_eof=False), 10)
            assert header.sender == "server" and torch.equal(got.parts[0].values, state["w"] * 2)

            call = stub.Transfer(iter(frames_of(make_msg(state), swarm="other")))
            frames = [f async for f in call]
            assert len(frames) == 1 and frames[0].result.reason == "swarm_mismatch"
    finally:
        await server.stop(None)
