"""``dfl.v1.Frame`` ⇄ bytes on a Transfer stream, with a fast path for the bulk: chunk frames.

A chunk frame is the protobuf encoding of ``Frame{chunk: Chunk{data}}``::

    0x12 <varint: length of the rest>  0x0A <varint: len(data)>  data

Building those bytes by hand costs one copy of the payload, and parsing them none (the payload
stays a ``memoryview`` of the bytes gRPC delivered), where protobuf would copy it two or three
times on each side; on a small CPU those copies were most of a stream's cost. The wire format is
exactly the ``.proto``'s: any protobuf implementation reads these frames, and a chunk encoded
differently by another encoder (field order, extra fields) is still accepted, through protobuf.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from dfl_node.hashes import Payload  # of unsigned bytes
from dfl_node.net.proto import dfl_pb2 as pb

_FRAME_CHUNK_TAG = b"\x12"  # Frame field 2 (chunk), wire type 2 (length-delimited)
_CHUNK_DATA_TAG = b"\x0a"  # Chunk field 1 (data), wire type 2

WireFrame = pb.Frame | bytes  # what a sender writes: a protobuf frame, or a chunk frame already encoded
ReadFrame = pb.Frame | memoryview  # what a receiver reads: a protobuf frame, or a chunk's payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); ``(-1, pos)`` when ``raw`` holds no well-formed varint at ``pos``."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(raw))):
        value |= (raw[i] & 0x7F) << shift
        if raw[i] < 0x80:
            return value, i + 1
        shift += 7
    return -1, pos


def chunk_frame(pieces: Sequence[Payload]) -> bytes:
    """The encoded chunk frame whose data is ``pieces`` back to back (one copy of the payload)."""
    size = sum(memoryview(p).nbytes for p in pieces)
    inner = _CHUNK_DATA_TAG + _varint(size)
    return b"".join([_FRAME_CHUNK_TAG, _varint(len(inner) + size), inner, *pieces])


def encode_frame(frame: WireFrame) -> bytes:
    """gRPC request/response serializer of the Transfer stream: chunk frames are already bytes."""
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def wire_size(frame: WireFrame) -> int:
    """Bytes ``frame`` takes on the wire (without gRPC's own framing)."""
    return len(frame) if isinstance(frame, bytes) else frame.ByteSize()


def decode_frame(raw: bytes) -> ReadFrame:
    """gRPC deserializer of the Transfer stream: a chunk's payload as a view of ``raw``, anything else as protobuf.

    Never raises: bytes that are not a Frame decode to an empty ``Frame``, which the assembler
    rejects with a reason like any other unexpected frame.
    """
    if raw[:1] == _FRAME_CHUNK_TAG:
        outer, pos = _read_varint(raw, 1)
        if pos + outer == len(raw) and raw[pos : pos + 1] == _CHUNK_DATA_TAG:
            size, start = _read_varint(raw, pos + 1)
            if start + size == len(raw):
                return memoryview(raw)[start:]
    try:
        frame = pb.Frame.FromString(raw)
    except DecodeError:
        return pb.Frame()
    return memoryview(frame.chunk.data) if frame.WhichOneof("kind") == "chunk" else frame
