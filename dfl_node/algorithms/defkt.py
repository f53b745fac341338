"""Def-KT (000, Alg. 1): the sender trains and transmits its model; the receiver fuses it with its
own by mutual knowledge transfer and keeps the *received* model as its new local model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from dfl_node.algorithms.base import NodeContext, PairAlgorithm, generator_for
from dfl_node.algorithms.messages import ModelMessage, parts_from_state, state_from_parts
from dfl_node.algorithms.plan import Step
from dfl_node.learning.fusion import mutual_knowledge_transfer


class SendsTrainedModel(PairAlgorithm):
    """The sender side shared by Def-KT and FullAvg: train a copy, keep it if the variant says so, send it."""

    sender_keeps_trained_default: ClassVar[bool] = False
    tasks: ClassVar[frozenset[str] | None] = None  # MKT distils with the task's distance; averaging knows no task

    @property
    def sender_keeps_trained(self) -> bool:
        keep = self.config.sender_keeps_trained
        return self.sender_keeps_trained_default if keep is None else keep

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        trained = ctx.trained_copy(step.round)
        if self.sender_keeps_trained:
            ctx.model.load_state_dict(trained.state_dict())
        return ctx.message(step.round, f"{self.name}.model", parts_from_state(trained.state_dict()))

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self.check_whole(ctx, message, f"{self.name}.model")


class DefKT(SendsTrainedModel):
    name = "defkt"

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        for message in messages:  # one per group in 000; several are fused one after another, in sender order
            self.check_message(ctx, message)
            received = ctx.spare("received")
            received.load_state_dict(state_from_parts(message.parts))
            params = ctx.mkt_params()
            generator = generator_for(self.config.seed, message.round, ctx.node_id, "mkt")
            if mutual_knowledge_transfer(received, ctx.model, ctx.train, params, params, generator,
                                         ctx.task.mutual_losses, ctx.privacy):
                ctx.model.load_state_dict(received.state_dict())  # else its privacy budget is spent: no fusion
        return {}
