"""Swarm-key (PSK) mode: a challenge–response in Hello, and the connections it authenticates.

Every node of the swarm holds the same secret key K (``--swarm-key-file``); it never travels. Nonces
are 32 random bytes; ``mac(label, fields…)`` is HMAC-SHA256 under K over length-prefixed fields, with
distinct labels for the two directions (a proof can never be replayed as the other side's).

1. A dials B: ``Hello{n_A, challenge c, proof_A}`` with ``proof_A = mac("client", swarm, A's id,
   A's address, c, n_A)``, where ``c`` is the challenge B handed A in its last reply (none at first
   contact: B then answers ``auth_required`` with one, not counted as a refusal, and A asks again).
2. B checks that ``c`` is one it issued, unused and under 30 s old (it is used up now: a replayed
   Hello is refused, ``auth_replay``), and ``proof_A``. On success the *connection* the Hello came
   on (gRPC's ``context.peer()``, the caller's IP and port) is authenticated as A for 30 s, renewed
   by every Hello A sends on it. A's heartbeats are Hellos, but a node sends none to a peer with a lower id
   that says Hello to it, so before a call A says Hello again once half the 30 s are over, or when its
   channel is not connected (the call would open a new connection): :class:`~dfl_node.net.client.PeerClient`.
3. B's every reply carries a fresh challenge ``c'`` and ``proof_B = mac("server", swarm, B's id,
   B's address, n_A, c')``: A learns that B knows K, and only adopts ``c'`` when ``proof_B`` holds.
   A also checks that B's address resolves to the endpoint it dialed, so a host that makes A dial it
   (an mDNS announcement) cannot relay B's answers and collect A's proof for B.

Transfer, Pull, Probe, Assign and PassToken are served only on an authenticated connection, and a
request that names its sender (Transfer, Pull, Probe) only in the name the connection proved.

What it does not do (README, "Security model"): no encryption and no integrity after Hello — an
attacker *on the path* can read everything, inject into an authenticated TCP connection or take it
over; every key holder can claim any node id. mTLS (:mod:`dfl_node.net.tls`) has none of these limits.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from dfl_node.addresses import parse_peer
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.errors import AUTH_REQUIRED, PeerUnauthenticated
from dfl_node.secret_file import read_secret

NONCE_BYTES = 32
CHALLENGE_TTL_S = 30.0  # a challenge not answered within this is forgotten (the peer asks for a new one)
SESSION_TTL_S = 30.0  # an authenticated connection without a Hello for this long must authenticate again
CAPACITY = 4096  # challenges outstanding, challenges used, connections: each table at most this many
UNANSWERED_LIMIT = 3  # a connection that asked this many challenges in a row without answering one has no key


def read_swarm_key(path: Path) -> bytes:
    """The key: the file's bytes without surrounding whitespace, at least 32 of them."""
    return read_secret(path, "swarm key", "swarm-key")


def _mac(key: bytes, label: str, *fields: str | bytes) -> bytes:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for field in (f"dfl-psk-v1 {label}", *fields):
        data = field.encode() if isinstance(field, str) else field
        digest.update(len(data).to_bytes(4, "big") + data)
    return digest.digest()


def client_proof(key: bytes, request: pb.HelloRequest) -> bytes:
    return _mac(key, "client", request.swarm, request.node_id, request.grpc_address, request.auth_challenge,
                request.auth_nonce)


def server_proof(key: bytes, reply: pb.HelloReply, request_nonce: bytes) -> bytes:
    return _mac(key, "server", reply.swarm, reply.node_id, reply.grpc_address, request_nonce, reply.auth_nonce)


# ----------------------------------------------------------------------------- the dialing side


def sign_request(key: bytes, request: pb.HelloRequest, challenge: bytes | None) -> pb.HelloRequest:
    """A copy of ``request`` with a fresh nonce and, given the peer's challenge, our proof."""
    signed = pb.HelloRequest()
    signed.CopyFrom(request)
    signed.auth_nonce = secrets.token_bytes(NONCE_BYTES)
    if challenge:
        signed.auth_challenge = challenge
        signed.auth_proof = client_proof(key, signed)
    return signed


def check_reply(key: bytes, request: pb.HelloRequest, reply: pb.HelloReply) -> None:
    """Raise :class:`PeerUnauthenticated` unless ``reply`` proves the key over our request's nonce."""
    if not reply.auth_proof:
        raise PeerUnauthenticated("unauthenticated", f"{reply.node_id[:64]!r} answered without a swarm-key proof")
    if len(reply.auth_nonce) != NONCE_BYTES or not hmac.compare_digest(reply.auth_proof,
                                                                       server_proof(key, reply, request.auth_nonce)):
        raise PeerUnauthenticated("auth_failed", f"{reply.node_id[:64]!r} does not prove our swarm key")


async def same_endpoint(dialed: str, advertised: str) -> bool:
    """Whether ``advertised`` (a peer's grpc_address) names the endpoint we dialed: same port, and a host
    that is the same name or resolves to one of the dialed host's addresses."""
    try:
        (host, port), (other_host, other_port) = parse_peer(dialed), parse_peer(advertised)
    except ValueError:
        return False
    if port != other_port:
        return False
    if host.lower() == other_host.lower():
        return True
    loop = asyncio.get_running_loop()

    async def resolve(name: str) -> set[str]:
        try:
            return {str(ipaddress.ip_address(name))}
        except ValueError:
            pass
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(name, port, type=socket.SOCK_STREAM), 2.0)
        except (OSError, TimeoutError):
            return set()
        return {str(info[4][0]) for info in infos}

    ours, theirs = await asyncio.gather(resolve(host), resolve(other_host))
    return bool(ours & theirs)


# ----------------------------------------------------------------------------- the answering side


def _bounded_put(table: OrderedDict, key: object, value: object) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > CAPACITY:
        table.popitem(last=False)


class PskServer:
    """Challenges issued and used, and the connections (``context.peer()``) that proved the key."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.monotonic) -> None:
        self.key, self.clock = key, clock
        self._pending: OrderedDict[bytes, float] = OrderedDict()  # challenge -> when issued
        self._used: OrderedDict[bytes, None] = OrderedDict()
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()  # peer -> (node id, expiry)
        self._unanswered: OrderedDict[str, int] = OrderedDict()  # peer -> challenges asked for in a row

    def verify(self, request: pb.HelloRequest, peer: str) -> str | None:
        """Why ``request``, on connection ``peer``, does not authenticate its sender (a stable reason), or
        None when it does. A node with another key never answers a challenge (it cannot check ours): after
        a few unanswered ones its Hellos count as ``unauthenticated``; a node with ours answers at once."""
        if len(request.auth_nonce) != NONCE_BYTES:
            return "unauthenticated"  # no swarm key at all (or a malformed nonce)
        challenge = request.auth_challenge
        if not challenge:
            asked = self._unanswered.get(peer, 0) + 1
            _bounded_put(self._unanswered, peer, asked)
            return "unauthenticated" if asked > UNANSWERED_LIMIT else AUTH_REQUIRED
        if challenge in self._used:
            return "auth_replay"
        issued = self._pending.pop(challenge, None)
        if issued is None or self.clock() - issued > CHALLENGE_TTL_S:
            return AUTH_REQUIRED  # not ours, or expired: the reply carries a fresh one
        _bounded_put(self._used, challenge, None)
        if not hmac.compare_digest(request.auth_proof, client_proof(self.key, request)):
            return "auth_failed"
        return None

    def sign(self, request: pb.HelloRequest, reply: pb.HelloReply) -> None:
        """Our proof over the caller's nonce, with a fresh challenge for its next Hello."""
        if len(request.auth_nonce) != NONCE_BYTES:
            return  # a caller without a key learns nothing and gets no challenge to hoard
        reply.auth_nonce = challenge = secrets.token_bytes(NONCE_BYTES)
        _bounded_put(self._pending, challenge, self.clock())
        reply.auth_proof = server_proof(self.key, reply, request.auth_nonce)

    def bind(self, peer: str, node_id: str) -> None:
        self._unanswered.pop(peer, None)
        _bounded_put(self._sessions, peer, (node_id, self.clock() + SESSION_TTL_S))

    def session(self, peer: str) -> str | None:
        """The node id the connection ``peer`` authenticated as, while that is fresh."""
        found = self._sessions.get(peer)
        if found is None or found[1] < self.clock():
            return None
        return found[0]
