"""The sender's half of a transfer: a :class:`ModelMessage` into a checked header and the bytes it announces.

:func:`prepare` encodes and hashes a message once (:class:`Outgoing`), which then streams as frames to any
number of peers, whole or from the byte a cut stream's receiver holds. The format is
:mod:`dfl_node.net.manifest`'s; the receiver's half is :mod:`dfl_node.net.assembler`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

import dfl_node
from dfl_node.algorithms.messages import ModelMessage, TensorPart
from dfl_node.hashes import DEFAULT_HASH, HASHES
from dfl_node.net.frames import WireFrame, chunk_frame
from dfl_node.net.manifest import CHUNK_SIZE, DTYPE_NAMES, ENCODING_NAMES, numel
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.wire_dtypes import EXACT, encode


@dataclass(frozen=True)
class _WirePart:
    raw: memoryview  # the bytes that travel
    encoding: str  # "" (as the part's dtype), or a name of ENCODINGS
    scale: float  # int8's scale, else 0.0


def _wire_part(part: TensorPart, wire_dtype: str) -> _WirePart:
    """The part's elements as they travel: raw bytes, without a copy when the values are already flat CPU
    tensors that travel exactly; encoded (a new tensor) on a lossy wire."""
    values = part.values.detach().cpu().reshape(-1).contiguous()
    if values.dtype not in DTYPE_NAMES:
        raise ValueError(f"part {part.name!r}: dtype {values.dtype} cannot be sent")
    if part.start < 0 or part.start + values.numel() > numel(part.shape):
        raise ValueError(f"part {part.name!r}: range exceeds shape {part.shape}")
    wire_values, scale = encode(values, wire_dtype)
    name = "" if wire_values is values else ENCODING_NAMES[wire_values.dtype]
    return _WirePart(wire_values.view(torch.uint8).numpy().data, name, scale)  # the array's own buffer: no copy


@dataclass(frozen=True)
class Outgoing:
    """A message ready to stream: its validated-by-the-peer header (with the payload's digest) and its bytes.

    Preparing costs one hashing pass over the payload; do it once per message (in a worker thread),
    then stream it to as many peers as needed with :meth:`frames`.
    """

    header: pb.TransferHeader
    raws: tuple[memoryview, ...]

    def frames(self, chunk_size: int = CHUNK_SIZE) -> Iterator[WireFrame]:
        """The header frame, then the whole payload in chunk frames of at most ``chunk_size`` bytes."""
        yield pb.Frame(header=self.header)
        yield from self.chunks(0, chunk_size)

    def chunks(self, start: int = 0, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """Encoded chunk frames of the payload from byte ``start`` on (what a receiver that holds the bytes before
        it still needs), of at most ``chunk_size`` bytes, cut lazily from the parts."""
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        if not 0 <= start <= self.header.total_size:
            raise ValueError(f"start {start} is outside the payload's {self.header.total_size} bytes")
        pieces: list[memoryview] = []  # small parts are packed together so that every chunk but the last is full
        filled = 0
        skip = start
        for raw in self.raws:
            if skip >= raw.nbytes:
                skip -= raw.nbytes
                continue
            pos, skip = skip, 0
            while pos < raw.nbytes:
                take = min(chunk_size - filled, raw.nbytes - pos)
                pieces.append(raw[pos : pos + take])
                filled += take
                pos += take
                if filled == chunk_size:
                    yield chunk_frame(pieces)
                    pieces, filled = [], 0
        if pieces:
            yield chunk_frame(pieces)


def copy_header(header: pb.TransferHeader, **changes: object) -> pb.TransferHeader:
    """``header`` with ``changes`` (a resumed stream's flags): a copy, the prepared message's own stays as it is."""
    copied = pb.TransferHeader()
    copied.CopyFrom(header)
    for name, value in changes.items():
        setattr(copied, name, value)
    return copied


def prepare(msg: ModelMessage, *, swarm: str, fingerprint: str, epoch: int = 0, hash: str = DEFAULT_HASH,
            wire_dtype: str = EXACT) -> Outgoing:
    """Build the header (manifest with byte offsets, total size, the payload's digest under ``hash``) for
    ``msg``, its floating tensors encoded for a ``wire_dtype`` wire.

    The parts must not change afterwards (``parts_from_state`` already hands out copies).
    """
    wire_parts = tuple(_wire_part(p, wire_dtype) for p in msg.parts)
    digest = HASHES[hash]()
    header = pb.TransferHeader(
        sender=msg.sender, swarm=swarm, protocol_version=dfl_node.PROTOCOL_VERSION, round=msg.round,
        purpose=msg.purpose, fingerprint=fingerprint, num_samples=msg.num_samples, metadata=msg.metadata,
        epoch=epoch, model=msg.model, hash=hash,
    )  # fmt: skip
    offset = 0
    for part, wire in zip(msg.parts, wire_parts):
        digest.update(wire.raw)
        header.manifest.append(
            pb.TensorEntry(
                name=part.name, dtype=DTYPE_NAMES[part.values.dtype], shape=part.shape, start=part.start,
                count=part.values.numel(), offset=offset, nbytes=wire.raw.nbytes, encoding=wire.encoding,
                scale=wire.scale,
            )
        )  # fmt: skip
        offset += wire.raw.nbytes
    header.total_size = offset
    header.digest = digest.digest()
    return Outgoing(header, tuple(w.raw for w in wire_parts))
