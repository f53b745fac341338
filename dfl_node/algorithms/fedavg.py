"""Decentralized FedAvg and FedProx (003 App. A.3.1-A.3.2, Alg. 2): gather, average per architecture, scatter.

Each round one random aggregator and a random share of the fleet as senders (``senders``, 50 % in
003). Every participant trains locally (the aggregator too); the senders ship their models to the
aggregator, which averages each **cluster** of identical architectures with sample-count weights
(eq. 5) — its own model included in its cluster — keeps its cluster's average, and sends every
sender its cluster's average back (against poisoned members, ``aggregation`` takes the coordinate-wise
median or trimmed mean instead: :mod:`dfl_node.learning.robust`). FedProx adds the proximal term
μ/2‖w − w_start‖² to local training, each node treating its model before the update as the global
model (003 A.3.2). Local training uses CE, or 003's WSM (eq. 2) with ``supervision: wsm``, as 003
runs its baselines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext, sample_gather, senders_for
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import NodeProfile, RoundPlan, Step
from dfl_node.learning.algorithm_settings import FedAvgSettings, FedProxSettings
from dfl_node.learning.models import tensor_shapes
from dfl_node.learning.mutual import class_proportions, supervision
from dfl_node.learning.robust import aggregate_states
from dfl_node.learning.training import local_sgd


class FedAvg(Algorithm):
    settings_model = FedAvgSettings
    settings: FedAvgSettings
    name = "fedavg"
    architectures = "any"  # it receives any registry model, and averages each architecture on its own
    replies = True
    proximal_mu = 0.0
    tasks = None  # averaging knows no task (--supervision wsm, which weights classes, needs classification)

    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        group = sample_gather(self.config.seed, round_, [p.node_id for p in profiles], self.settings.senders)
        return RoundPlan(round_, (group,))

    def invitations(self, candidates: int) -> int:
        return senders_for(candidates + 1, self.settings.senders)

    def _train(self, ctx: NodeContext, step: Step) -> None:
        kind = self.config.supervision or "ce"  # 003 trains its baselines with WSM too (``supervision: wsm``)
        loss = (supervision(kind, class_proportions(ctx.train.y, ctx.train.num_classes)) if kind == "wsm"
                else ctx.task.loss)
        local_sgd(ctx.model, ctx.train, ctx.local_params(), ctx.local_generator(step.round), self.proximal_mu, loss,
                  ctx.privacy)

    def local_step(self, ctx: NodeContext, step: Step) -> None:
        self._train(ctx, step)

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        self._train(ctx, step)
        return ctx.message(step.round, f"{self.name}.model", parts_from_state(ctx.model.state_dict()))

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_purpose(message, f"{self.name}.model")
        self._check_model(ctx, message)

    def _check_model(self, ctx: NodeContext, message: ModelMessage) -> None:
        """A whole model of the architecture it names, built from our registry for our data (shapes only)."""
        try:
            layout = tensor_shapes(message.model, tuple(ctx.train.input_shape), ctx.train.num_classes)
        except ValueError as exc:
            raise AlgorithmError(f"{message.purpose} from {message.sender}: {exc}") from None
        carried = [(p.name, p.shape, p.is_whole) for p in message.parts]
        if carried != [(name, shape, True) for name, shape in layout]:
            raise AlgorithmError(f"{message.purpose} from {message.sender} is not a whole {message.model} model")

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:
            self.check_message(ctx, message)
        # views, not copies: the model is read here and only written once every average is computed
        own = ctx.message(step.round, f"{self.name}.model", parts_from_state(ctx.model.state_dict(), copy=False))
        members = sorted([own, *messages], key=lambda m: m.sender)  # the summation order of every driver
        averages = {}
        for model in dict.fromkeys(m.model for m in members):  # clusters, in order of first appearance
            cluster = [m for m in members if m.model == model]
            fused = aggregate_states([state_from_parts(m.parts) for m in cluster], [m.num_samples for m in cluster],
                                     self.settings.aggregation, self.settings.trim_fraction)
            averages[model] = parts_from_state(fused, copy=False)
        ctx.model.load_state_dict(state_from_parts(averages[own.model]))
        return {m.sender: ModelMessage(sender=ctx.node_id, round=step.round, purpose=f"{self.name}.average",
                                       num_samples=ctx.num_samples, parts=averages[m.model], model=m.model)
                for m in messages}

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        if reply is None:
            raise AlgorithmError(f"{self.name}'s sender needs its cluster's average back")
        self.check_purpose(reply, f"{self.name}.average")
        self._check_model(ctx, reply)
        if reply.model != str(ctx.spec):
            raise AlgorithmError(f"{self.name}: the average sent back is of {reply.model}, not of {ctx.spec}")
        ctx.model.load_state_dict(state_from_parts(reply.parts))


class FedProx(FedAvg):
    settings_model = FedProxSettings
    settings: FedProxSettings
    name = "fedprox"

    @property
    def proximal_mu(self) -> float:  # type: ignore[override]
        return self.settings.prox_mu
