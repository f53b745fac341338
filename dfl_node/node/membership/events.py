"""What happens in the peer table, told to one listener (:class:`MembershipEvents`) as hashicorp/memberlist tells
its EventDelegate (NotifyJoin, NotifyLeave, NotifyUpdate): the table's owner acts on each
(:class:`~dfl_node.node.membership.membership.TableEvents`: SWIM's view, the node's rounds, the channels)."""

from __future__ import annotations

from typing import Protocol

from dfl_node.peering.messages import Hello


class MembershipEvents(Protocol):
    """What happened in a :class:`PeerTable`, told to its one listener as it happens — synchronously, the table
    already changed — so that the listener's own view (SWIM's, the rounds', the channels) keeps in step with it."""

    def joined(self, peer_id: str, restarted: bool) -> None:
        """``peer_id`` is alive: new, back after its silence, or a new boot of it (``restarted``); :meth:`seen`
        follows with the Hello that said so."""

    def seen(self, hello: Hello) -> None:
        """Every Hello (or gossiped state) that says a peer is alive, joined or not."""

    def lost(self, peer_id: str) -> None:
        """A confirmed peer stopped answering (or said goodbye)."""

    def forgotten(self, peer_id: str) -> None:
        """A peer left the table for good (silent for ``expiry``)."""

    def address_unused(self, address: str) -> None:
        """Nobody in the table uses ``address`` any more (a forgotten peer's, a pending one's that never
        answered): its channel can go."""


class NoEvents:
    """The listener of a table whose events nobody acts on (a table alone, in a test): each is dropped."""

    def joined(self, peer_id: str, restarted: bool) -> None:
        pass

    def seen(self, hello: Hello) -> None:
        pass

    def lost(self, peer_id: str) -> None:
        pass

    def forgotten(self, peer_id: str) -> None:
        pass

    def address_unused(self, address: str) -> None:
        pass


NO_EVENTS = NoEvents()
