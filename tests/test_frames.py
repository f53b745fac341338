"""dfl_node.net.frames: the hand-built chunk frames are exactly protobuf's encoding, and decoding
takes the fast path for them, protobuf for everything else, and never raises."""

from __future__ import annotations

import pytest

from dfl_node.net.frames import chunk_frame, decode_frame, encode_frame, wire_size
from dfl_node.net.proto import dfl_pb2 as pb


@pytest.mark.parametrize("size", [1, 127, 128, 16_383, 16_384, (1 << 20) - 7, 1 << 20])  # varint length edges
def test_chunk_frames_are_byte_identical_to_protobuf(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    pieces = [memoryview(data)[: size // 3], memoryview(data)[size // 3 :]]  # several pieces, one frame
    encoded = chunk_frame(pieces)
    assert encoded == pb.Frame(chunk=pb.Chunk(data=data)).SerializeToString()
    assert wire_size(encoded) == len(encoded) == pb.Frame(chunk=pb.Chunk(data=data)).ByteSize()


def test_chunk_payload_is_decoded_as_a_view_without_a_copy() -> None:
    raw = chunk_frame([b"payload bytes"])
    got = decode_frame(raw)
    assert isinstance(got, memoryview) and got.obj is raw and bytes(got) == b"payload bytes"


def test_other_encoders_chunks_still_decode_through_protobuf() -> None:
    unknown_field = bytes([15 << 3 | 2, 0])  # field 15, length-delimited, empty: not in our schema
    inner = pb.Chunk(data=b"abc").SerializeToString() + unknown_field
    raw = bytes([0x12, len(inner)]) + inner
    got = decode_frame(raw)
    assert isinstance(got, memoryview) and bytes(got) == b"abc"


def test_header_and_result_frames_decode_as_protobuf() -> None:
    header = pb.Frame(header=pb.TransferHeader(sender="n1", total_size=5, digest=b"\x01" * 32))
    result = pb.Frame(result=pb.TransferResult(accepted=False, reason="busy"))
    for frame in (header, result):
        assert encode_frame(frame) == frame.SerializeToString() and wire_size(frame) == frame.ByteSize()
        assert decode_frame(encode_frame(frame)) == frame


@pytest.mark.parametrize("raw", [b"\xff\xff\xff", b"\x12\x05\x0a", b"\x12\x80", b"\x0a\x03abc"])
def test_malformed_bytes_decode_to_an_empty_frame_not_an_exception(raw: bytes) -> None:
    got = decode_frame(raw)
    assert isinstance(got, pb.Frame) and got.WhichOneof("kind") is None
