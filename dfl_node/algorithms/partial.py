"""Decentralized partial training (003 App. A.3.3, Alg. 3): HeteroFL, FedRolex, Federated Dropout.

The fleet runs width-scaled models of one family (003's H1: ``cnn-ln:128,256`` at rates 2⁰ … 2⁻⁴,
:func:`~dfl_node.learning.models.scaled`). Each round a random aggregator and a random share of the
fleet as senders; every participant trains its own model locally with WSM (eq. 2) and the senders
ship it whole. The aggregator takes the largest participating model as the shape of W_g, gives
every participant's model index sets into it — eq. 8 (HeteroFL), eq. 9 (FedRolex, from the round's
offset t) or eq. 7 (Federated Dropout, drawn at the aggregator) — averages every element of W_g
over the models that hold it (eq. 6, d_n = 1/|P|), and hands each model its units back: its own,
and each sender's in the reply. (:mod:`dfl_node.learning.partial` holds the index math.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dfl_node.algorithms.base import AlgorithmError, NodeContext, generator_for
from dfl_node.algorithms.gather import GatherAlgorithm
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import Step
from dfl_node.learning.algorithm_settings import PartialSettings
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.partial import (
    aggregate_partial,
    dropout_indices,
    extract,
    fedrolex_indices,
    heterofl_indices,
    hidden_widths,
    tensor_indices,
    tensor_layers,
)


class PartialTraining(GatherAlgorithm):
    """Alg. 3's shared part; subclasses say how a sub-model's units are placed in W_g (:meth:`units`)."""

    settings_model = PartialSettings
    settings: PartialSettings

    def fuses(self, mine: str, theirs: str) -> bool:
        """Width-scaled models of one family: the same registry name and the same number of layers."""
        try:
            a, b = ModelSpec.parse(mine), ModelSpec.parse(theirs)
        except ValueError:
            return False
        return a.name == b.name and a.widths is not None and b.widths is not None and len(a.widths) == len(b.widths)

    def units(self, step: Step, aggregator: str, member: str, width: int, size: int, layer: int,
              largest: bool) -> torch.Tensor:
        """The units of W_g's ``layer`` (``width`` wide) that ``member``'s ``size`` units are."""
        raise NotImplementedError

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_model(ctx, message, f"{self.name}.model")

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:
            self.check_message(ctx, message)
        models = {m.sender: self.build(ctx, m) for m in messages}
        models[ctx.node_id] = ctx.model
        specs = {m.sender: m.model for m in messages} | {ctx.node_id: str(ctx.spec)}
        order = sorted(models)
        widths = {n: hidden_widths(models[n]) for n in order}
        top = min(order, key=lambda n: -sum(widths[n]))  # W_g's shape: the largest model (ties: the lowest id)
        if any(w > g for n in order for w, g in zip(widths[n], widths[top])):
            raise AlgorithmError(f"{self.name}: the participants are not sub-models of {specs[top]} "
                                 f"({', '.join(sorted(set(specs.values())))})")
        global_shapes = {name: tuple(t.shape) for name, t in models[top].state_dict().items()}
        indices = {}
        for n in order:
            units = [self.units(step, ctx.node_id, n, width, size, i, widths[n] == widths[top])
                     for i, (width, size) in enumerate(zip(widths[top], widths[n]))]
            indices[n] = tensor_indices(tensor_layers(models[n]), units, global_shapes)
        merged = aggregate_partial(global_shapes, [models[n].state_dict() for n in order], [indices[n] for n in order])
        for n in order:
            models[n].load_state_dict(extract(merged, indices[n]))
        return {m.sender: ModelMessage(sender=ctx.node_id, round=step.round, purpose=f"{self.name}.updated",
                                       num_samples=ctx.num_samples, model=m.model,
                                       parts=parts_from_state(models[m.sender].state_dict()))
                for m in messages}

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        if reply is None:
            raise AlgorithmError(f"a {self.name} sender needs its updated sub-model back")
        self.check_model(ctx, reply, f"{self.name}.updated")
        if reply.model != str(ctx.spec):
            raise AlgorithmError(f"{self.name}: the model sent back is a {reply.model}, not a {ctx.spec}")
        ctx.model.load_state_dict(state_from_parts(reply.parts))


class HeteroFL(PartialTraining):
    """Eq. 8: every sub-model is the first ⌊r_n J_i⌋ units of each layer."""

    name = "heterofl"

    def units(self, step: Step, aggregator: str, member: str, width: int, size: int, layer: int,
              largest: bool) -> torch.Tensor:
        return heterofl_indices(width, size)


class FedRolex(PartialTraining):
    """Eq. 9: a window rolling one unit per round; t travels from planner to planner in the plan's state."""

    name = "fedrolex"

    def next_state(self, round_: int, members: int, state: Mapping[str, str]) -> dict[str, str]:
        return {"fedrolex.t": str(round_)}

    def units(self, step: Step, aggregator: str, member: str, width: int, size: int, layer: int,
              largest: bool) -> torch.Tensor:
        if largest and not self.settings.fedrolex_roll_largest:
            return heterofl_indices(width, size)  # W_g is the largest model, in its own layout
        return fedrolex_indices(width, size, int(step.state.get("fedrolex.t", step.round)))


class FedDropout(PartialTraining):
    """Eq. 7: random units per participant and layer, drawn at the aggregator (seeded by round, aggregator, member)."""

    name = "feddropout"

    def units(self, step: Step, aggregator: str, member: str, width: int, size: int, layer: int,
              largest: bool) -> torch.Tensor:
        return dropout_indices(width, size, generator_for(self.config.seed, step.round, aggregator, member, layer,
                                                          "dropout"))
