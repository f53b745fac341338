"""A node's links to its peers over gRPC (the :class:`~dfl_node.peering.port.PeerNetwork` of a daemon):
one :class:`~dfl_node.net.client.PeerClient` per address, reused for every call, closed once the
peer table forgets the address, so file descriptors and memory stay bounded.

Who a peer is, is checked here, where the credentials are: with TLS (mutual TLS, or a swarm key's) a link checks
the certificate of the node we know serves at its address (learnt from a Hello that proved it, or from mDNS:
:meth:`GrpcNetwork.heard`), and a reply that names another node is confirmed on a link that checks that node's
(:meth:`GrpcNetwork.confirm`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable

import grpc

from dfl_node.net.auth import Security
from dfl_node.net.client import PeerClient
from dfl_node.net.convert import to_wire
from dfl_node.net.pacing import NO_PACING, Pacing
from dfl_node.net.relay import RelayServer, Tunnels
from dfl_node.net.wire import WireIdentity
from dfl_node.peering.errors import PeerUnauthenticated, PeerUnreachable, TransferRefused
from dfl_node.peering.messages import Hello, HelloReply, ReserveRequest
from dfl_node.peering.relays import RelayLoad


class GrpcReservation:
    """A relay slot this node holds (:class:`~dfl_node.peering.relays.Reservation`): the ``Reserve`` call's stream,
    whose announcements it answers with tunnels to its own server at ``local`` (:class:`~dfl_node.net.relay.Tunnels`),
    lost when the stream ends or falls silent for three of the relay's heartbeats."""

    def __init__(self, relay: str, call: grpc.aio.UnaryStreamCall, local: str) -> None:
        self.relay, self._call, self._local = relay, call, local
        self.address = self.relay_id = ""
        self._lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._tunnels: Tunnels | None = None
        self._following: asyncio.Task[None] | None = None

    async def start(self, timeout: float) -> None:
        """Until the relay's first event: the slot (then its announcements are followed), or its refusal."""
        try:
            first = await asyncio.wait_for(self._call.read(), timeout)
        except TimeoutError:
            self._call.cancel()
            raise PeerUnreachable("deadline_exceeded", f"{self.relay} gave no slot within {timeout:g} s") from None
        except grpc.aio.AioRpcError as exc:
            raise PeerUnreachable(exc.code().name.lower(), f"{self.relay}: {exc.details()}") from exc
        if first is grpc.aio.EOF or not first.address:
            reason = "protocol" if first is grpc.aio.EOF else first.reason or "protocol"
            self._call.cancel()
            raise TransferRefused(reason, f"{self.relay} refused a relay slot")
        self.address, self.relay_id = first.address, first.relay
        self._tunnels = Tunnels(first.address, self._local)
        self._following = asyncio.get_running_loop().create_task(self._follow(max(first.heartbeat_s, 0.1)))

    async def _follow(self, heartbeat: float) -> None:
        why = "ended"
        try:
            while True:
                event = await asyncio.wait_for(self._call.read(), 3 * heartbeat)
                if event is grpc.aio.EOF:
                    break
                if event.token and self._tunnels is not None:
                    self._tunnels.answer(event.token)
        except TimeoutError:
            why = f"silent for {3 * heartbeat:g} s"
        except grpc.aio.AioRpcError as exc:
            why = f"{exc.code().name.lower()}: {exc.details()}"
        finally:
            if not self._lost.done():
                self._lost.set_result(why)

    async def lost(self) -> str:
        return await asyncio.shield(self._lost)

    async def close(self) -> None:
        self._call.cancel()
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following
        if self._tunnels is not None:
            self._tunnels.close()


class GrpcNetwork:
    def __init__(self, wire: WireIdentity, security: Security, *, connect_timeout: float,
                 retire_after: float, pacing: Pacing = NO_PACING, relay: RelayServer | None = None) -> None:
        self.wire, self.security = wire, security
        self.pacing = pacing  # the node's caps on its model transfers, every link's and its server's
        self.local = f"dfl-node-{secrets.token_hex(8)}"  # the abstract Unix socket its own server also listens on,
        # for the tunnels a relay asks for (:class:`~dfl_node.net.relay.Tunnels`)
        self.relay = relay  # the relay it is for others (its server serves it), if it relays
        self.connect_timeout = connect_timeout
        self.retire_after = retire_after  # a replaced channel stays open this long: a call may be under way on it
        self.names: dict[str, str] = {}  # mTLS: address -> the node id whose certificate we check there (verified
        # by our Hello, or announced on mDNS)
        self.clients: dict[str, PeerClient] = {}

    @property
    def authentication(self) -> str:
        return self.security.mode

    def link(self, address: str) -> PeerClient:
        """Our channel to ``address``; with mTLS, one that checks the certificate of the node we know is there."""
        name = self.names.get(address) if self.security.tls else None
        client = self.clients.get(address)
        if client is None or client.checked_id != name:
            if client is not None:  # retired, not cut: a call may still be under way on it
                retired = client
                asyncio.get_running_loop().call_later(self.retire_after, lambda: asyncio.ensure_future(retired.close()))
            client = self.clients[address] = PeerClient(address, self.wire, self.security, name,
                                                        self.connect_timeout, on_wrong_host=self._wrong_host,
                                                        pacing=self.pacing)
        return client

    def _wrong_host(self, address: str) -> None:
        """mTLS: the certificate at ``address`` is not that of the node we knew there: another node is there now
        (the host name is checked next, then its id)."""
        self.names.pop(address, None)

    def heard(self, address: str, node_id: str) -> None:
        """mTLS: ``node_id``'s certificate proved its id (or mDNS announced it): that is the name to check where
        it says it serves (our dial still checks the certificate there; a false address fails that check and
        is forgotten)."""
        if self.security.tls is not None:
            self.names.setdefault(address, node_id)

    async def confirm(self, address: str, reply: HelloReply, hello: Callable[[], Hello], timeout: float) -> bool:
        """Whether the node that answered at ``address`` is the node ``reply`` names. mTLS: our channel checked the
        certificate of the node we knew there; if that was not the reply's id (the host name we dialed, or an mDNS
        announcement that was wrong), one more Hello on a channel that checks the id decides. A peer caught answering
        for another node is :class:`PeerUnauthenticated` (``identity_mismatch``)."""
        if self.security.tls is not None and self.link(address).checked_id != reply.node_id:
            self.names[address] = reply.node_id
            try:
                again = await self.link(address).hello(hello(), timeout=timeout)
            except (PeerUnreachable, PeerUnauthenticated) as exc:
                self.names.pop(address, None)
                if exc.reason == "tls_handshake":
                    raise PeerUnauthenticated("identity_mismatch", f"{address} answers as {reply.node_id[:64]!r}, "
                                              "but its certificate is not that node's") from exc
                return False
            if again.node_id != reply.node_id:
                self.names.pop(address, None)
                return False
        return True

    async def reserve(self, relay: str, request: ReserveRequest, timeout: float) -> GrpcReservation:
        """A relay slot on the member at ``relay`` (:class:`GrpcReservation`, started)."""
        call = self.link(relay).stub.Reserve(to_wire(request))  # fails at once where nothing listens: next relay
        reservation = GrpcReservation(relay, call, self.local)
        await reservation.start(timeout)
        return reservation

    def relay_load(self) -> RelayLoad:
        return self.relay.load if self.relay is not None else RelayLoad()

    def forget(self, address: str) -> None:
        """The peer table no longer knows ``address``: close our channel to it."""
        client = self.clients.pop(address, None)
        if client is not None:
            asyncio.get_running_loop().create_task(client.close())

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        if self.relay is not None:
            await self.relay.stop()
