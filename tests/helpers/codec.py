"""Transfers as the codec, wire and fuzz tests build them.

A fixed model state with every supported kind of tensor, messages carrying it,
the encoder and an assembler preset to one swarm and fingerprint, feeding a
whole frame list, and comparing decoded parts. Kept in one place so every file
builds transfers the same way.
"""

from __future__ import annotations

import torch

from dfl_node.algorithms.messages import ModelMessage, TensorPart, parts_from_state
from dfl_node.net.assembler import MessageAssembler
from dfl_node.net.encoder import prepare
from dfl_node.net.frames import ReadFrame, decode_frame, encode_frame
from dfl_node.net.manifest import manifest_of
from dfl_node.net.proto import dfl_pb2 as pb

SWARM, FP = "swarm-a", "fp-123"


def make_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "conv.weight": torch.randn(8, 3, 5, 5, generator=g),
        "conv.bias": torch.randn(8, generator=g),
        "bn.num_batches_tracked": torch.tensor(17, dtype=torch.int64),  # 0-d
        "half": torch.randn(3, 7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, generator=g).to(torch.float16),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i32": torch.arange(-3, 4, dtype=torch.int32),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "mask": torch.tensor([[True, False, True]]),
        "fc.weight": torch.randn(10, 33, generator=g),
    }


def make_msg(state: dict[str, torch.Tensor] | None = None, **kw) -> ModelMessage:
    fields = dict(sender="node-1", round=42, purpose="mkt", num_samples=600, metadata={"alpha": "0.5"})
    fields.update(kw)
    return ModelMessage(parts=parts_from_state(state if state is not None else make_state()), **fields)


def assembler(state: dict[str, torch.Tensor] | None = None, **kw) -> MessageAssembler:
    kw.setdefault("swarm", SWARM)
    kw.setdefault("fingerprint", FP)
    return MessageAssembler(manifest=manifest_of(state if state is not None else make_state()), **kw)


def frames_of(msg: ModelMessage, chunk_size: int | None = None, **kw) -> list[pb.Frame]:
    """The frames a sender writes for ``msg``, as protobuf reads them (editable, and proof that the
    hand-encoded chunk frames are valid protobuf)."""
    return [pb.Frame.FromString(raw) for raw in encoded_frames(msg, chunk_size, **kw)]


def read_frames_of(msg: ModelMessage, chunk_size: int | None = None, **kw) -> list[ReadFrame]:
    """The same frames as a node's server reads them: chunks through the fast decoder."""
    return [decode_frame(raw) for raw in encoded_frames(msg, chunk_size, **kw)]


def encoded_frames(msg: ModelMessage, chunk_size: int | None = None, **kw) -> list[bytes]:
    kw.setdefault("swarm", SWARM)
    kw.setdefault("fingerprint", FP)
    outgoing = prepare(msg, **kw)
    frames = outgoing.frames() if chunk_size is None else outgoing.frames(chunk_size)
    return [encode_frame(f) for f in frames]


def feed_all(asm: MessageAssembler, frames: list[ReadFrame]) -> tuple[pb.TransferHeader, ModelMessage]:
    for f in frames:
        asm.feed(f)
    return asm.finish()


def assert_same_parts(got: tuple[TensorPart, ...], want: tuple[TensorPart, ...]) -> None:
    """``got`` holds exactly ``want``'s parts: names, shapes, offsets, dtypes and values, flat."""
    assert [(p.name, p.shape, p.start) for p in got] == [(p.name, p.shape, p.start) for p in want]
    for g, w in zip(got, want):
        assert g.values.dtype == w.values.dtype and g.values.dim() == 1
        assert torch.equal(g.values, w.values), g.name
