"""Roles a peer asks this node for, rather than a plan: serving our model to a pulling aggregator (a pull group's
source) and answering a selecting sender's probe (a candidate). Each is held, like any role, for as long as it takes,
through :class:`~dfl_node.node.exchange.roles.Roles`, which inherits them; they live apart from its group roles
because they need none of its aggregation or settling, only the role held, the model and the counters.
"""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol

from dfl_node.algorithms import Group, Role, Step
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.selection import Probe, ProbeAnswer, SelectsReceiver
from dfl_node.algorithms.step_guard import DIVERGED, NonFinite, guarded
from dfl_node.node.core.tally import Tally
from dfl_node.node.model.learner import Learner
from dfl_node.peering.errors import TransferRejected


class RoleHolder(Protocol):
    """What a requested role uses of the roles part that holds it (:class:`~dfl_node.node.exchange.roles.Roles`)."""

    node_id: str
    learner: Learner
    tally: Tally

    def take(self, role: Role) -> None: ...
    def release(self) -> None: ...
    async def exchanged(self, event: Literal["send", "fusion"], round_: int, peer: str) -> None: ...


class RequestedRoles:
    """The roles a peer asks for, as methods of the roles part that holds them (a :class:`RoleHolder`)."""

    async def serve_pull(self: RoleHolder, round_: int, aggregator: str, state: dict[str, str]) -> ModelMessage:
        """Serve our model to a pulling aggregator (a pull group's source), as the algorithm transmits it."""
        self.take(Role.SOURCE)
        try:
            await self.learner.checkpointed()  # what a transmit that goes non-finite is undone to
            await self.learner.settle_evaluation(round_)  # a pull may change the source's model (002 trains it)
            step = Step(round_, Group(aggregator, (self.node_id,), pull=True), state)
            ctx = self.learner.ctx
            try:
                message = await asyncio.to_thread(guarded(ctx, self.learner.algorithm.transmit), ctx, step)
            except NonFinite as exc:  # our training diverged: undone, and we have nothing finite to serve
                await self.learner.restore_durable()
                detail = f"round {round_ + 1}: training to serve left {exc}; undone"
                raise TransferRejected(DIVERGED, detail) from None
            self.tally.count("models_sent")
            await self.exchanged("send", round_ + 1, aggregator)
            return message
        finally:
            self.release()

    async def answer_probe(self: RoleHolder, probe: Probe) -> ProbeAnswer:
        """A candidate's answer to a selecting sender's probe (001), from our current model."""
        algorithm = self.learner.algorithm
        assert isinstance(algorithm, SelectsReceiver)
        self.take(Role.CANDIDATE)
        try:
            return await asyncio.to_thread(algorithm.answer, self.learner.ctx, probe)
        finally:
            self.release()
