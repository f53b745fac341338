"""Hello: whom this node talks to, and what it tells them about itself.

Whether a peer is compatible (protocol, swarm, algorithm, wire dtype, a model this node can build, data of our
shape and classes, the fingerprint our registry gives its model) is :mod:`.compatibility`; a peer refused, by
us or by itself, is kept visible in ``/status`` and logged once by :mod:`.refusals`. Hello also carries a
node's profile (architecture, sample count) for round plans, and catches a second live node with our id: while
a daemon starts, that stops the start; afterwards it is logged once per impostor and counted.

Where the network authenticates its peers (mutual TLS or a swarm key, wired by the process's composition root:
:mod:`dfl_node.service.wiring`), Hello is also where a peer proves who it is: a Hello whose sender fails
authentication is refused and counted, and a peer enters our table only from a reply that the network confirms
came from the node it names (:meth:`~dfl_node.peering.port.PeerNetwork.confirm`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dfl_node.node.core.tally import Tally
from dfl_node.node.membership.compatibility import REASONS, Verdict, check, their_refusal
from dfl_node.node.membership.peers import PeerTable
from dfl_node.node.membership.refusals import Refusals
from dfl_node.peering.errors import PeerUnauthenticated, PeerUnreachable
from dfl_node.peering.messages import Hello, HelloReply, Progress
from dfl_node.peering.port import PeerNetwork

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Acceptance:
    ours: Hello  # our Hello as it was
    reply: HelloReply  # our acceptance, made from it


class Handshake:
    """The Hellos of a node whose own is ``hello()``; ``fingerprint_of`` gives the fingerprint a model spec has
    here. Peers that pass enter ``table``; those refused are kept in ``refusals`` and counted in ``tally``."""

    def __init__(self, hello: Callable[[], Hello], fingerprint_of: Callable[[str], str], *, table: PeerTable,
                 refusals: Refusals, tally: Tally, network: PeerNetwork) -> None:
        self.message = hello
        self._fingerprint_of = fingerprint_of
        self._table, self._refusals, self._tally, self._network = table, refusals, tally, network
        self._starting = False  # while a daemon starts (:meth:`starting`): a duplicate id then stops it
        self.duplicate: str | None = None  # why start-up must stop: another live node has our id
        self._impostors: set[str] = set()  # boot ids of live nodes with our id, each reported once
        self._accepted: _Acceptance | None = None  # our last acceptance (:meth:`reply`)

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """While a daemon starts: a duplicate id is kept in :attr:`duplicate` (start-up stops on it) rather than
        logged."""
        self._starting = True
        try:
            yield
        finally:
            self._starting = False

    def reply(self, ours: Hello, accepted: bool, reason: str = "") -> HelloReply:
        """Our answer to a Hello: who we are (``ours``), and our verdict on the peer; where we accept it, our
        progress too. An acceptance is the same object while ``ours`` is (most Hellos are a peer's confirmation)."""
        if accepted and self._accepted is not None and self._accepted.ours is ours:
            return self._accepted.reply
        reply = HelloReply(**{**vars(ours), "progress": ours.progress if accepted else Progress()},
                           accepted=accepted, reason=reason)
        if accepted:
            self._accepted = _Acceptance(ours, reply)
        return reply

    def incompatibility(self, ours: Hello, other: Hello) -> Verdict | None:
        """Why we (``ours``) cannot learn with the sender of ``other`` (None: we can)."""
        return check(ours, other, self._fingerprint_of)

    def answer(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        """The Hello RPC: refuse an incompatible peer (counted, and kept in refusals), else record it as alive.
        ``refused``: why the network's authentication refuses it (a certificate of another node), refused and
        counted alike."""
        ours = self.message()
        if refused:
            self._tally.refused(refused)
            self._tally.warn(refused, "refused %s (%s) at hello: %s", request.node_id[:64], peer, refused)
            return self.reply(ours, False, refused)
        verdict = self.incompatibility(ours, request)
        if verdict:
            self._refused(verdict, request, request.grpc_address or peer)
            return self.reply(ours, False, verdict.reason)
        if self.is_duplicate(ours, request):
            self.on_duplicate(ours, request.boot_id, request.grpc_address or peer)
            return self.reply(ours, False, "duplicate_id")
        if not self._table.heard(request):  # still compatible: only our table has no room for a stranger
            self._tally.reject("peer_table_full", f"{request.node_id[:64]!r} at {peer}: too many unconfirmed peers",
                               request.node_id[:64])
        elif request.grpc_address:
            self._network.heard(request.grpc_address, request.node_id)  # it proved its id: where it says it serves
        return self.reply(ours, True)

    def _refused(self, verdict: Verdict, other: Hello, address: str) -> None:
        """We refuse ``other``'s sender: counted at every Hello, logged and listed once per peer and reason."""
        self._tally.refused(verdict.reason)
        self._refusals.record(other, address, verdict.reason, verdict.detail, by="us")

    async def probe(self, address: str, timeout: float) -> HelloReply | None:
        """Heartbeat: our Hello to ``address``, answered within ``timeout``; only compatible peers count as
        alive. Whether anything answered at all goes to the peer table, which shows static peers that do not
        (:meth:`PeerTable.unanswered`)."""
        ours = self.message()
        try:
            reply = await self._network.link(address).hello(ours, timeout=timeout)
        except PeerUnreachable as exc:
            self._table.unanswered(address, exc.detail)
            return None
        except PeerUnauthenticated as exc:  # TLS: its certificate failed our checks (or ours its)
            self._tally.reject(exc.reason, f"{address}: {exc.detail}", address)
            return None
        self._table.answered(address)
        if reply.node_id == ours.node_id:  # ourselves (our own address in a static list), or a duplicate
            if self.is_duplicate(ours, reply):
                self.on_duplicate(ours, reply.boot_id, address)
            return None
        if not reply.accepted:  # the peer counts its refusal of us; we keep it visible, and leave it out of the table
            if reply.reason in REASONS:
                detail = their_refusal(reply.reason, ours, reply)
                self._refusals.record(reply, address, reply.reason, detail, by="peer")
            else:
                log.debug("%s at %s refused us: %s", reply.node_id, address, reply.reason[:64])
            return None
        verdict = self.incompatibility(ours, reply)
        if verdict:
            self._refused(verdict, reply, address)
            return None
        try:
            if not await self._network.confirm(address, reply, self.message, timeout):
                return None  # the node that answered is not the node its reply names
        except PeerUnauthenticated as exc:  # caught answering as another node
            self._tally.reject(exc.reason, exc.detail, reply.node_id[:64])
            return None
        self._refusals.compatible(reply.node_id)
        return reply

    @staticmethod
    def is_duplicate(ours: Hello, other: Hello) -> bool:
        """Another live node of our swarm with our id: same id and swarm, another boot."""
        return other.node_id == ours.node_id and other.swarm == ours.swarm and other.boot_id != ours.boot_id

    def on_duplicate(self, ours: Hello, boot_id: str, address: str) -> None:
        """While a daemon starts, a duplicate id stops the start (:meth:`Membership.start_checks`); a running node
        keeps serving, but says so loudly, once per impostor, and counts it in ``rejected``."""
        problem = (f"node id {ours.node_id!r} is already used by another running node at {address}; "
                   "give every node its own --id")
        if self._starting:
            self.duplicate = self.duplicate or problem
            return
        if boot_id not in self._impostors:
            self._impostors.add(boot_id)
            self._tally.refused("duplicate_id")
            log.error("%s", problem)
