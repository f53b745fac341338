"""FullAvg (000, Alg. 2): the receiver replaces its model by the sample-weighted average (eq. 9)."""

from __future__ import annotations

from collections.abc import Sequence

from dfl_node.algorithms.base import Algorithm, NodeContext
from dfl_node.algorithms.defkt import SendsTrainedModel
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.algorithms.plan import Step
from dfl_node.learning.fusion import weighted_average_


def average_by_samples(algorithm: Algorithm, ctx: NodeContext,
                       messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
    """Eq. 9 as an aggregate (FullAvg's, and pull gossip's): each message, checked by ``algorithm``, is averaged
    into ``ctx.model`` in turn with sample-count weights; no replies."""
    for message in messages:
        algorithm.check_message(ctx, message)
        # state_dict() tensors share the parameters' storage: the model is averaged in place
        weighted_average_(ctx.model.state_dict(), state_from_parts(message.parts), ctx.num_samples,
                          message.num_samples)
    return {}


class FullAvg(SendsTrainedModel):
    name = "fullavg"

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        return average_by_samples(self, ctx, messages)
