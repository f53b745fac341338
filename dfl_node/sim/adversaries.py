"""The simulator's adversaries: compromised members running the same node code, each attack applied where a
compromised device would apply it.

* **What leaves the node** (sign-flip, scale, noise, false-count, free-rider): a compromised node runs its
  algorithm through :class:`Compromised`, which changes every model as it leaves — a sender's or pulled source's
  (``transmit``) and an aggregator's replies (``aggregate``) — so the network and its peers see the poisoned
  model, while its own training and fusion run as on any node.
* **What it trains on** (label-flip): its own shard's labels are flipped before it starts
  (:func:`poisoned_fleet`); the node code is untouched.

Which nodes are compromised is drawn from the seed (:func:`adversary_nodes`): one random order of the fleet, each
``adversaries:`` entry taking the next nodes of it, so 10 % of a fleet are among its 20 %. Results report the
honest nodes apart (:class:`~dfl_node.results.RunResult`'s ``honest_*``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from dfl_node.algorithms import Algorithm, NodeContext, make_algorithm
from dfl_node.algorithms.base import derive_seed, generator_for
from dfl_node.algorithms.messages import ModelMessage, TensorPart
from dfl_node.algorithms.plan import Step
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.learning.attacks import flipped_labels, noisy, scaled, sign_flipped
from dfl_node.learning.provision import ClientData, FleetData, fleet_ids
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.simulation import Adversaries, adversary_counts

Flat = dict[str, torch.Tensor]  # tensor name → its flattened values


def adversary_nodes(config: ExperimentConfig) -> dict[str, Adversaries]:
    """The compromised nodes of ``config``'s fleet and the attack each plays, by node id (seeded)."""
    ids = fleet_ids(config.nodes)
    order = random.Random(derive_seed(config.learning.seed, "adversaries")).sample(ids, len(ids))
    chosen: dict[str, Adversaries] = {}
    adversaries = config.simulation.adversaries
    for adversary, count in zip(adversaries, adversary_counts(adversaries, config.nodes)):
        chosen.update({node_id: adversary for node_id in order[len(chosen) : len(chosen) + count]})
    return dict(sorted(chosen.items()))


def poisoned_fleet(data: FleetData, adversaries: Mapping[str, Adversaries]) -> FleetData:
    """``data`` with the label-flipping nodes' train and validation labels flipped (their own data, mislabelled)."""
    flipping = {node_id for node_id, a in adversaries.items() if a.kind == "label-flip"}
    if not flipping:
        return data
    return replace(data, clients=[ClientData(c.node_id, flipped_labels(c.train), flipped_labels(c.val))
                                  if c.node_id in flipping else c for c in data.clients])


def compromised_algorithm(name: str, config: SharedSettings, options: AlgorithmOptions | None,
                          adversary: Adversaries) -> Algorithm | None:
    """What a compromised node runs in place of algorithm ``name`` (with ``options``, as
    :func:`~dfl_node.algorithms.make_algorithm` takes them): the algorithm's own class with :class:`Compromised` in
    front, so it is still that algorithm to every check (``isinstance``, its name, its settings); None for an attack
    on the node's data, which runs the algorithm as it is."""
    if adversary.kind == "label-flip":
        return None
    real = make_algorithm(name, config, options)
    algorithm: Compromised = type(f"Compromised{type(real).__name__}", (Compromised, type(real)), {})(
        real.config, real.settings)
    algorithm.adversary = adversary
    return algorithm


class Compromised(Algorithm):
    """The roles of an algorithm with an attack on every model that leaves the node. A mixin: put before the real
    algorithm's class (:func:`compromised_algorithm`); one instance per node, as the free rider remembers."""

    adversary: Adversaries
    _received: Flat | None = None  # free-rider: the last values received, over the model it started from

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        before = _flat(ctx)  # the model before this role trains it: what scale boosts the change from
        return self._poisoned(ctx, super().transmit(ctx, step), before, step.round)  # type: ignore[safe-super]

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        self._remember(ctx, messages)
        before = _flat(ctx)
        replies = super().aggregate(ctx, step, messages)  # type: ignore[safe-super]
        return {sender: self._poisoned(ctx, reply, before, step.round) for sender, reply in replies.items()}

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        if reply is not None:
            self._remember(ctx, [reply])
        super().finish(ctx, step, reply)

    def _remember(self, ctx: NodeContext, messages: Sequence[ModelMessage]) -> None:
        """Free-rider: keep what peers sent, where it fits this node's model (another architecture's does not)."""
        if self.adversary.kind != "free-rider":
            return
        if self._received is None:
            self._received = _flat(ctx)
        for message in messages:
            for part in message.parts:
                held = _range(self._received, part)
                if held is not None:
                    held.copy_(part.values)

    def _poisoned(self, ctx: NodeContext, message: ModelMessage, before: Flat, round_: int) -> ModelMessage:
        """``message`` as the compromised node sends it."""
        kind, size = self.adversary.kind, self.adversary.size
        if kind == "false-count":
            return replace(message, num_samples=int(size))
        if kind == "free-rider" and self._received is None:
            self._received = before  # nothing received yet: the model it had before it trained
        generator = generator_for(self.config.seed, round_, ctx.node_id, "attack", message.purpose, message.sender)

        def attacked(part: TensorPart) -> torch.Tensor:
            values, reference = part.values, _range(before, part)
            if kind == "sign-flip":
                return sign_flipped(values, size)
            if kind == "scale":
                return scaled(values, reference if reference is not None else torch.zeros_like(values), size)
            if kind == "noise":
                return noisy(values, size, generator)
            held = _range(self._received or {}, part)  # free-rider
            return held.clone() if held is not None else values

        parts = tuple(replace(p, values=attacked(p)) if p.values.is_floating_point() else p for p in message.parts)
        return replace(message, parts=parts)


def _flat(ctx: NodeContext) -> Flat:
    """A copy of the node's model, each tensor flattened."""
    return {name: t.detach().reshape(-1).clone() for name, t in ctx.model.state_dict().items()}


def _range(flat: Flat, part: TensorPart) -> torch.Tensor | None:
    """The values of ``flat`` that ``part`` carries (a view), or None where it does not fit (another architecture)."""
    values = flat.get(part.name)
    if values is None or values.numel() != math.prod(part.shape):
        return None
    return values[part.start : part.start + part.values.numel()]
