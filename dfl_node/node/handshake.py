"""Hello: whom this node talks to, and what it tells them about itself.

Whether a peer is compatible (protocol, swarm, algorithm, wire dtype, a model this node can build, data of our
shape and classes, the fingerprint our registry gives its model) is :mod:`.compatibility`; a peer refused, by
us or by itself, is kept visible in ``/status`` and logged once by :mod:`.refusals`. Hello also carries a
node's profile (architecture, sample count) for round plans, and catches a second live node with our id: while
starting, that stops the start; afterwards it is logged once per impostor and counted.

With mutual TLS or a swarm key (:mod:`dfl_node.net.auth`), Hello is also where a peer proves who it
is: a Hello whose sender fails authentication is refused and counted, and a peer enters our table
only from a reply of the node it names (:meth:`Handshake._proven`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dfl_node import PROTOCOL_VERSION
from dfl_node.net.psk import AUTH_REQUIRED, same_endpoint
from dfl_node.node.compatibility import REASONS, Verdict, check, their_refusal
from dfl_node.peering.errors import PeerUnauthenticated, PeerUnreachable
from dfl_node.peering.messages import Hello, HelloReply, Progress

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)

class Handshake:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.starting = True  # until start-up has passed its checks: a duplicate id then aborts it
        self.duplicate: str | None = None  # why start-up must stop: another live node has our id
        self._impostors: set[str] = set()  # boot ids of live nodes with our id, each reported once

    def message(self) -> Hello:
        """Our Hello: who we are."""
        node, cfg = self.node, self.node.config
        return Hello(protocol_version=PROTOCOL_VERSION, swarm=cfg.swarm, node_id=cfg.id, fingerprint=node.fingerprint,
                     algorithm=cfg.algorithm, boot_id=node.boot_id, grpc_address=node.grpc_address,
                     http_port=cfg.http_port, status_url=cfg.status_url or "", model=node.wire.model,
                     num_samples=node.ctx.num_samples, wire_dtype=node.wire.wire_dtype, progress=node.progress(),
                     sample_shape=tuple(node.ctx.train.input_shape), num_classes=node.ctx.train.num_classes)

    def reply(self, accepted: bool, reason: str = "", progress: Progress | None = None) -> HelloReply:
        """Our answer to a Hello: who we are, and our verdict on the peer."""
        return HelloReply(**{**vars(self.message()), "progress": progress or Progress()}, accepted=accepted,
                          reason=reason)

    def incompatibility(self, other: Hello) -> Verdict | None:
        """Why we cannot learn with the sender of ``other`` (None: we can)."""
        return check(self.message(), other, self.node.wire.fingerprint_of)

    def answer(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        """The Hello RPC: refuse an incompatible peer (counted, and kept in refused_peers), else record it as
        alive. ``refused``: why authentication failed (mTLS: a certificate of another node; swarm key: no or a
        wrong proof, a replay), refused and counted alike, except the first step of every swarm-key handshake."""
        if refused:
            if refused != AUTH_REQUIRED:
                self.node.state.rejected[refused] += 1
                self.node.refusals.warning(refused, "refused %s (%s) at hello: %s", request.node_id[:64], peer,
                                           refused)
            return self.reply(False, refused)
        verdict = self.incompatibility(request)
        if verdict:
            self._refused(verdict, request, request.grpc_address or peer)
            return self.reply(False, verdict.reason)
        if self.is_duplicate(request):
            self.on_duplicate(request.boot_id, request.grpc_address or peer)
            return self.reply(False, "duplicate_id")
        if not self.node.peers.heard(request):  # still compatible: only our table has no room for a stranger
            self.node.on_rejected("peer_table_full", f"{request.node_id[:64]!r} at {peer}: too many unconfirmed peers",
                                  request.node_id[:64])
        elif self.node.security.tls is not None and request.grpc_address:
            # its certificate proved its id: that is the name to check where it says it serves (our dial
            # still checks the certificate there; a false address fails that check and is forgotten)
            self.node.network.names.setdefault(request.grpc_address, request.node_id)
        return self.reply(True, progress=self.node.progress())

    def _refused(self, verdict: Verdict, other: Hello, address: str) -> None:
        """We refuse ``other``'s sender: counted at every Hello, logged and listed once per peer and reason."""
        self.node.state.rejected[verdict.reason] += 1
        self.node.refused_peers.record(other, address, verdict.reason, verdict.detail, by="us")

    async def probe(self, address: str, timeout: float) -> HelloReply | None:
        """Heartbeat: our Hello to ``address``, answered within ``timeout``; only compatible peers count as
        alive. Whether anything answered at all goes to the peer table, which shows static peers that do not
        (:meth:`PeerTable.unanswered`)."""
        node = self.node
        client = node.client(address)
        try:
            reply = await client.hello(self.message(), timeout=timeout)
        except PeerUnreachable as exc:
            node.peers.unanswered(address, exc.detail)
            return None
        except PeerUnauthenticated as exc:  # mTLS: its certificate failed our checks (or ours its); swarm key
            if exc.reason == "tls_handshake" and "Hostname" in exc.detail:
                self.node.network.names.pop(address, None)  # another node is there now: the host name, then its id
            node.on_rejected(exc.reason, f"{address}: {exc.detail}", address)
            return None
        node.peers.answered(address)
        if reply.node_id == node.config.id:  # ourselves (our own address in a static list), or a duplicate
            if self.is_duplicate(reply):
                self.on_duplicate(reply.boot_id, address)
            return None
        if not reply.accepted:  # the peer counts its refusal of us; we keep it visible, and leave it out of the table
            if reply.reason in REASONS:
                detail = their_refusal(reply.reason, self.message(), reply)
                node.refused_peers.record(reply, address, reply.reason, detail, by="peer")
            else:
                log.debug("%s at %s refused us: %s", reply.node_id, address, reply.reason[:64])
            return None
        verdict = self.incompatibility(reply)
        if verdict:
            self._refused(verdict, reply, address)
            return None
        if not await self._proven(address, client.checked_id, reply, timeout):
            return None
        node.refused_peers.compatible(reply.node_id)
        return reply

    async def _proven(self, address: str, checked: str | None, reply: HelloReply, timeout: float) -> bool:
        """Whether the node that answered at ``address`` is the node its reply names. mTLS: our channel
        checked the certificate for ``checked``; if that was not the reply's id (the host name we dialed,
        or an mDNS announcement that was wrong), one more Hello on a channel that checks the id decides.
        Swarm key: its address must be the endpoint we dialed (no relaying of another node's answers)."""
        node = self.node
        if node.security.tls is not None and checked != reply.node_id:
            self.node.network.names[address] = reply.node_id
            try:
                again = await node.client(address).hello(self.message(), timeout=timeout)
            except (PeerUnreachable, PeerUnauthenticated) as exc:
                self.node.network.names.pop(address, None)
                if exc.reason == "tls_handshake":
                    node.on_rejected("identity_mismatch", f"{address} answers as {reply.node_id[:64]!r}, but its "
                                     "certificate is not that node's", reply.node_id[:64])
                return False
            if again.node_id != reply.node_id:
                self.node.network.names.pop(address, None)
                return False
        if node.security.swarm_key is not None and not await same_endpoint(address, reply.grpc_address):
            node.on_rejected("address_mismatch", f"{address} answers for {reply.grpc_address[:100]!r}: a relay, or "
                             "list the peer by the address it advertises", reply.node_id[:64])
            return False
        return True

    def is_duplicate(self, other: Hello) -> bool:
        """Another live node of our swarm with our id: same id and swarm, another boot."""
        node = self.node
        return other.node_id == node.config.id and other.swarm == node.config.swarm and other.boot_id != node.boot_id

    def on_duplicate(self, boot_id: str, address: str) -> None:
        """While starting, a duplicate id stops the start (service checks ``duplicate``); a running node
        keeps serving, but says so loudly, once per impostor, and counts it in ``rejected``."""
        problem = (f"node id {self.node.config.id!r} is already used by another running node at {address}; "
                   "give every node its own --id")
        if self.starting:
            self.duplicate = self.duplicate or problem
            return
        if boot_id not in self._impostors:
            self._impostors.add(boot_id)
            self.node.state.rejected["duplicate_id"] += 1
            log.error("%s", problem)
