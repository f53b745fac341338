"""dfl_node.net.assembler: every rejection of a transfer, and received bytes are never unpickled.

Each TransferRejected reason is provoked with honest frames against a
mismatching assembler or with forged headers, and the frame that was refused
is checked. Round trips and chunking are in ``test_codec.py``.
"""

from __future__ import annotations

import hashlib
import pickle
import tracemalloc
from collections.abc import Callable

import pytest
import torch

import dfl_node
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.net.assembler import MessageAssembler
from dfl_node.net.convert import transfer_result
from dfl_node.net.manifest import Limits
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.errors import TransferRejected
from tests.helpers.codec import FP, SWARM, assembler, feed_all, frames_of, make_msg, make_state


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
    newer = assembler(protocol_version=dfl_node.PROTOCOL_VERSION + 1)
    assert reject(newer, frames_of(make_msg())) == ("protocol_version", 0)
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


@pytest.mark.parametrize("mutate", [_shift_offset, _wrong_nbytes, _past_the_end, _short_total, _overlap])
def test_inconsistent_manifest_is_refused(mutate: Callable[[pb.TransferHeader], None]) -> None:
    assert reject(assembler(), forged(mutate)) == ("bad_manifest", 0)


def test_too_many_tensors_and_short_sha_are_refused() -> None:
    assert reject(assembler(limits=Limits(max_tensors=3)), frames_of(make_msg())) == ("bad_manifest", 0)
    assert reject(assembler(), forged(lambda h: setattr(h, "digest", b"\x00" * 31))) == ("bad_sha256", 0)


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
    honest[0].header.digest = hashlib.sha256(padded).digest()
    _, got = feed_all(assembler(state), attack(padded))
    assert got.parts[0].values.dtype == torch.float32
    assert got.parts[0].values.numpy().tobytes() == padded
    import builtins

    assert not hasattr(builtins, "DFL_PWNED")


def test_rejection_carries_a_result_frame() -> None:
    with pytest.raises(TransferRejected) as info:
        assembler(swarm="other").feed(frames_of(make_msg())[0])
    res = transfer_result(info.value)
    assert not res.accepted and res.reason == "swarm_mismatch" and "other" in res.detail


def test_another_architecture_passes_only_through_the_resolver_with_its_own_fingerprint() -> None:
    """Mixed fleets: a header naming another spec is checked against the layout our registry builds for it."""
    theirs = make_msg(model="other:1")
    layout = {name: (t.dtype, tuple(t.shape)) for name, t in make_state().items()}
    fits = {"other:1": ("fp-other", layout)}

    def resolve(spec: str) -> tuple[str, dict]:
        if spec not in fits:
            raise ValueError(f"{spec} cannot be fused here")
        return fits[spec]

    asm = lambda: MessageAssembler(swarm=SWARM, fingerprint=FP, manifest=layout, model="own:1", resolve=resolve)  # noqa: E731
    header, got = feed_all(asm(), frames_of(theirs, fingerprint="fp-other"))
    assert got.model == "other:1" and header.fingerprint == "fp-other"
    assert reject(asm(), frames_of(theirs, fingerprint=FP)) == ("fingerprint_mismatch", 0)
    assert reject(asm(), frames_of(make_msg(model="alien:9"), fingerprint="x")) == ("model_not_fusable", 0)
    # no resolver: own only
    assert reject(assembler(), frames_of(theirs, fingerprint=FP)) == ("fingerprint_mismatch", 0)
