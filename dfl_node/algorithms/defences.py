"""The defences: what a receiver refuses, or bounds, in the messages of a group before it fuses them.

The round runner screens a group's messages once its aggregator has done its own local step and holds them all
(:func:`dfl_node.algorithms.runner.play_aggregator`), and a sender screens the reply it gets back: the models
compared with are then the ones the fusion will use, in the simulator and a daemon alike. Each defence is off
unless its setting is given (:class:`~dfl_node.learning.algorithm_settings.DefenceSettings`, the ``defences`` part of a
node's settings), so a fleet without them fuses exactly as before; each refusal is a :class:`Refusal`, counted by
its reason like every other.

* ``sample_cap`` (reason ``sample_count``): a claimed count above ``sample_cap`` times the receiver's own is
  cut to that; the message is still fused, with that weight. A node cannot verify a peer's count; it can refuse
  to let one claim outweigh everything else.
* ``norm_bound`` (``norm_bound``): a model or segment of the receiver's architecture farther from the receiver's
  own than ``norm_bound`` times the norm of the receiver's own is refused
  (:func:`~dfl_node.learning.robust.relative_distance`): sign-flipped, boosted or noisy models lie far away; an
  honest peer's, trained from the same start, near. Another architecture's model has no distance to ours.
* ``relative_gate`` (``relative_accuracy``): a whole model whose accuracy on the receiver's validation split is
  more than ``relative_gate`` below the receiver's own model's is refused. Knowledge transfer trains on what it
  receives rather than averaging it, so a model's distance says less than what it predicts on our data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from torch import nn

from dfl_node.algorithms.base import AlgorithmError, NodeContext
from dfl_node.algorithms.gather import GatherAlgorithm
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.learning.algorithm_settings import DefenceSettings
from dfl_node.learning.robust import capped_count, relative_distance
from dfl_node.learning.training import evaluate

REASONS = ("sample_count", "norm_bound", "relative_accuracy")  # what a defence's refusal is counted as


@dataclass(frozen=True)
class Refusal:
    """One message refused (or, for ``sample_count``, bounded) by a defence: whose, why, and the figures."""

    sender: str
    reason: str
    detail: str
    kept: bool = False  # fused all the same (a capped count), not dropped


def screen(ctx: NodeContext, messages: Sequence[ModelMessage],
           settings: DefenceSettings) -> tuple[list[ModelMessage], list[Refusal]]:
    """The messages ``ctx``'s node fuses (a capped count replaced) and the refusals, each message judged alone
    against the node's current model; in the order given."""
    kept: list[ModelMessage] = []
    refused: list[Refusal] = []
    own_accuracy: float | None = None
    for message in messages:
        if settings.norm_bound is not None and message.model == str(ctx.spec):  # another architecture: no distance
            distance = relative_distance(ctx.model.state_dict(), message.parts)
            if distance is not None and distance > settings.norm_bound:
                refused.append(Refusal(message.sender, "norm_bound", f"{message.purpose}: {distance:.3g} of our "
                                       f"model's norm away, over the bound {settings.norm_bound:g}"))
                continue
        if settings.relative_gate is not None and len(ctx.val) and carries_whole_model(ctx, message):
            if own_accuracy is None:
                own_accuracy = evaluate(ctx.model, ctx.val).score
            accuracy = evaluate(received_model(ctx, message), ctx.val).score
            if accuracy < own_accuracy - settings.relative_gate:
                refused.append(Refusal(message.sender, "relative_accuracy", f"{message.purpose}: {accuracy:.4f} on "
                                       f"our validation split, ours {own_accuracy:.4f}, margin "
                                       f"{settings.relative_gate:g}"))
                continue
        if settings.sample_cap is not None:
            bounded = capped_count(message.num_samples, ctx.num_samples, settings.sample_cap)
            if bounded != message.num_samples:
                refused.append(Refusal(message.sender, "sample_count", f"{message.purpose} claims "
                                       f"{message.num_samples} samples, counted as {bounded}", kept=True))
                message = replace(message, num_samples=bounded)
        kept.append(message)
    return kept, refused


def carries_whole_model(ctx: NodeContext, message: ModelMessage) -> bool:
    """Whether ``message`` holds every tensor, whole, of the registry model it names, for this node's data."""
    try:
        layout = GatherAlgorithm.layout(ctx, message.model)
    except AlgorithmError:
        return False
    return [(p.name, p.shape, p.is_whole) for p in message.parts] == [(n, s, True) for n, s in layout.items()]


def received_model(ctx: NodeContext, message: ModelMessage) -> nn.Module:
    """The whole model ``message`` carries, as a module: in the node's ``screen`` spare where it is of the node's
    own architecture, else built from our registry by the spec it names (checked already by ``check_message``)."""
    if message.model != str(ctx.spec):
        return GatherAlgorithm.build(ctx, message)
    model = ctx.spare("screen")
    model.load_state_dict(state_from_parts(message.parts))
    return model
