"""Malformed transfers for the fuzz suite (shared by test_fuzz_codec.py and test_fuzz_grpc.py): a genuine
transfer (:data:`RAW`, cut from :mod:`tests.helpers.codec`'s model) and hypothesis strategies that break it — headers
with wrong fields, sizes and entries, chunk streams with flipped, missing, extra or oversized bytes and
wrong declared lengths, frame bytes that look like chunks, and model states with NaN/Inf values.

Each mutation is sure to change what the receiver checks (``assume``, and
:func:`~tests.fuzz_strategies.other` for single fields), so that every case is malformed.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import torch
from hypothesis import assume
from hypothesis import strategies as st

from dfl_node.net.frames import _varint, chunk_frame, decode_frame
from dfl_node.net.manifest import Limits
from dfl_node.net.proto import dfl_pb2 as pb
from tests.fuzz_strategies import (
    NON_FINITE_BITS,
    digests,
    dtype_names,
    int64s,
    junk_bytes,
    other,
    pickled,
    set_different,
    texts,
    uint32s,
    uint64s,
)
from tests.helpers.codec import encoded_frames, make_msg, make_state

LIMITS = Limits()  # what a node runs with


# ----- mutations of a transfer -------------------------------------------------------------------------
def _entry(draw: st.DrawFn, h: pb.TransferHeader) -> pb.TensorEntry:
    if not h.manifest:  # an earlier mutation emptied it: a stranger's entry
        return h.manifest.add(name=draw(texts), dtype="float32", shape=[1], count=1, nbytes=4)
    return h.manifest[draw(st.integers(0, len(h.manifest) - 1))]


def _pad_header(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    """Over the header limit, and still under gRPC's message limit so that the node is who refuses it."""
    h.metadata["padding"] = ""
    over = draw(st.integers(8, 800))
    h.metadata["padding"] = "x" * max(0, LIMITS.max_header_bytes + over - h.ByteSize())


def _many_entries(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    h.manifest.extend([_entry(draw, h)] * (LIMITS.max_tensors + draw(st.integers(1, 50))))


def _field_mutation(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    e = _entry(draw, h)
    field = draw(st.sampled_from(["start", "count", "offset", "nbytes"]))
    set_different(draw, e, field, uint64s)


def _shape_mutation(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    e = _entry(draw, h)
    shape = other(list(e.shape), draw(st.lists(int64s, max_size=6)))
    del e.shape[:]
    e.shape.extend(shape)


def _drop_entry(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    h.manifest.remove(_entry(draw, h))


def _duplicate_entry(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    h.manifest.append(_entry(draw, h))


def _swap_entries(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    if len(h.manifest) < 2:
        _duplicate_entry(draw, h)
        return
    i = draw(st.integers(0, len(h.manifest) - 1))
    j = (i + draw(st.integers(1, len(h.manifest) - 1))) % len(h.manifest)
    a, b = pb.TensorEntry(), pb.TensorEntry()
    a.CopyFrom(h.manifest[i])
    b.CopyFrom(h.manifest[j])
    h.manifest[i].CopyFrom(b)
    h.manifest[j].CopyFrom(a)


def _version(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    set_different(draw, h, "protocol_version", uint32s)


def _identity_field(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    set_different(draw, h, draw(st.sampled_from(["swarm", "fingerprint", "model"])), texts)


def _total_size(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    set_different(draw, h, "total_size", uint64s)


def _digest(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    set_different(draw, h, "digest", digests)


def _dtype(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    set_different(draw, _entry(draw, h), "dtype", dtype_names)


def _name(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    set_different(draw, _entry(draw, h), "name", texts)


def _no_manifest(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    h.ClearField("manifest")


HEADER_MUTATIONS: list[Callable[[st.DrawFn, pb.TransferHeader], None]] = [
    _version, _identity_field, _total_size, _digest, _field_mutation, _field_mutation, _shape_mutation, _dtype, _name,
    _drop_entry, _duplicate_entry, _swap_entries, _no_manifest, _pad_header, _many_entries,
]


def _validated(h: pb.TransferHeader) -> tuple[bytes, bool]:
    """The fields of a header the receiver checks (the rest, e.g. sender or metadata, is the algorithm's)."""
    checked = pb.TransferHeader()
    checked.CopyFrom(h)
    for name in ("sender", "round", "purpose", "num_samples", "metadata", "epoch"):
        checked.ClearField(name)
    return checked.SerializeToString(deterministic=True), h.ByteSize() > LIMITS.max_header_bytes


@st.composite
def mutated_headers(draw: st.DrawFn, base: pb.TransferHeader) -> pb.TransferHeader:
    """``base`` with one to three of the checked fields made wrong; the cheap noise fields at random too."""
    h = pb.TransferHeader()
    h.CopyFrom(base)
    if draw(st.integers(0, 3)) == 0:  # noise in fields the codec does not check
        h.sender, h.round = draw(texts), draw(uint64s)
    mutations = draw(st.lists(st.sampled_from(HEADER_MUTATIONS), min_size=1, max_size=3))
    for mutate in sorted(mutations, key=lambda m: m is _pad_header):  # padding last: it sizes the header
        mutate(draw, h)
    assume(_validated(h) != _validated(base))
    return h


@st.composite
def bad_length_frames(draw: st.DrawFn, data: bytes) -> bytes:
    """A chunk frame whose declared lengths (outer, inner or both) are wrong, up to 2**64 - 1."""
    inner = len(data)
    outer = 1 + len(_varint(inner)) + inner
    wrong_inner = draw(st.one_of(st.just(inner), st.integers(0, inner + 8), uint64s))
    true_outer = 1 + len(_varint(wrong_inner)) + inner
    wrong_outer = draw(st.one_of(st.just(true_outer), st.integers(0, outer + 8), uint64s))
    if (wrong_inner, wrong_outer) == (inner, true_outer):
        wrong_outer = other(true_outer, wrong_outer)
    return b"\x12" + _varint(wrong_outer) + b"\x0a" + _varint(wrong_inner) + data


def _result_frame(accepted: bool, reason: str) -> bytes:
    return pb.Frame(result=pb.TransferResult(accepted=accepted, reason=reason)).SerializeToString()


OTHER_FRAMES = st.one_of(st.builds(_result_frame, st.booleans(), texts), st.just(b""), junk_bytes)
EXTRA_CHUNKS = st.binary(min_size=1, max_size=100).map(lambda b: chunk_frame([b]))


def _other_frame(draw: st.DrawFn, header: pb.TransferHeader) -> bytes:
    """A frame that is not the next chunk: the header again, a result, an empty frame, junk."""
    return pb.Frame(header=header).SerializeToString() if draw(st.integers(0, 3)) == 0 else draw(OTHER_FRAMES)


def _changes_a_stream(raw: bytes) -> bool:
    """Whether ``raw``, inserted into a stream, changes it (an empty chunk would be a no-op)."""
    decoded = decode_frame(raw)
    return not (isinstance(decoded, memoryview) and decoded.nbytes == 0)


@st.composite
def mutated_streams(draw: st.DrawFn, payload: bytes, header: pb.TransferHeader,
                    oversize: int = LIMITS.max_chunk_bytes + 1000) -> list[bytes]:
    """The encoded chunk frames of ``payload``, cut at random places, with one malformation: a flipped
    byte, bytes missing or extra, a chunk replaced, dropped, swapped or inserted, a chunk frame with wrong
    lengths, a frame that is not a chunk, a chunk over the limit (at most ``oversize`` bytes)."""
    cuts = draw(st.lists(st.integers(1, len(payload) - 1), max_size=6, unique=True))
    bounds = [0, *sorted(cuts), len(payload)]
    pieces = [payload[a:b] for a, b in itertools.pairwise(bounds)]
    frames = [chunk_frame([p]) for p in pieces]
    i = draw(st.integers(0, len(pieces) - 1))
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "insert", "drop", "replace", "swap", "lengths",
                                 "other", "oversize", "pickle_payload"]))
    if kind == "flip":
        data = bytearray(pieces[i])
        data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        frames[i] = chunk_frame([bytes(data)])
    elif kind == "truncate":
        frames[-1] = chunk_frame([pieces[-1][: -draw(st.integers(1, len(pieces[-1])))]])
    elif kind == "extend":
        frames[i] = chunk_frame([pieces[i] + draw(st.one_of(st.binary(min_size=1, max_size=100), pickled))])
    elif kind == "insert":
        raw = draw(EXTRA_CHUNKS) if draw(st.booleans()) else _other_frame(draw, header)
        frames.insert(draw(st.integers(0, len(frames))), raw if _changes_a_stream(raw) else chunk_frame([b"\0"]))
    elif kind == "drop":
        del frames[i]
    elif kind == "replace":
        frames[i] = chunk_frame([other(pieces[i], draw(junk_bytes))])
    elif kind == "swap" and len(set(pieces)) >= 2:
        j = next(j for j in range(len(pieces)) if pieces[j] != pieces[i])
        frames[i], frames[j] = frames[j], frames[i]
    elif kind == "lengths":
        frames[i] = draw(bad_length_frames(pieces[i]))
    elif kind == "other":
        frames[i] = _other_frame(draw, header)
    elif kind == "oversize":
        size = draw(st.integers(LIMITS.max_chunk_bytes + 1, oversize))
        frames[i] = chunk_frame([pieces[i] + bytes(size - len(pieces[i]))])
    elif kind == "pickle_payload":
        frames = [chunk_frame([draw(pickled)])]
    else:  # a swap of a stream with a single chunk: drop it instead
        del frames[i]
    return frames


# ----- the genuine transfer they start from, and bytes near its frames ---------------------------------
STATE = make_state()
MSG = make_msg(STATE)
RAW = encoded_frames(MSG, 512)
HEADER = pb.Frame.FromString(RAW[0]).header
PAYLOAD = b"".join(bytes(decode_frame(raw)) for raw in RAW[1:])


def near_chunk_frames() -> st.SearchStrategy[bytes]:
    """Bytes that look like a chunk frame to the fast path: its tags, with lengths right or wrong."""
    return st.one_of(
        st.binary(max_size=64).flatmap(bad_length_frames),
        st.builds(lambda a, b, data: b"\x12" + _varint(a) + b"\x0a" + _varint(b) + data, uint64s, uint64s,
                  st.binary(max_size=32)),
        st.binary(max_size=12).map(lambda tail: b"\x12" + tail),
        st.binary(max_size=12).map(lambda tail: b"\x12\x05\x0a" + tail),
    )


@st.composite
def mangled_frames(draw: st.DrawFn) -> bytes:
    """A real header or chunk frame with bytes flipped, cut, inserted or deleted."""
    raw = bytearray(draw(st.sampled_from(RAW)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if op == "flip" and at < len(raw):
            raw[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at:]
        elif op == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif at < len(raw):
            del raw[at]
    return bytes(raw)


FRAME_BYTES = st.one_of(st.binary(max_size=300), near_chunk_frames(), mangled_frames(), pickled)


@st.composite
def poisoned_states(draw: st.DrawFn, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``base`` with NaN or ±Inf (any bit pattern) in one to three places of its float tensors."""
    state = {k: v.clone() for k, v in base.items()}
    floats = [name for name, t in state.items() if t.is_floating_point()]
    for _ in range(draw(st.integers(1, 3))):
        t = state[draw(st.sampled_from(floats))]
        size, fmt, patterns = NON_FINITE_BITS[t.dtype]
        raw = t.view(-1).view(torch.uint8).numpy()
        at = draw(st.integers(0, t.numel() - 1)) * size
        raw[at : at + size] = list(struct.pack(fmt, draw(st.sampled_from(patterns))))
    return state
