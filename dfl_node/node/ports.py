"""What a scheduler may see and do of its node: a narrow port instead of the whole :class:`Node`.

A scheduler decides *when* a round happens and *who* plays which role in it; the node owns its
state and plays the roles. Schedulers read the state, and change it only through these methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from dfl_node.algorithms import Algorithm, NodeProfile
from dfl_node.node.clock import Clock
from dfl_node.node.config import NodeConfig
from dfl_node.node.peers import PeerTable
from dfl_node.node.state import NodeState
from dfl_node.peering.messages import Ack, Progress, Token

if TYPE_CHECKING:
    from dfl_node.node.roles import Roles


class SchedulerPort(Protocol):
    config: NodeConfig
    algorithm: Algorithm
    peers: PeerTable
    clock: Clock  # every wait and deadline of a scheduler reads it

    @property
    def state(self) -> NodeState: ...  # read only: change it through the methods below
    @property
    def node_id(self) -> str: ...

    def profiles(self) -> list[NodeProfile]: ...  # this node and its live peers
    def address_of(self, node_id: str) -> str | None: ...  # gRPC address of a peer, or of this node
    def progress(self) -> Progress: ...  # where this node stands (what its HelloReply says)
    @property
    def roles(self) -> Roles: ...  # play (a role for this node), assign_to (for anyone), lead (async: volunteer)
    async def pass_token(self, node_id: str, token: Token) -> Ack | None: ...  # None: unreachable
    def enter_epoch(self, epoch: int) -> bool: ...  # fencing: False (and nothing changes) for an old epoch
    def set_round(self, round_: int, token_state: dict[str, str]) -> None: ...
    def set_holding(self, holding: bool) -> None: ...
    def count(self, counter: str, n: int = 1) -> None: ...  # one of the status counters
    async def finish(self, round_: int) -> None: ...  # settle, evaluate if need be, mark done, checkpoint
    async def stop_volunteering(self) -> None: ...  # async mode: the time budget is over
