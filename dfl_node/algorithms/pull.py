"""The pull exchange (002, Alg. 1 lines 3–5): what pull gossip and FairAvg share, written once.

Each round, Q random nodes train on their own data and each *pulls* the current model of another random node
(000's pairs: :func:`~dfl_node.algorithms.base.sample_pairs`). Nothing is planned for the sources: a pull group's
aggregator fetches their messages itself, and they send the model they hold, untrained. A subclass says only how
the pulled model is fused (:meth:`~dfl_node.algorithms.base.Algorithm.aggregate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dfl_node.algorithms.base import Algorithm, NodeContext, sample_pairs
from dfl_node.algorithms.messages import ModelMessage, parts_from_state
from dfl_node.algorithms.plan import Group, NodeProfile, RoundPlan, Step
from dfl_node.learning.training import local_sgd


class PullPairs(Algorithm):
    """The pull exchange's plan and roles; a subclass gives its ``name`` (its messages' purpose is
    ``NAME.model``) and its fusion (``aggregate``)."""

    pulls = True  # the aggregator fetches its senders' models (gRPC Pull in the daemon)

    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        pairs = sample_pairs(self.config.seed, round_, [p.node_id for p in profiles], self.config.pairs)
        return RoundPlan(round_, tuple(Group(g.aggregator, g.senders, pull=True) for g in pairs))

    def local_step(self, ctx: NodeContext, step: Step) -> None:
        local_sgd(ctx.model, ctx.train, ctx.local_params(), ctx.local_generator(step.round), loss_fn=ctx.task.loss,
                  privacy=ctx.privacy)

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        return ctx.message(step.round, f"{self.name}.model", parts_from_state(ctx.model.state_dict()))

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_whole(ctx, message, f"{self.name}.model")
