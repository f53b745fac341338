"""Combo (000, Alg. 3): a pair swaps complementary segments and each side averages what it gets.

With S segments (``segments``, 2 in the paper) the sender transmits the odd-numbered segments and
the receiver replies with the even-numbered ones, so the pair's traffic is exactly one model and
every element is averaged on exactly one side. For S = 2 this is the paper: the sender sends its
second segment, the receiver its first. Segments are cut by :func:`segment_ranges`.
"""

from __future__ import annotations

from dfl_node.algorithms.base import Algorithm, AlgorithmError, NodeContext
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.learning.fusion import average_parts_, expected_ranges, segment_parts


class Combo(Algorithm):
    name = "combo"
    replies = True

    @property
    def sender_segments(self) -> list[int]:
        return list(range(1, self.config.segments, 2))

    @property
    def receiver_segments(self) -> list[int]:
        return list(range(0, self.config.segments, 2))

    def _message(self, ctx: NodeContext, round_: int, purpose: str, indices: list[int]) -> ModelMessage:
        parts = segment_parts(ctx.model.state_dict(), indices, self.config.segments)
        return ModelMessage(
            sender=ctx.node_id, round=round_, purpose=purpose, num_samples=ctx.num_samples, parts=parts,
            metadata={"segments": ",".join(map(str, indices)), "segment_count": str(self.config.segments)},
        )

    def _check(self, ctx: NodeContext, message: ModelMessage, purpose: str, indices: list[int]) -> None:
        self.check_purpose(message, purpose)
        carried = [(p.name, p.start, p.start + p.values.numel()) for p in message.parts]
        if carried != expected_ranges(ctx.model.state_dict(), indices, self.config.segments):
            raise AlgorithmError(f"{message.purpose} from {message.sender} does not carry segments {indices}")

    def _average(self, ctx: NodeContext, message: ModelMessage) -> None:
        # in place: state_dict() tensors share the parameters' storage
        average_parts_(ctx.model.state_dict(), message.parts, ctx.num_samples, message.num_samples)

    def sender_step(self, ctx: NodeContext, round_: int) -> ModelMessage:
        # Alg. 3 always stores the trained (then partly averaged) model: ``sender_keeps_trained`` does not apply.
        ctx.model.load_state_dict(ctx.trained_copy(round_).state_dict())
        return self._message(ctx, round_, "combo.segment", self.sender_segments)

    def check_message(self, ctx: NodeContext, message: ModelMessage) -> None:
        self._check(ctx, message, "combo.segment", self.sender_segments)

    def receiver_step(self, ctx: NodeContext, message: ModelMessage) -> ModelMessage:
        self.check_message(ctx, message)
        reply = self._message(ctx, message.round, "combo.reply", self.receiver_segments)
        self._average(ctx, message)
        return reply

    def sender_finish(self, ctx: NodeContext, reply: ModelMessage | None) -> None:
        if reply is None:
            raise AlgorithmError("Combo's sender needs the receiver's segment back")
        self._check(ctx, reply, "combo.reply", self.receiver_segments)
        self._average(ctx, reply)
