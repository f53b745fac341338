"""What a transfer's payload is, and what a receiver accepts of one: the wire format both of its ends share.

A transfer is one ``header`` frame (sender, swarm, version, fingerprint, a manifest of
:class:`TensorEntry` ranges with byte offsets, total size, the payload's digest and the hash it is under)
followed by ``chunk`` frames of at most :data:`CHUNK_SIZE` bytes. The payload is each part's elements as
raw little-endian bytes, back to back in manifest order, with no padding and **no pickle**: received bytes
only ever become tensors through ``torch.frombuffer`` with a dtype from :data:`ALLOWED_DTYPES` (or an
encoding of :mod:`dfl_node.peering.wire_dtypes`, decoded to such a dtype).

The digest is BLAKE3 where both ends offer it (:mod:`dfl_node.hashes`, exchanged in Hello and in a
pull's request), sha256 otherwise; a receiver refuses a hash it did not offer.

The sender's half is :mod:`dfl_node.net.encoder` (a message into a header and its bytes), the receiver's
:mod:`dfl_node.net.assembler` (frames back into a checked message); this module holds what both must agree
on (the dtypes that may travel, a manifest, the chunk size) and the :class:`Limits` a receiver sets. How
frames become bytes is :mod:`dfl_node.net.frames`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from dfl_node.peering.resume import CHUNK, chunk_size
from dfl_node.peering.wire_dtypes import ENCODINGS

if sys.byteorder != "little":  # the payload is the in-memory layout; every supported target is little-endian
    raise ImportError("dfl_node.net's transfer codec requires a little-endian host")

CHUNK_SIZE = CHUNK
ALLOWED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {dt: name for name, dt in ALLOWED_DTYPES.items()}
ENCODING_NAMES = {dt: name for name, dt in ENCODINGS.items()}


Manifest = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
Resolver = Callable[[str], tuple[str, Manifest]]  # another architecture's spec -> (its fingerprint, its manifest)


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts; everything is checked at the header, before allocation, except chunk sizes."""

    max_total_bytes: int = 512 << 20
    max_chunk_bytes: int = CHUNK_SIZE
    max_header_bytes: int = 1 << 20
    max_tensors: int = 4096

    @property
    def max_message_bytes(self) -> int:
        """A safe ``grpc.max_receive_message_length`` for a Transfer stream (largest frame plus framing)."""
        return max(self.max_chunk_bytes, self.max_header_bytes) + 1024


def manifest_of(state: Mapping[str, torch.Tensor]) -> Manifest:
    """The receiver-side manifest of a state dict: name -> (dtype, full shape)."""
    return {name: (t.dtype, tuple(t.shape)) for name, t in state.items()}


def numel(shape: tuple[int, ...]) -> int:
    """The elements of a tensor of ``shape``: what a part's range must fit, at either end."""
    n = 1
    for d in shape:
        n *= d
    return n


def chunk_for(asked: int) -> int:
    """The chunk size a stream uses for a receiver that asked for chunks of at most ``asked`` bytes (0: ours)."""
    return chunk_size(asked, CHUNK_SIZE)
