"""What a scheduler is given of its node (:class:`SchedulerPort`), and what the node asks of its scheduler
(:class:`Scheduler`).

A scheduler decides *when* a round happens and *who* plays which role in it; the node's parts own its state and
play the roles. So a scheduler gets those parts it works with, each behind its own interface — the membership it
plans from, the progress it advances, the roles it hands out — and never the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from dfl_node.algorithms import Algorithm
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.exchange.roles import Roles
from dfl_node.node.membership.membership import Members
from dfl_node.peering.messages import Ack, Progress, Token
from dfl_node.peering.port import PeerNetwork
from dfl_node.settings.node import MembershipSettings, ScheduleSettings


@dataclass(frozen=True)
class SchedulerPort:
    node_id: str
    seed: int
    settings: ScheduleSettings
    membership: MembershipSettings  # the failure detector's timings, which a lost token's bounds are made of
    clock: Clock  # every wait and deadline of a scheduler reads it
    algorithm: Algorithm  # plans the rounds
    members: Members  # the fleet it plans from
    progress: RoundProgress  # where this node stands: advanced through its methods
    roles: Roles  # play (a role here), dispatch (a role for anyone), lead (async: volunteer)
    network: PeerNetwork  # passes and announces the token
    tally: Tally
    own_progress: Callable[[], Progress]  # where this node stands, as its Hello says it
    finish: Callable[[int], Awaitable[None]]  # settle, evaluate if need be, mark done, checkpoint
    stop_volunteering: Callable[[], Awaitable[None]]  # async mode: the time budget is over


class Scheduler(Protocol):
    finished: asyncio.Event  # set once this node's run is over

    async def run(self) -> None: ...
    def on_join(self, peer_id: str, restarted: bool) -> None: ...  # a peer (re)joined
    async def play(self, order: Assignment) -> Ack: ...  # a role a peer gives this node, played under this scheduler
    async def token(self, request: Token) -> Ack: ...  # the round token, or its announcement
