"""What the fuzz suite's malformed input is made of (shared by test_fuzz_codec.py and test_fuzz_grpc.py):
hypothesis settings, strategies of hostile values (huge integers, nasty strings, wrong dtype names, pickles
whose unpickling is recorded in :data:`DETONATED`), and malformed selection probes.

Strategies are module-level objects because hypothesis validates every new strategy object (costly in a
loop). In one module so that the in-process and the over-the-wire cases draw from one definition of
hostile input, and a pickle found unpickled anywhere lands in one :data:`DETONATED`.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dfl_node.algorithms.selection import MAX_PROBE_SAMPLES, probe_budget
from dfl_node.net.manifest import ALLOWED_DTYPES
from dfl_node.net.proto import dfl_pb2 as pb

T = TypeVar("T")

DETONATED: list[str] = []  # set by unpickling a Detonator: nothing may ever unpickle received bytes


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


def set_different(draw: st.DrawFn, msg: Any, name: str, values: st.SearchStrategy[Any]) -> None:
    setattr(msg, name, other(getattr(msg, name), draw(values)))


NON_FINITE_BITS = {  # NaNs with payloads and signs, infinities: as raw bits of each float dtype
    torch.float32: (4, "<I", [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x7F800000, 0xFF800000]),
    torch.float64: (8, "<Q", [0x7FF8000000000000, 0xFFF0000000000001, 0x7FF0000000000000, 0xFFF0000000000000]),
    torch.float16: (2, "<H", [0x7E00, 0xFE00, 0x7C01, 0x7C00, 0xFC00]),
    torch.bfloat16: (2, "<H", [0x7FC0, 0xFFC0, 0x7F81, 0x7F80, 0xFF80]),
}

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
        set_different(draw, p, "mode", modes)
    elif kind == "dtype":
        set_different(draw, p, "dtype", dtype_names)
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
