"""Fuzzing the receive path in-process ("Hostile input"), with hypothesis: the bulk of the suite.

Why: the codec, the chunk fast path and every RPC take bytes from anyone who can reach the port.
The hand-written rejection tests (test_codec_rejections.py, test_node_hostile.py, test_node_bounds.py)
cover the cases someone thought of; here hypothesis generates thousands of others — random and
mutated headers and chunks, wrong and huge declared lengths and sizes, NaN/Inf tensors, wrong dtypes
and shapes, pickles (whose unpickling would be recorded) as payloads and fields, malformed selection
probes — and drives them through the very code a node's Transfer and Probe handlers run
(``decode_frame`` → ``MessageAssembler`` → the finite-values gate, and ``probe_from_request``), without
a node, so that thousands of cases take seconds. test_fuzz_grpc.py sends such input to a real node.

What a node must withstand, checked here for its receive path:

* this file's share of the 10,000 malformed inputs (tests/fuzz_figures.py) tried, and 0 crashes: every
  one is refused with a reason (never an exception or an ERROR log line);
* nothing unpickled;
* RSS and open file descriptors bounded (baselines taken before the first case).

The last test checks the totals and prints the figures (run with ``-s`` to see them); flood tests not run
yet in this process (when it is selected alone with ``-k``, or run first) run in it first. Hypothesis is
derandomized: the same cases, and the same figures, every run.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from dfl_node.algorithms.selection import SelectionError, check_probe
from dfl_node.net.assembler import MessageAssembler
from dfl_node.net.buffers import BufferPool
from dfl_node.net.convert import from_wire
from dfl_node.net.frames import ReadFrame, decode_frame
from dfl_node.net.manifest import CHUNK_SIZE, manifest_of
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.node.exchange.arrival_checks import check_finite
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.probes import ProbeRequest, probe_from_request
from tests.fuzz_figures import MIN_CODEC_INPUTS, Figures, open_fds, rss_mb
from tests.fuzz_frames import (
    FRAME_BYTES,
    HEADER,
    LIMITS,
    MSG,
    PAYLOAD,
    RAW,
    STATE,
    mutated_headers,
    mutated_streams,
    poisoned_states,
)
from tests.fuzz_strategies import CLASSES, FUZZ, INPUT_SHAPE, genuine_probe, mutated_probes
from tests.helpers.codec import FP, SWARM, encoded_frames, make_msg

T = TypeVar("T")

FIGURES = Figures("the codec, in-process", MIN_CODEC_INPUTS)
MANIFEST = manifest_of(STATE)
POOL = BufferPool()  # one pool across all cases, as a node keeps one
CODEC_REASONS = {"unexpected_frame", "chunk_too_large", "trailing_data", "header_too_large", "protocol_version",
                 "swarm_mismatch", "fingerprint_mismatch", "too_large", "bad_manifest", "bad_sha256", "bad_blake3",
                 "hash_not_offered", "unknown_tensor", "wire_dtype_mismatch", "bad_scale", "dtype_not_allowed",
                 "shape_mismatch", "truncated", "non_finite"}


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
            FIGURES.crashes.append(f"codec: {exc!r}")
        raise
    raise AssertionError(f"a malformed transfer was accepted: {asm.header}")


def batches(strategy: st.SearchStrategy[T], size: int) -> st.SearchStrategy[list[T]]:
    """``size`` cases per hypothesis example: its own cost per example is then shared."""
    return st.lists(strategy, min_size=size, max_size=size)


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


PROBE = genuine_probe(SWARM)


def check_probe_request(request: pb.ProbeRequest) -> None:
    """``request`` as a Probe: refused by the wire check (``bad_probe``) or by the algorithm's."""
    try:
        probe = probe_from_request(from_wire(request, ProbeRequest), input_shape=INPUT_SHAPE, num_classes=CLASSES)
        with pytest.raises(SelectionError):
            check_probe(probe, INPUT_SHAPE, CLASSES, "probe-samples")
    except TransferRejected as exc:
        assert exc.reason == "bad_probe"
    except Exception as exc:
        if not isinstance(exc, AssertionError):
            FIGURES.crashes.append(f"probe codec: {exc!r}")
        raise


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[Figures]:
    """Baselines before the first case, and ERROR log lines recorded as crashes until the last."""
    with FIGURES.errors_logged():
        FIGURES.take_baseline()
        yield FIGURES


@FIGURES.flood
@settings(FUZZ, max_examples=500)
@given(batch=batches(FRAME_BYTES, 6))
def test_decode_frame_never_raises_and_agrees_with_protobuf(batch: list[bytes]) -> None:
    """Any bytes as a Transfer frame: the fast chunk decoder returns what protobuf reads (a chunk's data, a
    frame, or an empty frame for what does not parse), and the frame, first or after a genuine header, is
    refused."""
    for raw in batch:
        FIGURES.count("codec: frame bytes")
        check_frame_bytes(raw)


@FIGURES.flood
@settings(FUZZ, max_examples=500)
@given(batch=batches(st.tuples(mutated_headers(HEADER), st.sampled_from([64, 100, 512, 1000, 4096])), 4))
def test_mutated_headers_are_refused(batch: list[tuple[pb.TransferHeader, int]]) -> None:
    """A genuine payload under a header with wrong versions, names, sizes (up to 2**64 - 1), offsets, dtypes,
    shapes, digests or entries: refused, and never a buffer of the declared size."""
    for header, chunk_size in batch:
        FIGURES.count("codec: headers")
        asm = receiver()
        refused_by_codec(itertools.chain([pb.Frame(header=header)], map(decode_frame, chunks_of(chunk_size))), asm)
        assert asm.header is None or asm.header.total_size <= len(PAYLOAD)  # what it allocated for


@FIGURES.flood
@settings(FUZZ, max_examples=500)
@given(batch=batches(mutated_streams(PAYLOAD, HEADER, oversize=LIMITS.max_chunk_bytes + 64), 4))
def test_mutated_chunks_are_refused(batch: list[list[bytes]]) -> None:
    """A genuine header followed by chunks that are not its payload, in any way: refused."""
    for stream in batch:
        FIGURES.count("codec: chunks")
        refused_by_codec(map(decode_frame, [RAW[0], *stream]))


@FIGURES.flood
@settings(FUZZ, max_examples=300)
@given(batch=batches(st.tuples(poisoned_states(STATE), st.sampled_from([256, 1000, 4096, CHUNK_SIZE])), 2))
def test_non_finite_tensors_pass_the_codec_and_are_refused_by_the_gate(
        batch: list[tuple[dict[str, torch.Tensor], int]]) -> None:
    """A well-formed transfer (header and sha256 right) of NaN/Inf values: the codec cannot see them, the
    gate every received model goes through refuses it (``non_finite``)."""
    for state, chunk_size in batch:
        FIGURES.count("codec: non-finite tensors")
        frames = [decode_frame(raw) for raw in encoded_frames(make_msg(state), chunk_size)]
        assert refused_by_codec(frames) == "non_finite"


@FIGURES.flood
@settings(FUZZ, max_examples=300)
@given(batch=batches(mutated_probes(PROBE), 5))
def test_mutated_probes_are_refused(batch: list[pb.ProbeRequest]) -> None:
    """A probe of the wrong mode, dtype, shape, length, values or labels: refused before (``bad_probe``) or by
    the algorithm's check (``SelectionError``), and never a tensor of a declared size."""
    for request in batch:
        FIGURES.count("codec: probes")
        check_probe_request(request)


def test_the_codec_is_unharmed_and_the_figures(figures: Figures) -> None:
    """After the cases above (those not run yet in this process are run here first, e.g. when this test is
    selected alone): nothing was unpickled, nothing crashed, RSS and fds are bounded. Prints the figures."""
    figures.complete()
    figures.report(rss_mb(), open_fds())
