"""Opt-in lossy models on the wire (``--wire-dtype``): what a swarm on slow links trades for fewer bytes.

``exact`` (the default) sends every tensor as the model holds it. ``float16`` narrows wider floating tensors
(float32, float64) to float16, saturating beyond float16's ±65504; ``int8`` sends each floating tensor as
int8 with one symmetric scale per tensor (``q = round(x / scale)``, ``scale = max|x| / 127``), a quarter of
float32's bytes. Integer and bool tensors always travel exactly, as does a tensor already as narrow as the
wire dtype. A receiver decodes back to its model's dtype.

Both networks apply the same two functions: over gRPC, :mod:`dfl_node.net.encoder` encodes a sender's
tensors into the payload and :mod:`dfl_node.net.assembler` decodes them on receipt, and the simulator hands
each message over as :func:`through` makes it, so a simulated fleet measures the accuracy a daemon fleet would
get. Every node of
a swarm must use the same setting: peers whose settings differ refuse each other at Hello.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from dfl_node.algorithms.messages import ModelMessage

EXACT = "exact"  # the default; the settings' names are dfl_node.settings.experiment.WireDtype

ENCODINGS: dict[str, torch.dtype] = {"float16": torch.float16, "int8": torch.int8}  # what a lossy setting sends
INT8_LEVELS = 127  # symmetric: -127..127, so that -x encodes as -q
_FLOAT16_MAX = torch.finfo(torch.float16).max


def encoding(dtype: torch.dtype, wire_dtype: str) -> torch.dtype | None:
    """The dtype a tensor of ``dtype`` travels as on a ``wire_dtype`` wire; None where it travels as it is."""
    narrow = ENCODINGS.get(wire_dtype)
    if narrow is None or not dtype.is_floating_point or dtype.itemsize <= narrow.itemsize:
        return None
    return narrow


def encode(values: torch.Tensor, wire_dtype: str) -> tuple[torch.Tensor, float]:
    """``values`` as they travel on a ``wire_dtype`` wire, and the int8 scale (0.0 for any other encoding);
    ``values`` themselves where they travel exactly. ``ValueError`` for non-finite values in int8 (no scale
    represents them; a receiver would refuse them anyway)."""
    narrow = encoding(values.dtype, wire_dtype)
    if narrow is None:
        return values, 0.0
    if narrow == torch.float16:
        return values.clamp(-_FLOAT16_MAX, _FLOAT16_MAX).to(torch.float16), 0.0
    peak = float(values.abs().max()) if values.numel() else 0.0
    if not math.isfinite(peak):
        raise ValueError("a tensor with NaN or ±Inf values cannot be sent as int8")
    scale = peak / INT8_LEVELS if peak > 0 else 1.0
    return torch.round(values / scale).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8), scale


def decode(wire_values: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Values of ``dtype`` from what :func:`encode` sent (a new tensor)."""
    if wire_values.dtype == torch.int8:
        return wire_values.to(dtype) * scale
    return wire_values.to(dtype)


def through(message: ModelMessage, wire_dtype: str) -> ModelMessage:
    """``message`` as its receiver decodes it from a ``wire_dtype`` wire (``message`` itself when exact): what
    the simulator's networks hand over, so that they lose what the gRPC codec loses."""
    if wire_dtype == EXACT:
        return message
    parts = []
    for part in message.parts:
        wire_values, scale = encode(part.values, wire_dtype)
        parts.append(part if wire_values is part.values else
                     replace(part, values=decode(wire_values, scale, part.values.dtype)))
    return replace(message, parts=tuple(parts))


def payload_bytes(message: ModelMessage, wire_dtype: str) -> int:
    """The bytes ``message``'s payload takes on a ``wire_dtype`` wire (the codec's ``total_size``)."""
    total = 0
    for part in message.parts:
        narrow = encoding(part.values.dtype, wire_dtype) or part.values.dtype
        total += part.values.numel() * narrow.itemsize
    return total
