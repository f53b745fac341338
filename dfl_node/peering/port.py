"""The peer network port, as protocols: a node's calls to its peers, and what it answers them.

A node reaches a peer through a :class:`PeerLink` from its :class:`PeerNetwork`, and serves its peers
as a :class:`PeerHandler`. Implementations: :mod:`dfl_node.net` over gRPC and mDNS (links:
:class:`~dfl_node.net.client.PeerClient` from :class:`~dfl_node.net.network.GrpcNetwork`; the handler
is called by :class:`~dfl_node.net.servicer.DflServicer`), and :mod:`dfl_node.sim.network` in memory. Who a
peer is, where the network authenticates its peers, is the network's to check (:meth:`PeerNetwork.confirm`):
the node sees only the verdict. Every method runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.peering.messages import (
    Ack,
    Assignment,
    DialBackRequest,
    Hello,
    HelloReply,
    Offer,
    Ping,
    PingAck,
    PullRequest,
    ReserveRequest,
    Token,
)
from dfl_node.peering.probes import ProbeReply, ProbeRequest
from dfl_node.peering.relays import RelayLoad, Reservation
from dfl_node.peering.resume import Resume


class PeerLink(Protocol):
    """One peer as this node reaches it. Every call raises :class:`~dfl_node.peering.errors.PeerUnreachable`
    when nothing answers in time; what else it raises is said for each."""

    # Raises PeerUnauthenticated when the peer does not prove who it is.
    async def hello(self, hello: Hello, timeout: float) -> HelloReply: ...
    async def assign(self, assignment: Assignment, timeout: float) -> Ack: ...
    async def pass_token(self, token: Token, timeout: float) -> Ack: ...
    async def probe(self, request: ProbeRequest, timeout: float) -> ProbeReply: ...
    # A membership probe (dfl_node.node.membership.swim).
    async def ping(self, ping: Ping, timeout: float) -> PingAck: ...
    # Ask the peer to dial us back at the address we say we serve: whether peers can reach us (ok).
    async def dial_back(self, request: DialBackRequest, timeout: float) -> Ack: ...
    # A control message (dfl_node.peering.control) and its reply, of the type its kind registered. Raises TypeError for
    # a message of no registered kind, TransferRefused when the peer refuses it (unknown_control: a peer that does
    # not know its kind; bad_control, control_too_large; or its handler's refusal).
    async def call(self, message: object, timeout: float) -> Any: ...
    # Push a model for round mode's ``epoch`` (0: async); returns (the aggregator's reply or None, bytes sent,
    # bytes received, over all of ``resume``'s attempts) once the aggregator confirmed a durable fusion; ``on_accepted``
    # is called as soon as it took the message. Raises TransferRefused when it refuses (or never fuses it), TransferCut
    # when the stream broke: called again with the same ``resume``, it goes on from what the aggregator holds.
    async def push(self, message: ModelMessage, epoch: int, *, timeout: float,
                   on_accepted: Callable[[], None] | None = None,
                   resume: Resume | None = None) -> tuple[ModelMessage | None, int, int]: ...
    # A source's model for a pull group; returns (message, bytes received over all of ``resume``'s attempts). Raises
    # TransferRefused, or TransferCut (called again with the same ``resume``, it goes on from what arrived).
    async def pull(self, request: PullRequest, *, timeout: float,
                   resume: Resume | None = None) -> tuple[ModelMessage, int]: ...
    async def close(self) -> None: ...


class PeerNetwork(Protocol):
    """Where a node's links to its peers come from: one per address, reused for every call."""

    @property
    def authentication(self) -> str: ...  # how it authenticates peers (/status): "mtls", "swarm-key", "none"

    def link(self, address: str) -> PeerLink: ...
    def forget(self, address: str) -> None: ...  # the node no longer talks to ``address``: its link may go
    # A peer whose Hello the network authenticated as ``node_id`` says it serves at ``address`` (or mDNS announced
    # it there): links to ``address`` may check that identity.
    def heard(self, address: str, node_id: str) -> None: ...
    # Whether the node that answered our Hello at ``address`` is the node ``reply`` names; raises
    # PeerUnauthenticated (which the node counts) for a peer caught answering as another. ``hello``: ours, should
    # the network need to ask again.
    async def confirm(self, address: str, reply: HelloReply, hello: Callable[[], Hello], timeout: float) -> bool: ...
    # A relay slot on the member at ``relay`` (its peers cannot dial this node); raises TransferRefused when the relay
    # refuses (no slot left, not a member), PeerUnreachable when it does not answer within ``timeout``.
    async def reserve(self, relay: str, request: ReserveRequest, timeout: float) -> Reservation: ...
    def relay_load(self) -> RelayLoad: ...  # what this node carries as a relay for others
    async def close(self) -> None: ...


class Intake(Protocol):
    """One admitted transfer: the node takes its message (or learns that it never came). One that resumes a cut
    transfer (``Offer.resume``) comes with what the node kept of it (``held``: what the network left with
    :meth:`interrupt`), or, where its message had arrived whole, with that message's confirmation (``arrived``:
    nothing is received, the future is awaited as :meth:`deliver`'s)."""

    held: object | None
    arrived: asyncio.Future[ModelMessage | None] | None

    # Checks the message for the algorithm (raise TransferRejected) and returns a future of the reply (None:
    # no reply), resolved once the fusion is durable, or failed with TransferRejected if it never happens.
    async def deliver(self, message: ModelMessage) -> asyncio.Future[ModelMessage | None] | None: ...
    def interrupt(self, held: object, detail: str) -> None: ...  # the stream ended before its payload: maybe a cut
    def abandon(self) -> None: ...  # the stream failed after admission


class PeerHandler(Protocol):
    """What a node answers its peers: the server side of every call of :class:`PeerLink`."""

    # A Hello; ``refused``: why the network's authentication refuses it (the node counts it and answers with
    # its identity); ``peer``: where it came from, for the log.
    def hello(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply: ...
    # Whether this pushed transfer is wanted (raise TransferRejected, e.g. "not_expected").
    async def admit(self, offer: Offer) -> Intake: ...
    async def pull(self, request: PullRequest) -> ModelMessage: ...  # raise TransferRejected (e.g. "busy")
    async def probe(self, request: ProbeRequest) -> ProbeReply: ...  # a selection probe (001); never raises
    async def assign(self, request: Assignment) -> Ack: ...
    async def ping(self, request: Ping) -> PingAck: ...  # a membership probe, its gossip; never raises
    async def dial_back(self, request: DialBackRequest) -> Ack: ...  # dial the caller back; ok: it answered
    async def reserve(self, request: ReserveRequest) -> Ack: ...  # whether the caller may hold a relay slot here
    async def token(self, request: Token) -> Ack: ...
    # A peer's control message (dfl_node.peering.control): its handler's reply, or TransferRejected (the network
    # counts it, as it counts a refused admit or pull). A message that needs its sender names it in a field.
    async def control(self, message: object) -> object: ...
    def on_rejected(self, reason: str, detail: str, sender: str) -> None: ...  # count a refusal
    def on_transferred(self, sent: int, received: int) -> None: ...  # byte counters
