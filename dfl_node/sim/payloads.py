"""What a model costs and looks like after crossing the simulator's fabric: its bytes on a daemon's wire (payload
plus a header estimate), the hash that names it where a link can cut a transfer, and the copy a receiver gets.

Split from the fabric (:mod:`dfl_node.sim.network`) because every part of it counts bytes the same way: the links
that carry models (:mod:`dfl_node.sim.endpoints`) and the tests that check those counts against the codec's.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.peering.wire_dtypes import EXACT, payload_bytes, through

# What a transfer's header adds to its payload on the wire (sender, swarm, fingerprint, sha256…, and a manifest
# entry per tensor part): an estimate, so that the simulator's byte counts stay close to a daemon's.
HEADER_BYTES = 160
PART_HEADER_BYTES = 48


def wire_size(message: ModelMessage, wire_dtype: str = EXACT) -> int:
    """The bytes ``message`` would take on a ``wire_dtype`` wire: its payload plus an estimate of its header."""
    return payload_bytes(message, wire_dtype) + HEADER_BYTES + PART_HEADER_BYTES * len(message.parts)


def payload_key(message: ModelMessage) -> bytes:
    """What identifies a message's payload, as its digest does over gRPC: a hash of its parts' values (computed only
    where a link may cut a transfer, which a resumed one must name)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in message.parts:
        digest.update(part.name.encode())
        digest.update(part.values.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
    return digest.digest()


def whole_chunks(nbytes: int, chunk: int, most: int) -> int:
    """The bytes of whole chunks among ``nbytes`` that crossed (a gRPC message arrives whole or not at all)."""
    return min(most, nbytes // chunk * chunk)


def copied(message: ModelMessage, wire_dtype: str = EXACT) -> ModelMessage:
    """``message`` with tensors of its own, as a receiver over gRPC has them (no serialization, one copy), and
    decoded as the codec decodes a lossy ``wire_dtype``."""
    crossed = through(message, wire_dtype)
    return replace(crossed, parts=tuple(replace(p, values=p.values.detach().clone()) for p in crossed.parts),
                   metadata=dict(message.metadata))
