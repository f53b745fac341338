"""FullAvg (000, Alg. 2): the receiver replaces its model by the sample-weighted average (eq. 9)."""

from __future__ import annotations

from dfl_node.algorithms.base import NodeContext
from dfl_node.algorithms.defkt import SendsTrainedModel
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.learning.fusion import weighted_average


class FullAvg(SendsTrainedModel):
    name = "fullavg"

    def receiver_step(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_purpose(message, "fullavg.model")
        fused = weighted_average(
            ctx.model.state_dict(), state_from_parts(message.parts), ctx.num_samples, message.num_samples
        )
        ctx.model.load_state_dict(fused)
        return None
