"""FullAvg (000, Alg. 2): the receiver replaces its model by the sample-weighted average (eq. 9)."""

from __future__ import annotations

from dfl_node.algorithms.base import Algorithm, NodeContext
from dfl_node.algorithms.defkt import send_trained_model
from dfl_node.algorithms.messages import ModelMessage, state_from_parts
from dfl_node.learning.fusion import weighted_average


class FullAvg(Algorithm):
    name = "fullavg"

    def sender_step(self, ctx: NodeContext, round_: int) -> ModelMessage:
        return send_trained_model(self, ctx, round_)

    def receiver_step(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_purpose(message, "fullavg.model")
        fused = weighted_average(
            ctx.model.state_dict(), state_from_parts(message.parts), ctx.num_samples, message.num_samples
        )
        ctx.model.load_state_dict(fused)
        return None
