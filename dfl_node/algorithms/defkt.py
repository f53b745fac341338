"""Def-KT (000, Alg. 1): the sender trains and transmits its model; the receiver fuses it with its
own by mutual knowledge transfer and keeps the *received* model as its new local model."""

from __future__ import annotations

import copy

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext, generator_for
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.learning.fusion import mutual_knowledge_transfer


class SendsTrainedModel(Algorithm):
    """The sender side shared by Def-KT and FullAvg: train a copy, keep it if the variant says so, send it."""

    def sender_step(self, ctx: NodeContext, round_: int) -> ModelMessage:
        trained = ctx.trained_copy(round_)
        if self.sender_keeps_trained:
            ctx.model.load_state_dict(trained.state_dict())
        return ModelMessage(
            sender=ctx.node_id, round=round_, purpose=f"{self.name}.model",
            num_samples=ctx.num_samples, parts=parts_from_state(trained.state_dict()),
        )

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_purpose(message, f"{self.name}.model")
        if [(p.name, p.is_whole) for p in message.parts] != [(name, True) for name in ctx.model.state_dict()]:
            raise AlgorithmError(f"{message.purpose} from {message.sender} does not carry the whole model")


class DefKT(SendsTrainedModel):
    name = "defkt"

    def receiver_step(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_message(ctx, message)
        received = copy.deepcopy(ctx.model)
        received.load_state_dict(state_from_parts(message.parts))
        params = ctx.mkt_params()
        generator = generator_for(self.config.seed, message.round, ctx.node_id, "mkt")
        mutual_knowledge_transfer(received, ctx.model, ctx.train, params, params, generator)
        ctx.model.load_state_dict(received.state_dict())
        return None
