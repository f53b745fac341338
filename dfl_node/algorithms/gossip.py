"""Pull gossip: the smallest complete algorithm, and README's example of writing one.

Each round, Q random nodes train on their own data, each *pulls* the current model of another
random node, and averages it into its own with sample-count weights (000 eq. 9). Nothing is
planned for the sources: a pull group's aggregator fetches their messages itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dfl_node.algorithms.base import Algorithm, NodeContext, sample_pairs
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import Group, NodeProfile, RoundPlan, Step
from dfl_node.learning.fusion import weighted_average_
from dfl_node.learning.training import local_sgd


class Gossip(Algorithm):
    name = "gossip"
    tasks = None  # averaging knows no task
    pulls = True  # the aggregator fetches its senders' models (gRPC Pull in the daemon)

    def plan_round(self, round_: int, profiles: Sequence[NodeProfile], state: Mapping[str, str]) -> RoundPlan:
        pairs = sample_pairs(self.config.seed, round_, [p.node_id for p in profiles], self.config.pairs)
        return RoundPlan(round_, tuple(Group(g.aggregator, g.senders, pull=True) for g in pairs))

    def local_step(self, ctx: NodeContext, step: Step) -> None:
        local_sgd(ctx.model, ctx.train, ctx.local_params(), ctx.local_generator(step.round), loss_fn=ctx.task.loss,
                  privacy=ctx.privacy)

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        return ctx.message(step.round, "gossip.model", parts_from_state(ctx.model.state_dict()))

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_whole(ctx, message, "gossip.model")

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:
            self.check_message(ctx, message)
            weighted_average_(ctx.model.state_dict(), state_from_parts(message.parts), ctx.num_samples,
                              message.num_samples)
        return {}
