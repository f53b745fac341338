"""What a node checks in a received model before it takes it, beyond the codec and the algorithm.

The network checks that the bytes are what the transfer's header says (over gRPC, its codec), and the
algorithm (``check_message``) that the message is something it can fuse. A well-formed model can
still be poison: NaN or ±Inf weights spread through any average or distillation and then sit in
every checkpoint. So every received model (pushed, pulled or sent back as a reply) must be finite,
and — where the operator sets ``--min-accuracy`` — a whole model of our own architecture must reach
that accuracy on this node's validation split. Both refusals are :class:`TransferRejected` with a
stable reason (``non_finite``, ``low_accuracy``), counted like every other rejection.
"""

from __future__ import annotations

import torch

from dfl_node.algorithms.base import NodeContext
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.learning.tensors import is_finite
from dfl_node.learning.training import evaluate
from dfl_node.peering.errors import TransferRejected


def check_finite(message: ModelMessage) -> None:
    """Refuse a message with any NaN or ±Inf value (``non_finite``); integer and bool tensors are always finite."""
    for part in message.parts:
        values = part.values
        if values.is_floating_point() and values.numel() and not is_finite(values):
            bad = int((~torch.isfinite(values)).sum())
            raise TransferRejected("non_finite", f"{message.sender}: {part.name!r} has {bad} NaN/Inf value(s)")


def is_whole_own_model(ctx: NodeContext, message: ModelMessage) -> bool:
    """Whether ``message`` carries every tensor of ``ctx``'s model, whole (the gate can evaluate only those)."""
    return message.model == str(ctx.spec) and (
        [(p.name, p.is_whole) for p in message.parts] == [(name, True) for name in ctx.model.state_dict()]
    )


def check_accuracy(ctx: NodeContext, message: ModelMessage, floor: float) -> float | None:
    """Refuse a whole model of our architecture whose accuracy on our validation split is below ``floor``
    (``low_accuracy``); returns that accuracy, or None where the gate does not apply (off, a segment, another
    architecture, no validation data). Runs on a spare model: the node's own is never touched."""
    if floor <= 0 or not len(ctx.val) or not is_whole_own_model(ctx, message):
        return None
    probe = ctx.spare("gate")
    probe.load_state_dict(state_from_parts(message.parts))
    accuracy = evaluate(probe, ctx.val).score
    if accuracy < floor:
        raise TransferRejected("low_accuracy", f"{message.sender}: {accuracy:.4f} on our validation split < {floor:g}")
    return accuracy


def check_received(ctx: NodeContext, message: ModelMessage, floor: float) -> None:
    """Every check of this module, cheapest first (call it off the event loop: it reads the whole model)."""
    check_finite(message)
    check_accuracy(ctx, message, floor)
