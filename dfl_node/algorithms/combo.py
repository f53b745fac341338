"""Combo (000, Alg. 3): a pair swaps complementary segments and each side averages what it gets.

With S segments (``segments``, 2 in the paper) the sender transmits the odd-numbered segments and
the receiver replies with the even-numbered ones, so the pair's traffic is exactly one model and
every element is averaged on exactly one side. For S = 2 this is the paper: the sender sends its
second segment, the receiver its first. Segments are cut by :func:`segment_ranges`.
"""

from __future__ import annotations

from collections.abc import Sequence

from dfl_node.algorithms.base import AlgorithmError, NodeContext, PairAlgorithm
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step
from dfl_node.learning.algorithm_settings import ComboSettings
from dfl_node.learning.fusion import average_parts_, expected_ranges, segment_parts
from dfl_node.learning.training import local_sgd


class Combo(PairAlgorithm):
    settings_model = ComboSettings
    settings: ComboSettings
    name = "combo"
    replies = True
    tasks = None  # segment averaging knows no task

    @property
    def sender_segments(self) -> list[int]:
        return list(range(1, self.settings.segments, 2))

    @property
    def receiver_segments(self) -> list[int]:
        return list(range(0, self.settings.segments, 2))

    def _message(self, ctx: NodeContext, round_: int, purpose: str, indices: list[int]) -> ModelMessage:
        parts = segment_parts(ctx.model.state_dict(), indices, self.settings.segments)
        return ctx.message(round_, purpose, parts, segments=",".join(map(str, indices)),
                           segment_count=str(self.settings.segments))

    def _check(self, ctx: NodeContext, message: ModelMessage, purpose: str, indices: list[int]) -> None:
        self.check_purpose(message, purpose)
        if message.model != str(ctx.spec):
            raise AlgorithmError(f"{message.purpose} from {message.sender} is from a {message.model} model, "
                                 f"not {ctx.spec}")
        carried = [(p.name, p.start, p.start + p.values.numel()) for p in message.parts]
        if carried != expected_ranges(ctx.model.state_dict(), indices, self.settings.segments):
            raise AlgorithmError(f"{message.purpose} from {message.sender} does not carry segments {indices}")

    def _average(self, ctx: NodeContext, message: ModelMessage) -> None:
        # in place: state_dict() tensors share the parameters' storage
        average_parts_(ctx.model.state_dict(), message.parts, ctx.num_samples, message.num_samples)

    def transmit(self, ctx: NodeContext, step: Step) -> ModelMessage:
        # Alg. 3 always stores the trained (then partly averaged) model: ``sender_keeps_trained`` does not apply.
        local_sgd(ctx.model, ctx.train, ctx.local_params(), ctx.local_generator(step.round),  # in place: no copy
                  loss_fn=ctx.task.loss, privacy=ctx.privacy)
        return self._message(ctx, step.round, "combo.segment", self.sender_segments)

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self._check(ctx, message, "combo.segment", self.sender_segments)

    def aggregate(self, ctx: NodeContext, step: Step, messages: Sequence[ModelMessage]) -> dict[str, ModelMessage]:
        replies = {}
        for message in messages:  # one per group in 000
            self.check_message(ctx, message)
            replies[message.sender] = self._message(ctx, message.round, "combo.reply", self.receiver_segments)
            self._average(ctx, message)
        return replies

    def finish(self, ctx: NodeContext, step: Step, reply: ModelMessage | None) -> None:
        if reply is None:
            raise AlgorithmError("Combo's sender needs the receiver's segment back")
        self._check(ctx, reply, "combo.reply", self.receiver_segments)
        self._average(ctx, reply)
