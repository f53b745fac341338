"""What SWIM (:mod:`.swim`) knows of one member, and which of a peer's updates about one it takes: the record and
its checks, apart from the failure detector that reads and writes them, so that the protocol's module holds the
protocol alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dfl_node.peering.messages import MAX_ADDRESS, MAX_ID, Hello, MemberUpdate

ALIVE, SUSPECT, DEAD = "alive", "suspect", "dead"
RANK = {ALIVE: 0, SUSPECT: 1, DEAD: 2}  # at one incarnation, the worse news wins


def valid(update: MemberUpdate) -> bool:
    """Whether a peer's ``update`` is one we may take: a known state, ids and address of bounded length, an alive
    update carrying the Hello of the member it names (the rest of a Hello is bounded as a Hello RPC's is)."""
    if update.state not in RANK or not 0 < len(update.node_id) <= MAX_ID or len(update.sender) > MAX_ID:
        return False
    hello = update.hello
    return update.state != ALIVE or (hello.node_id == update.node_id and 0 < len(hello.grpc_address) <= MAX_ADDRESS)


def plain(hello: Hello) -> Hello:
    """``hello`` as a Hello, a HelloReply's extras dropped (a Hello as it is: it is frozen, and a thousand members
    sharing one object is what the simulator sizes once)."""
    return hello if type(hello) is Hello else Hello(**{k: getattr(hello, k) for k in Hello.__dataclass_fields__})


@dataclass
class Member:
    """What SWIM knows of one member (its address, profile and progress are the peer table's)."""

    incarnation: int = 0
    state: str = ALIVE
    hello: Hello | None = None  # its newest Hello, as it announced it (for a push-pull)
    suspected_at: float = 0.0
    suspecters: set[str] = field(default_factory=set)
    said: MemberUpdate | None = None  # what a push-pull says of it (kept while nothing changes)
    confirmed: bool = True  # our Hello confirmed this boot at its address (the peer table has it): usable
    died_at: float = 0.0  # when it was declared dead here (an unconfirmed one is forgotten ``peer_expiry`` later)

    def view(self, node_id: str, by: str) -> MemberUpdate:
        if (said := self.said) is None or said.state != self.state or said.incarnation != self.incarnation:
            said = self.said = MemberUpdate(state=self.state, incarnation=self.incarnation, node_id=node_id,
                                            sender=by, hello=self.hello if self.state == ALIVE and self.hello
                                            else Hello())
        return said
