"""Fuzzing everything a stranger can send a node (issue 13, "Hostile input"), with hypothesis.

Why: the codec, the chunk fast path and every RPC take bytes from anyone who can reach the port.
The hand-written rejection tests (test_codec_rejections.py, test_node_hostile.py, test_node_bounds.py)
cover the cases someone thought of; here hypothesis generates thousands of others — random and
mutated headers and chunks, wrong and huge declared lengths and sizes, NaN/Inf tensors, wrong dtypes
and shapes, pickles (whose unpickling would be recorded) as payloads and fields, random bytes as the
request of every method — and the suite checks what the issue asks of the node under all of them:

* at least 10,000 malformed inputs tried, and 0 crashes: every one is refused with a reason (never an
  exception, an INTERNAL/UNKNOWN status or an ERROR log line), and the node keeps serving (a valid
  Hello and a genuine transfer succeed after the flood);
* 0 state changes: its weights (a hash of the values, not the architecture fingerprint), its
  checkpoint files, its peer table and its round/epoch/token state are what they were;
* every refusal counted, by reason, in ``state.rejected`` (and so ``/status``): exactly one count per
  refused request, under the reason the peer was told;
* RSS and open file descriptors bounded.

Speed: most cases drive the receive path in-process (``decode_frame`` → ``MessageAssembler`` → the
finite-values gate, and ``probe_from_request``), the very code a node's Transfer and Probe handlers
run; a couple of thousand go over real gRPC to a real ``Node`` (round mode, defkt-select with probes)
on loopback. That node runs in a thread of its own with its own event loop, so that synchronous
hypothesis tests can drive it; everything that touches it runs on that loop. It is started once for
the module, by the first of its tests, which come before the in-process ones so that the RSS and fd
baselines are taken before any case ran; the last test checks the totals and prints the figures (run
with ``-s`` to see them). Hypothesis is derandomized: the same cases, and the same figures, every run.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import itertools
import logging
import math
import os
import pickle
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.algorithms.selection import MAX_PROBE_SAMPLES, SelectionError, check_probe, probe_budget
from dfl_node.learning.models import build_model
from dfl_node.net.codec import (
    ALLOWED_DTYPES, CHUNK_SIZE, BufferPool, Limits, MessageAssembler, TransferRejected, manifest_of,
)
from dfl_node.net.frames import ReadFrame, _varint, chunk_frame, decode_frame
from dfl_node.net.probes import probe_from_request
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.transport import open_transfer
from dfl_node.node.config import NodeConfig
from dfl_node.node.daemon import Node
from dfl_node.node.gate import check_finite
from dfl_node.node.service import run_node
from dfl_node.testbed.launcher import free_port
from tests.codec_helpers import FP, SWARM, encoded_frames, make_msg, make_state
from tests.conftest import FLEET

T = TypeVar("T")

# ----- the figures the suite reports -----------------------------------------------------------------
TRIED: Counter[str] = Counter()  # malformed inputs tried, by where they went in
CRASHES: list[str] = []  # anything but a refusal with a reason: an exception, an unexpected status, an ERROR log
STATE_CHANGES: list[str] = []  # what a flood of refused input changed on the node
DETONATED: list[str] = []  # set by unpickling a Detonator: nothing may ever unpickle received bytes
MIN_INPUTS = 10_000

LIMITS = Limits()  # what a node runs with
GRPC_MAX = LIMITS.max_message_bytes  # a bigger message is refused by gRPC itself, before the node sees it


def _detonate(tag: str) -> None:
    DETONATED.append(tag)


class Detonator:
    """Pickled into payloads and fields: whatever unpickles it records that it did."""

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return _detonate, ("a received pickle was unpickled",)


def _torch_saved() -> bytes:
    out = io.BytesIO()
    torch.save({"fc.weight": torch.ones(3, 3), "boom": Detonator()}, out)
    return out.getvalue()


PICKLES: list[bytes] = [
    pickle.dumps(Detonator(), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)
] + [
    pickle.dumps({"fc.weight": list(range(50)), "boom": Detonator()}),
    pickle.dumps(b"\x00" * 64),
    _torch_saved(),
]

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example,
                                       HealthCheck.filter_too_much])

U64 = 2**64 - 1
HUGE = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, U64]
# Strategies are built once (hypothesis validates every new strategy object: costly in a loop), and cheap:
# no st.text (latin-1 decoded bytes and a list of nasty strings instead), no filters (see ``other``).
uint64s = st.one_of(st.integers(0, 64), st.integers(0, U64), st.sampled_from(HUGE))
uint32s = st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1), st.sampled_from([2**31, 2**32 - 1]))
int64s = st.one_of(st.integers(-3, 64), st.integers(-(2**63), 2**63 - 1), st.sampled_from([-1, 2**62, 2**63 - 1]))
pickled = st.sampled_from(PICKLES)
junk_bytes = st.one_of(st.binary(max_size=96), pickled)
NASTY = ["", " ", "\x00", "../../etc/passwd", "x" * 5000, "é" * 100, "🙂" * 10, "\u202e", "名前", "%s%n", "\r\n",
         "float32", "aggregator", "sender", *(b[:120].decode("latin-1") for b in PICKLES)]
texts = st.one_of(st.sampled_from(NASTY), st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
DTYPE_NAMES = ["object", "complex64", "complex128", "float8_e4m3fn", "int8", "int16", "uint16", "uint32",
               "torch.float32", "<f4", "FLOAT32", "float32\x00", "float", "double", "half", "qint8", "str"]
dtype_names = st.one_of(st.sampled_from(DTYPE_NAMES + list(ALLOWED_DTYPES)), texts)
modes = st.one_of(st.just("class-profile"), texts)
digests = st.one_of(st.binary(max_size=40), st.binary(min_size=32, max_size=32), pickled)


def count(surface: str, n: int = 1) -> None:
    TRIED[surface] += n


def other(current: T, new: T) -> T:
    """``new``, or where it happens to equal ``current`` a value next to it: a mutation always changes."""
    if new != current:
        return new
    if isinstance(new, int):
        return new - 1 if new > 0 else new + 1  # within the field's range either way
    if isinstance(new, str):
        return new + "\x01"  # type: ignore[return-value]
    if isinstance(new, bytes):
        return new + b"\x00"  # type: ignore[return-value]
    assert isinstance(new, list)
    return [*new, 1]  # type: ignore[return-value]


# ----- mutations of a transfer -------------------------------------------------------------------------
def _entry(draw: st.DrawFn, h: pb.TransferHeader) -> pb.TensorEntry:
    if not h.manifest:  # an earlier mutation emptied it: a stranger's entry
        return h.manifest.add(name=draw(texts), dtype="float32", shape=[1], count=1, nbytes=4)
    return h.manifest[draw(st.integers(0, len(h.manifest) - 1))]


def _set_different(draw: st.DrawFn, msg: Any, name: str, values: st.SearchStrategy[Any]) -> None:
    setattr(msg, name, other(getattr(msg, name), draw(values)))


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
    _set_different(draw, e, field, uint64s)


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
    _set_different(draw, h, "protocol_version", uint32s)


def _identity_field(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    _set_different(draw, h, draw(st.sampled_from(["swarm", "fingerprint", "model"])), texts)


def _total_size(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    _set_different(draw, h, "total_size", uint64s)


def _digest(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    _set_different(draw, h, "sha256", digests)


def _dtype(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    _set_different(draw, _entry(draw, h), "dtype", dtype_names)


def _name(draw: st.DrawFn, h: pb.TransferHeader) -> None:
    _set_different(draw, _entry(draw, h), "name", texts)


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


# ----- the receive path, in-process (its tests come after the node's: see the end) ----------------------
STATE = make_state()
MSG = make_msg(STATE)
RAW = encoded_frames(MSG, 512)
HEADER = pb.Frame.FromString(RAW[0]).header
PAYLOAD = b"".join(bytes(decode_frame(raw)) for raw in RAW[1:])
MANIFEST = manifest_of(STATE)
POOL = BufferPool()  # one pool across all cases, as a node keeps one
CODEC_REASONS = {"unexpected_frame", "chunk_too_large", "trailing_data", "header_too_large", "protocol_version",
                 "swarm_mismatch", "fingerprint_mismatch", "too_large", "bad_manifest", "bad_sha256", "unknown_tensor",
                 "dtype_not_allowed", "shape_mismatch", "truncated", "non_finite"}


def receiver() -> MessageAssembler:
    """The assembler a node with ``STATE`` as its model makes for each Transfer."""
    return MessageAssembler(swarm=SWARM, fingerprint=FP, manifest=MANIFEST, buffers=POOL)


def refused_by_codec(frames: Iterable[ReadFrame], asm: MessageAssembler | None = None) -> str:
    """Feed ``frames`` (read as needed) to an assembler as the Transfer handler does, then the finite-values
    gate; the reason it was refused for. Acceptance fails the test; any other exception is recorded as a crash."""
    asm = asm or receiver()
    try:
        try:
            for frame in frames:
                asm.feed(frame)
            _, message = asm.finish()
        except TransferRejected as exc:
            assert exc.reason in CODEC_REASONS, exc
            with pytest.raises(TransferRejected) as again:  # a refused transfer stays refused
                asm.finish()
            assert again.value.reason == exc.reason
            return exc.reason
        try:
            check_finite(message)
        except TransferRejected as exc:
            return exc.reason
    except Exception as exc:
        if not isinstance(exc, AssertionError):
            CRASHES.append(f"codec: {exc!r}")
        raise
    raise AssertionError(f"a malformed transfer was accepted: {asm.header}")


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


def batches(strategy: st.SearchStrategy[T], size: int) -> st.SearchStrategy[list[T]]:
    """``size`` cases per hypothesis example: its own cost per example is then shared."""
    return st.lists(strategy, min_size=size, max_size=size)


FRAME_BYTES = st.one_of(st.binary(max_size=300), near_chunk_frames(), mangled_frames(), pickled)


def check_frame_bytes(raw: bytes) -> None:
    """``raw`` as a Transfer frame: decoded as protobuf would, and refused first and in place of the payload."""
    decoded = decode_frame(raw)
    try:
        reference: pb.Frame | None = pb.Frame.FromString(raw)
    except DecodeError:
        reference = None
    if isinstance(decoded, memoryview):
        assert reference is not None and reference.WhichOneof("kind") == "chunk"
        assert bytes(decoded) == reference.chunk.data
    elif reference is None:
        assert decoded == pb.Frame()
    else:
        assert reference.WhichOneof("kind") != "chunk" and decoded == reference
    first = refused_by_codec([decoded])
    assert first in CODEC_REASONS
    refused_by_codec([decode_frame(RAW[0]), decoded])  # in place of the payload: never the genuine bytes


@functools.cache
def chunks_of(chunk_size: int) -> list[bytes]:
    return encoded_frames(MSG, chunk_size)[1:]


NON_FINITE_BITS = {  # NaNs with payloads and signs, infinities: as raw bits of each float dtype
    torch.float32: (4, "<I", [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x7F800000, 0xFF800000]),
    torch.float64: (8, "<Q", [0x7FF8000000000000, 0xFFF0000000000001, 0x7FF0000000000000, 0xFFF0000000000000]),
    torch.float16: (2, "<H", [0x7E00, 0xFE00, 0x7C01, 0x7C00, 0xFC00]),
    torch.bfloat16: (2, "<H", [0x7FC0, 0xFFC0, 0x7F81, 0x7F80, 0xFF80]),
}


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


INPUT_SHAPE, CLASSES = (1, 8, 8), 10  # the digits data of the fleet


def genuine_probe(swarm: str) -> pb.ProbeRequest:
    """A valid probe-samples probe of two samples for a node of ``swarm`` on the fleet's data."""
    x = torch.rand(2, *INPUT_SHAPE, generator=torch.Generator().manual_seed(0))
    return pb.ProbeRequest(sender="stranger", swarm=swarm, mode="probe-samples", dtype="float32",
                           shape=[2, *INPUT_SHAPE], samples=x.numpy().tobytes(), labels=[1, 7])


@st.composite
def mutated_probes(draw: st.DrawFn, base: pb.ProbeRequest) -> pb.ProbeRequest:
    """``base`` (a valid probe-samples probe) with its mode, dtype, shape (up to 2**32 - 1 per dimension),
    samples (pickles, other lengths, NaN/Inf) or labels made wrong."""
    p = pb.ProbeRequest()
    p.CopyFrom(base)
    kind = draw(st.sampled_from(["mode", "dtype", "shape", "samples", "non_finite", "labels", "label_count"]))
    if kind == "mode":
        _set_different(draw, p, "mode", modes)
    elif kind == "dtype":
        _set_different(draw, p, "dtype", dtype_names)
    elif kind == "shape":
        shape = other(list(p.shape), draw(st.lists(uint32s, max_size=6)))
        limit = probe_budget(MAX_PROBE_SAMPLES, INPUT_SHAPE)
        if len(shape) == 4 and tuple(shape[1:]) == INPUT_SHAPE and 1 <= shape[0] <= limit:
            shape[0] = 0  # no samples: as wrong as any other shape
        del p.shape[:]
        p.shape.extend(shape)
        if draw(st.booleans()):  # samples as long as the new shape says, where that is small
            size = 4 * math.prod(shape) if shape else 0
            if size <= 1 << 16 and (not shape or shape[0] <= 1024):
                p.samples = bytes(size)
                del p.labels[:]
                p.labels.extend([0] * (shape[0] if shape else 0))
    elif kind == "samples":
        p.samples = draw(st.one_of(junk_bytes, st.binary(min_size=508, max_size=516)))
        if len(p.samples) == len(base.samples):
            p.samples += b"\x00"
    elif kind == "non_finite":
        raw = bytearray(p.samples)
        at = 4 * draw(st.integers(0, len(raw) // 4 - 1))
        raw[at : at + 4] = struct.pack("<I", draw(st.sampled_from(NON_FINITE_BITS[torch.float32][2])))
        p.samples = bytes(raw)
    elif kind == "labels":
        labels = list(p.labels)
        labels[draw(st.integers(0, len(labels) - 1))] = draw(st.integers(CLASSES, 2**32 - 1))
        del p.labels[:]
        p.labels.extend(labels)
    else:
        labels = draw(st.lists(st.integers(0, CLASSES - 1), max_size=8))
        if len(labels) == len(p.labels):
            labels.append(0)
        del p.labels[:]
        p.labels.extend(labels)
    return p


PROBE = genuine_probe(SWARM)


def check_probe_request(request: pb.ProbeRequest) -> None:
    """``request`` as a Probe: refused by the wire check (``bad_probe``) or by the algorithm's."""
    try:
        probe = probe_from_request(request, input_shape=INPUT_SHAPE, num_classes=CLASSES)
        with pytest.raises(SelectionError):
            check_probe(probe, INPUT_SHAPE, CLASSES, "probe-samples")
    except TransferRejected as exc:
        assert exc.reason == "bad_probe"
    except Exception as exc:
        if not isinstance(exc, AssertionError):
            CRASHES.append(f"probe codec: {exc!r}")
        raise


# ----- a real node, over gRPC ---------------------------------------------------------------------------
def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class ErrorLog(logging.Handler):
    """ERROR records (or tracebacks) of the node or gRPC: a crash of a handler that the client might not see."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            CRASHES.append(f"log: {record.name}: {record.getMessage()[:300]}")


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
    it; :meth:`start` also records what the flood must leave as it is (``baseline``, ``fds``)."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzzed-node", daemon=True)
        self.stop = asyncio.Event()
        self.node: Node
        self.task: asyncio.Task[None]
        self.channel: grpc.aio.Channel
        self.baseline: Snapshot
        self.rss, self.fds = 0.0, 0
        model = build_model(config.model, INPUT_SHAPE, CLASSES, hidden=config.hidden, seed=99)
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
                                             fingerprint=self.node.fingerprint)
        self.baseline, self.rss, self.fds = self.snapshot(), rss_mb(), open_fds()

    async def _start(self) -> Node:
        node = Node(self.config)
        self.task = asyncio.create_task(run_node(node, self.stop))
        ready = asyncio.create_task(node.ready.wait())
        await asyncio.wait({self.task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            self.task.result()  # it failed to start: say why
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.config.grpc_port}",
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
        return self.call(lambda: Counter(self.node.state.rejected))

    def snapshot(self) -> Snapshot:
        def take() -> Snapshot:
            node, state = self.node, self.node.state
            folder = node.checkpoint.directory
            files = tuple(sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest())
                                 for p in folder.iterdir() if p.is_file()))
            return Snapshot(
                weights=weights_digest(node.ctx.checkpoint_state()), files=files,
                peers=tuple(sorted(node.peers.peers)), pending=tuple(sorted(node.peers.pending)),
                clients=tuple(sorted(node.clients)),
                progress=(state.round, state.epoch, dict(state.token_state), state.holding,
                          getattr(node.scheduler, "holder", None), state.done, state.role, len(state.history),
                          node.collector is None),
            )

        return self.call(take)

    def message(self, state: dict[str, torch.Tensor] | None = None) -> ModelMessage:
        """A genuine model (a fresh one of our architecture, or ``state``) from the sender "stranger"."""
        return ModelMessage(sender="stranger", round=0, purpose=f"{self.config.algorithm}.model", num_samples=100,
                            parts=parts_from_state(self.genuine_state if state is None else state),
                            model=self.node.wire.model)

    def expect(self) -> None:
        """Make the node the aggregator of a round-0 group whose one sender is "stranger" (as a holder would)."""
        async def play() -> pb.Ack:
            await self.node.settled()
            return await self.node.play(pb.RoundAssignment(round=0, role="aggregator", aggregator=self.config.id,
                                                           senders=["stranger"], deadline_s=30))

        ack = self.run(play())
        assert ack.ok, ack

    def settle(self) -> None:
        self.run(self.node.settled())


def _identity(raw: bytes) -> bytes:
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
            reply = await channel.unary_unary(path, request_serializer=_identity,
                                              response_deserializer=RESPONSES[method].FromString)(request, timeout=20)
            refused = not (reply.accepted if method == "Hello" else reply.ok)
            assert refused and reply.reason, f"{method} was not refused: {reply}"
            return reply.reason
        if method == "Pull":
            call = channel.unary_stream(path, request_serializer=_identity, response_deserializer=pb.Frame.FromString)
            replies = [frame async for frame in call(request, timeout=20)]
        else:  # as a node's client writes: concurrently with reading the verdict, which may come first
            transfer = channel.stream_stream(path, request_serializer=_identity,
                                             response_deserializer=pb.Frame.FromString)
            result, stream, _ = await open_transfer(transfer, request, timeout=20)
            stream.cancel()
            assert not result.accepted and result.reason, f"Transfer was not refused: {result}"
            return result.reason
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
            CRASHES.append(f"{method}: {exc.code().name}: {exc.details()}")
            raise
        return "undecodable"
    assert len(replies) == 1 and replies[0].WhichOneof("kind") == "result", replies[:2]
    result = replies[0].result
    assert not result.accepted and result.reason, f"{method} was not refused: {result}"
    return result.reason


@pytest.fixture(scope="module")
def live(fleet_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    fields = FLEET.model_dump(include=set(NodeConfig.model_fields))
    fields.update(id="node-0", data=fleet_shards / "node-0", grpc_port=free_port(), http_port=free_port(),
                  mdns=False, swarm=f"fuzz-{uuid.uuid4().hex[:6]}", state_dir=tmp_path_factory.mktemp("fuzzed"),
                  algorithm="defkt-select", selection="probe-samples")  # round mode: epochs and the token in play
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    node = LiveNode(NodeConfig(**fields))
    try:
        node.start()
        yield node
    finally:
        node.close()
        logging.getLogger().removeHandler(errors)


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
    count(f"grpc: {method}", len(requests))
    after = live.rejected()
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == Counter(reasons), reasons
    live.settle()
    now = live.snapshot()
    changed = was.changes(now)
    if changed:
        STATE_CHANGES.append(f"{method}: {', '.join(changed)}")
    assert not changed, f"{method}: refused input changed {changed}: {[getattr(was, c) for c in changed]} -> " \
                        f"{[getattr(now, c) for c in changed]}"
    return reasons


def genuine(live: LiveNode, method: str, raw: bytes) -> bool:
    """Whether random bytes happen to be a request the protocol honours (a compatible Hello, a token with our
    seed, an assignment of a real role, a pull or probe for our swarm): not malformed, so not sent."""
    try:
        request = REQUESTS[method].FromString(raw)
    except DecodeError:
        return False
    cfg = live.config
    if method == "Hello":
        return request.protocol_version == PROTOCOL_VERSION and request.swarm == cfg.swarm
    if method == "PassToken":
        return request.seed == cfg.seed
    if method == "Assign":
        return request.role in ("sender", "aggregator")
    return request.swarm == cfg.swarm


METHODS = ["Hello", "Transfer", "Pull", "Probe", "Assign", "PassToken"]


@pytest.mark.parametrize("method", METHODS)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_random_bytes_as_every_request(live: LiveNode, method: str, data: st.DataObject) -> None:
    """Random bytes, pickles and mangled frames as the serialized request of every method (for Transfer:
    streams of such frames, or none at all)."""
    if method == "Transfer":
        requests: list[Any] = data.draw(st.lists(st.lists(FRAME_BYTES, max_size=4), min_size=1, max_size=8))
    else:
        requests = [raw for raw in data.draw(st.lists(FRAME_BYTES, min_size=1, max_size=8))
                    if not genuine(live, method, raw)]
        assume(requests)
    flood(live, method, requests)


def _hello_base(live: LiveNode) -> pb.HelloRequest:
    return pb.HelloRequest(protocol_version=PROTOCOL_VERSION, swarm=live.config.swarm, node_id="stranger",
                           fingerprint=live.node.fingerprint, algorithm=live.config.algorithm,
                           grpc_address="127.0.0.1:1", boot_id="b", model=live.node.wire.model)


@st.composite
def bad_hellos(draw: st.DrawFn, base: pb.HelloRequest) -> bytes:
    """A Hello incompatible in one to three ways, with junk (long strings, pickles) in its other fields."""
    h = pb.HelloRequest()
    h.CopyFrom(base)
    for name in draw(st.lists(st.sampled_from(["protocol_version", "swarm", "fingerprint", "algorithm", "model"]),
                              min_size=1, max_size=3, unique=True)):
        _set_different(draw, h, name, uint32s if name == "protocol_version" else texts)
    if draw(st.booleans()):
        h.node_id, h.grpc_address, h.boot_id, h.status_url = (draw(texts) for _ in range(4))
        h.auth_nonce, h.auth_challenge, h.auth_proof = (draw(junk_bytes) for _ in range(3))
        h.http_port, h.num_samples = draw(uint32s), draw(uint64s)
    return h.SerializeToString()


@st.composite
def bad_assignments(draw: st.DrawFn, node_id: str) -> bytes:
    """An assignment of no real role (or an aggregator with candidates), from any epoch and round."""
    role = draw(st.one_of(texts, st.sampled_from(["idle", "source", "candidate", "holder", "AGGREGATOR", "sender "])))
    if role in ("sender", "aggregator"):
        role += "\x00"
    candidates = []
    if draw(st.booleans()):
        role, candidates = "aggregator", draw(st.lists(texts, min_size=1, max_size=4))
    request = pb.RoundAssignment(round=draw(uint64s), epoch=draw(uint64s), holder=draw(texts), role=role,
                                 aggregator=draw(st.sampled_from([node_id, "stranger"])), senders=["stranger"],
                                 aggregator_address=draw(texts), candidates=candidates, pull=draw(st.booleans()),
                                 deadline_s=draw(st.floats(allow_nan=True, allow_infinity=True)),
                                 state=draw(st.dictionaries(texts, texts, max_size=3)))
    return request.SerializeToString()


@st.composite
def bad_tokens(draw: st.DrawFn, node_id: str, seed: int) -> bytes:
    """A round token with a seed other than the swarm's, naming us holder or not, done or not, any epoch."""
    request = pb.RoundToken(round=draw(uint64s), epoch=draw(uint64s), holder=draw(st.sampled_from([node_id, "x"])),
                            seed=other(seed, draw(uint64s)), members=draw(st.lists(texts, max_size=4)),
                            done=draw(st.booleans()), state=draw(st.dictionaries(texts, texts, max_size=3)))
    return request.SerializeToString()


@st.composite
def bad_pulls(draw: st.DrawFn, swarm: str) -> bytes:
    request = pb.PullRequest(aggregator=draw(texts), swarm=other(swarm, draw(texts)), round=draw(uint64s),
                             epoch=draw(uint64s), state=draw(st.dictionaries(texts, texts, max_size=3)))
    return request.SerializeToString()


@st.composite
def bad_probe_bytes(draw: st.DrawFn, base: pb.ProbeRequest) -> bytes:
    p = draw(mutated_probes(base))
    if draw(st.integers(0, 5)) == 0:
        p.swarm = other(base.swarm, draw(texts))
    return p.SerializeToString()


@pytest.mark.parametrize("method", ["Hello", "Probe", "Assign", "PassToken", "Pull"])
@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_malformed_messages_to_every_unary_method(live: LiveNode, method: str, data: st.DataObject) -> None:
    """Well-formed protobuf, wrong content: incompatible Hellos, bad probes (NaN samples, huge shapes, pickles),
    assignments of no real role from huge epochs, tokens of another seed, pulls for another swarm."""
    cfg = live.config
    strategy = {
        "Hello": bad_hellos(_hello_base(live)),
        "Probe": bad_probe_bytes(genuine_probe(cfg.swarm)),
        "Assign": bad_assignments(cfg.id),
        "PassToken": bad_tokens(cfg.id, cfg.seed),
        "Pull": bad_pulls(cfg.swarm),
    }[method]
    flood(live, method, data.draw(st.lists(strategy, min_size=1, max_size=8)))


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_mutated_headers_over_grpc(live: LiveNode, data: st.DataObject) -> None:
    """Transfers whose header is wrong (and, when its checks pass, that no group expects), concurrently."""
    frames = live.genuine_frames
    header = pb.Frame.FromString(frames[0]).header
    headers = data.draw(st.lists(mutated_headers(header), min_size=1, max_size=6))
    flood(live, "Transfer", [[pb.Frame(header=h).SerializeToString(), *frames[1:]] for h in headers])


@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_mutated_payloads_to_an_expecting_aggregator(live: LiveNode, data: st.DataObject) -> None:
    """The transfer the node waits for (a genuine header from its sender), with a malformed payload or
    NaN/Inf values: refused after admission, the group given up, nothing fused."""
    frames = live.genuine_frames
    if poisoned := data.draw(st.integers(0, 3)) == 0:
        state = data.draw(poisoned_states(live.genuine_state))
        stream = encoded_frames(live.message(state=state), data.draw(st.integers(512, 8192)),
                                swarm=live.config.swarm, fingerprint=live.node.fingerprint)
    else:
        payload = b"".join(bytes(decode_frame(raw)) for raw in frames[1:])
        header = pb.Frame.FromString(frames[0]).header
        stream = [frames[0], *data.draw(mutated_streams(payload, header, oversize=GRPC_MAX - 64))]
    reasons = flood(live, "Transfer", [stream], expected=True)
    assert reasons != ["not_expected"] and (reasons == ["non_finite"] or not poisoned), reasons


# ----- the receive path in-process: the bulk of the cases. After the node's tests, so that the node is up
# (started once, for the module) when the baseline of RSS and fds is taken, and all of the flood counts.


@settings(FUZZ, max_examples=500)
@given(batch=batches(FRAME_BYTES, 6))
def test_decode_frame_never_raises_and_agrees_with_protobuf(batch: list[bytes]) -> None:
    """Any bytes as a Transfer frame: the fast chunk decoder returns what protobuf reads (a chunk's data, a
    frame, or an empty frame for what does not parse), and the frame, first or after a genuine header, is
    refused."""
    for raw in batch:
        count("codec: frame bytes")
        check_frame_bytes(raw)


@settings(FUZZ, max_examples=500)
@given(batch=batches(st.tuples(mutated_headers(HEADER), st.sampled_from([64, 100, 512, 1000, 4096])), 4))
def test_mutated_headers_are_refused(batch: list[tuple[pb.TransferHeader, int]]) -> None:
    """A genuine payload under a header with wrong versions, names, sizes (up to 2**64 - 1), offsets, dtypes,
    shapes, digests or entries: refused, and never a buffer of the declared size."""
    for header, chunk_size in batch:
        count("codec: headers")
        asm = receiver()
        refused_by_codec(itertools.chain([pb.Frame(header=header)], map(decode_frame, chunks_of(chunk_size))), asm)
        assert asm.header is None or asm.header.total_size <= len(PAYLOAD)  # what it allocated for


@settings(FUZZ, max_examples=500)
@given(batch=batches(mutated_streams(PAYLOAD, HEADER, oversize=LIMITS.max_chunk_bytes + 64), 4))
def test_mutated_chunks_are_refused(batch: list[list[bytes]]) -> None:
    """A genuine header followed by chunks that are not its payload, in any way: refused."""
    for stream in batch:
        count("codec: chunks")
        refused_by_codec(map(decode_frame, [RAW[0], *stream]))


@settings(FUZZ, max_examples=300)
@given(batch=batches(st.tuples(poisoned_states(STATE), st.sampled_from([256, 1000, 4096, CHUNK_SIZE])), 2))
def test_non_finite_tensors_pass_the_codec_and_are_refused_by_the_gate(
        batch: list[tuple[dict[str, torch.Tensor], int]]) -> None:
    """A well-formed transfer (header and sha256 right) of NaN/Inf values: the codec cannot see them, the
    gate every received model goes through refuses it (``non_finite``)."""
    for state, chunk_size in batch:
        count("codec: non-finite tensors")
        frames = [decode_frame(raw) for raw in encoded_frames(make_msg(state), chunk_size)]
        assert refused_by_codec(frames) == "non_finite"


@settings(FUZZ, max_examples=300)
@given(batch=batches(mutated_probes(PROBE), 5))
def test_mutated_probes_are_refused(batch: list[pb.ProbeRequest]) -> None:
    """A probe of the wrong mode, dtype, shape, length, values or labels: refused before (``bad_probe``) or by
    the algorithm's check (``SelectionError``), and never a tensor of a declared size."""
    for request in batch:
        count("codec: probes")
        check_probe_request(request)


def test_the_node_is_unharmed_and_the_figures(live: LiveNode) -> None:
    """After the flood (the tests above, in file order): nothing was unpickled, nothing crashed, nothing
    changed, /status counts what state.rejected does, RSS and fds are bounded, and the node still accepts
    a genuine Hello and fuses a genuine model. Prints the figures."""
    rss, fds = rss_mb(), open_fds()
    rejected = live.rejected()
    with httpx.Client(trust_env=False) as http:
        status = http.get(f"http://127.0.0.1:{live.config.http_port}/status", timeout=10).json()
    assert status["rejected"] == dict(rejected)
    changed = live.baseline.changes(live.snapshot())

    async def hello() -> pb.HelloReply:
        call = live.channel.unary_unary("/dfl.v1.DflNode/Hello", request_serializer=_identity,
                                        response_deserializer=pb.HelloReply.FromString)
        return await call(_hello_base(live).SerializeToString(), timeout=10)

    reply = live.run(hello())
    assert reply.accepted, reply
    fusions = live.call(lambda: live.node.state.counters["fusions"])
    live.expect()
    assert live.run(send_genuine(live)) == (True, "")
    live.settle()
    assert live.call(lambda: live.node.state.counters["fusions"]) == fusions + 1
    assert live.snapshot().weights != live.baseline.weights  # it did fuse

    total = sum(TRIED.values())
    print("\n---- fuzz figures (issue 13) ----")
    for surface, n in sorted(TRIED.items()):
        print(f"  {surface:<32} {n:>6}")
    print(f"malformed inputs tried {total}")
    print(f"crashes {len(CRASHES)}")
    print(f"state changes {len(STATE_CHANGES) + len(changed)}")
    print(f"unpickled {len(DETONATED)}")
    print(f"rejected, by reason (the node's /status) {dict(sorted(rejected.items()))}")
    print(f"RSS {live.rss:.0f} MB before the flood (node up), {rss:.0f} MB after it ({rss - live.rss:+.0f} MB)")
    print(f"open fds {live.fds} before the flood, {fds} after it")
    assert total >= MIN_INPUTS, TRIED
    assert not CRASHES, CRASHES[:10]
    assert not STATE_CHANGES and not changed, (STATE_CHANGES[:10], changed)
    assert not DETONATED
    assert sum(rejected.values()) == sum(n for k, n in TRIED.items() if k.startswith("grpc:"))  # each once
    assert rss - live.rss < 200, (live.rss, rss)
    assert fds <= live.fds + 8, (live.fds, fds)


async def send_genuine(live: LiveNode) -> tuple[bool, str]:
    transfer = live.channel.stream_stream("/dfl.v1.DflNode/Transfer", request_serializer=_identity,
                                          response_deserializer=pb.Frame.FromString)
    result, call, _ = await open_transfer(transfer, live.genuine_frames, timeout=30)
    call.cancel()
    return result.accepted, result.reason
