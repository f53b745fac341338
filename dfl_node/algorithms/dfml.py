"""DFML (003 Alg. 1): decentralized federated mutual learning across heterogeneous architectures.

Each round a random aggregator and a random share of the fleet as senders. Every participant trains
its (regular) model on its own data with WSM (eq. 2); the senders ship their models — any registry
architecture — to the aggregator, which builds each from its registry and runs K passes
(``dfml_epochs``) of weighted mutual learning over its own data with α^(t) (eqs. 1, 3); each sender
gets its updated model back with α^(t). Every participant then keeps W_n^+ as its regular model
and, if the peak rule says so, copies it into its **peak model** and sets α_n ← α^(t)
(:func:`~dfl_node.learning.mutual.updates_peak`). A node's reported accuracy is its peak model's
(003 §4.1); the regular model's is reported beside it.

α^(t) follows the cyclic schedule of eq. 4 / A.2 (:mod:`dfl_node.learning.mutual`). The planner —
the simulator, or the round token's holder — computes it from the cycle state the last plan handed
on (the round the cycle began and its period), and hands on the next; the plan's state reaches the
aggregator with its role. In async mode, where no plan travels, α comes from the round counter alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from dfl_node.algorithms.base import AlgorithmError, NodeContext, generator_for, senders_for
from dfl_node.algorithms.gather import GatherAlgorithm
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import Step
from dfl_node.learning.algorithm_settings import DFMLSettings
from dfl_node.learning.models import ModelSpec
from dfl_node.learning.mutual import (
    CycleState,
    alpha_at,
    cyclic_alpha,
    peak_threshold,
    peak_updates,
    updates_peak,
    weighted_mutual_learning,
)
from dfl_node.learning.training import SgdParams

STATE = "dfml"  # prefix of this algorithm's keys in a plan's state


class DFML(GatherAlgorithm):
    settings_model = DFMLSettings
    settings: DFMLSettings
    name = "dfml"

    def auxiliary_models(self, spec: ModelSpec) -> dict[str, ModelSpec]:
        return {"peak": spec}

    def reported_models(self, ctx: NodeContext) -> dict[str, nn.Module]:
        return {"peak": ctx.auxiliary["peak"], "regular": ctx.model}

    def fusion_epochs(self) -> int:
        return self.settings.dfml_epochs

    # ----- the α schedule ------------------------------------------------------------------
    def next_state(self, round_: int, members: int, state: Mapping[str, str]) -> dict[str, str]:
        """α^(t) and the peak threshold for round t, and the cycle state round t + 1 starts from."""
        s = self.settings
        cycle = CycleState.decode(state, STATE, s.alpha_period).at(round_, s.alpha_period_growth)
        alpha = cyclic_alpha(round_ - cycle.start, cycle.period, s.alpha_min, s.alpha_max)
        updates = s.peak_updates or peak_updates(members, senders_for(members, s.senders))
        threshold = peak_threshold(cycle, updates, s.alpha_min, s.alpha_max)
        return {**cycle.encode(STATE), f"{STATE}.alpha": repr(alpha), f"{STATE}.peak_alpha": repr(threshold)}

    def alpha(self, step: Step) -> tuple[float, float]:
        """(α^(t), the peak threshold) of ``step``: from its plan, or in async mode from the round alone."""
        s = self.settings
        if f"{STATE}.alpha" in step.state:
            return float(step.state[f"{STATE}.alpha"]), float(step.state[f"{STATE}.peak_alpha"])
        cycle = CycleState(0, s.alpha_period).at(step.round, s.alpha_period_growth)
        alpha = alpha_at(step.round, s.alpha_period, s.alpha_period_growth, s.alpha_min, s.alpha_max)
        return alpha, peak_threshold(cycle, s.peak_updates or 1, s.alpha_min, s.alpha_max)

    # ----- the roles -----------------------------------------------------------------------
    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_model(ctx, message, "dfml.model")

    def mutual_params(self, ctx: NodeContext) -> SgdParams:
        """Weighted mutual learning's SGD: the MKT settings (``mkt_lr``, ``mkt_batch_size``), K passes."""
        params = ctx.mkt_params()
        return SgdParams(lr=params.lr, momentum=params.momentum, batch_size=params.batch_size,
                         epochs=self.settings.dfml_epochs)

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:
            self.check_message(ctx, message)
        alpha, threshold = self.alpha(step)
        models = {m.sender: self.build(ctx, m) for m in messages}
        models[ctx.node_id] = ctx.model
        order = sorted(models)  # the participants in id order: every driver sums and steps alike
        generator = generator_for(self.config.seed, step.round, ctx.node_id, "dfml")
        weighted_mutual_learning([models[n] for n in order], ctx.train, self.mutual_params(ctx), alpha, generator,
                                 self.supervise(ctx), self.distance(ctx), ctx.privacy)  # refused: models as they came
        self._keep(ctx, alpha, threshold)
        extra = {"alpha": repr(alpha), "peak_alpha": repr(threshold)}
        return {m.sender: ModelMessage(sender=ctx.node_id, round=step.round, purpose="dfml.updated",
                                       num_samples=ctx.num_samples, model=m.model, metadata=extra,
                                       parts=parts_from_state(models[m.sender].state_dict()))
                for m in messages}

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        if reply is None:
            raise AlgorithmError("a DFML sender needs its updated model back")
        self.check_model(ctx, reply, "dfml.updated")
        if reply.model != str(ctx.spec):
            raise AlgorithmError(f"dfml: the model sent back is a {reply.model}, not a {ctx.spec}")
        try:
            alpha, threshold = float(reply.metadata["alpha"]), float(reply.metadata["peak_alpha"])
        except (KeyError, ValueError):
            raise AlgorithmError("dfml: the updated model came without its α") from None
        ctx.model.load_state_dict(state_from_parts(reply.parts))
        self._keep(ctx, alpha, threshold)

    @staticmethod
    def _keep(ctx: NodeContext, alpha: float, threshold: float) -> None:
        """Alg. 1's client side after W_n ← W_n^+: the peak model and α_n, if the peak rule says so."""
        if updates_peak(alpha, ctx.scalars.get("alpha_n", 0.0), threshold):
            ctx.auxiliary["peak"].load_state_dict(ctx.model.state_dict())
            ctx.scalars["alpha_n"] = alpha
