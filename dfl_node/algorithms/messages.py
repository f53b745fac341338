"""What algorithms send each other: models or model pieces, as plain tensors plus metadata.

A message is transport-agnostic: the simulator hands it over in memory, the daemon streams it
through ``dfl_node.net.encoder`` and ``dfl_node.net.assembler``. Every payload is a list of
:class:`TensorPart` — a contiguous range of one tensor's flattened elements — so a full model, a Combo
segment of the flattened parameter vector, or a width slice all travel in the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from dfl_node.learning.tensors import StateDict, TensorPart, parts_from_state, state_from_parts

__all__ = ["ModelMessage", "StateDict", "TensorPart", "on_device", "parts_from_state", "state_from_parts"]


@dataclass(frozen=True)
class ModelMessage:
    """One transfer between two nodes: a model (or part of one) and what the receiver needs to fuse it."""

    sender: str
    round: int
    purpose: str
    num_samples: int
    parts: tuple[TensorPart, ...]
    model: str = ""  # the sender's architecture as a registry spec (ModelSpec), e.g. "cnn-ln:32,64"
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Payload size in bytes, the figure the simulator and the daemon both count as traffic."""
        return sum(p.values.numel() * p.values.element_size() for p in self.parts)


def on_device(message: ModelMessage, device: torch.device | str) -> ModelMessage:
    """``message`` with its tensors on ``device``; the message itself where they are there already. The
    daemon sends and checkpoints from the CPU and fuses on its node's device (:mod:`dfl_node.learning.devices`)."""
    parts = tuple(p if (values := p.values.to(device)) is p.values else replace(p, values=values)
                  for p in message.parts)
    return message if all(a is b for a, b in zip(parts, message.parts)) else replace(message, parts=parts)
