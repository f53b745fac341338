"""Relays, the bytes: a reachable node carries TCP connections to a member its peers cannot dial (NAT, a firewall).

The relayed node holds a reservation — a ``Reserve`` call it made to the relay, over a connection it opened, so
through its NAT — and the relay opens a **slot** for it: a port of its own, which the relayed node advertises as its
address. A peer that dials the slot is a connection like any other to it; the relay announces it on the
reservation's stream (a random token), the relayed node dials the slot back, sends ``DFL-TUNNEL <token>\\n``, and
connects the other end to its own gRPC server; the relay splices the two connections. Bytes pass unread: under
mutual TLS or the swarm key the TLS session runs between the peer and the relayed node, and the relay sees only
its records. Only a reservation's node can answer its tokens, and the reservation itself is a call the relay
authenticates (:mod:`dfl_node.net.servicer`), so a relay is never an open proxy. (libp2p's Circuit Relay v2 and
``ssh -R`` do the same; the first has one connection per circuit too.)

:class:`RelayServer` is the relay's side: slots, bounded in number, bytes and rate, and counted. :class:`Tunnels` is
the relayed node's: it answers its relay's announcements.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dfl_node.peering.relays import RelayLoad
from dfl_node.rates import TokenBucket

log = logging.getLogger(__name__)

MAGIC = b"DFL-TUNNEL "  # how a relayed node's connection to its slot begins (a peer's begins with TLS or HTTP/2)
TOKEN_BYTES = 16  # random, sent as hex: a token is one line, with no newline in it
TOKEN_LINE = 2 * TOKEN_BYTES + 1  # a token's line: its hex and a newline
TUNNEL_WAIT_S = 10.0  # a peer's connection waits this long for the relayed node to answer its announcement
FIRST_BYTES_WAIT_S = 10.0  # a connection to a slot says what it is within this long (a peer speaks first)
PIPE_BYTES = 1 << 20  # what one read moves at most
MAX_ANNOUNCED = 64  # connections a slot announces and waits for its node to answer, at most at once


class Slot:
    """One relayed node's port on the relay, its announcements (``incoming``: tokens; None once the relay closed
    it), while it is held."""

    def __init__(self, relay: RelayServer, node_id: str) -> None:
        self.relay, self.node_id = relay, node_id
        self.incoming: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._pending: dict[bytes, _Pending] = {}
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._talks: set[asyncio.Task[None]] = set()
        self.address = ""

    async def open(self) -> None:
        self._listener = listen(self.relay.host)
        port = self._listener.getsockname()[1]
        host = self.relay.advertised_host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._accepting = asyncio.ensure_future(self._accept_all(self._listener))

    async def _accept_all(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:  # the slot closed
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            talk = asyncio.ensure_future(self._accept(conn))
            self._talks.add(talk)
            talk.add_done_callback(self._talks.discard)

    async def _accept(self, conn: socket.socket) -> None:
        first = await _read_exactly(conn, len(MAGIC))
        if first is None:
            conn.close()
        elif first == MAGIC:
            self._tunnel(conn, await _read_exactly(conn, TOKEN_LINE, line=True))
        elif len(self._pending) >= MAX_ANNOUNCED:  # a flood of connections its node could not answer
            conn.close()
        else:
            await self._announce(conn, first)

    async def _announce(self, conn: socket.socket, first: bytes) -> None:
        """A peer's connection: announced on the reservation, carried once its node dialed back with the token."""
        token = secrets.token_hex(TOKEN_BYTES).encode()
        pending = self._pending[token] = _Pending(conn)
        await self.incoming.put(token)
        try:
            async with asyncio.timeout(TUNNEL_WAIT_S):
                tunnel = await pending.tunnel
        except TimeoutError:
            log.info("relay: %s did not answer an incoming connection within %g s", self.node_id, TUNNEL_WAIT_S)
            conn.close()
            return
        finally:
            self._pending.pop(token, None)
        self.relay.carry(conn, tunnel, first)

    def _tunnel(self, conn: socket.socket, line: bytes | None) -> None:
        """The relayed node's connection for one announced peer: its token's line, then the bytes."""
        pending = self._pending.get(line.rstrip(b"\n")) if line is not None else None
        if pending is None or pending.tunnel.done():  # not a token of ours: a stranger guessing
            conn.close()
            return
        pending.tunnel.set_result(conn)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for task in (self._accepting, *self._talks):
            if task is not None:
                task.cancel()
        for pending in self._pending.values():
            pending.peer.close()
        self.incoming.put_nowait(None)  # the reservation's stream ends: its node finds another relay


@dataclass
class _Pending:
    peer: socket.socket
    tunnel: asyncio.Future[socket.socket] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def listen(host: str) -> socket.socket:
    """A non-blocking listening socket on ``host`` (IPv4 or IPv6), on a port the system picks."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    sock = socket.create_server((host, 0), family=family)
    sock.setblocking(False)
    return sock


async def _read_exactly(conn: socket.socket, n: int, line: bool = False) -> bytes | None:
    """``n`` bytes from ``conn`` and not one more (what follows is carried by the kernel), or with ``line`` up to a
    newline within ``n``; None where the connection ended or said nothing for :data:`FIRST_BYTES_WAIT_S`."""
    loop, data = asyncio.get_running_loop(), b""
    try:
        async with asyncio.timeout(FIRST_BYTES_WAIT_S):
            while len(data) < n and not (line and data.endswith(b"\n")):
                if not (piece := await loop.sock_recv(conn, 1 if line else n - len(data))):
                    return None
                data += piece
    except (TimeoutError, OSError):
        return None
    return data


class RelayServer:
    """Node ``node_id``'s relay (it is reachable): at most ``slots`` reservations, their connections' bytes held to
    ``rate`` bytes/s all together (0: no cap) and to ``max_bytes`` in all (0: no bound; spent, the relay gives its
    slots back and takes no more), on ``host`` (the node's serving address), advertised as ``advertised_host``.

    The bytes move as a relayed node's do (:class:`Carrier`): by the kernel, in threads, off the relay's event
    loop, which serves the relay's own rounds meanwhile."""

    def __init__(self, node_id: str, host: str, advertised_host: str, slots: int, rate: float = 0.0,
                 max_bytes: float = 0.0) -> None:
        self.node_id, self.host, self.advertised_host = node_id, host, advertised_host
        self.max_slots, self.max_bytes = slots, max_bytes
        self.bucket = TokenBucket(rate) if rate else None
        self.slots: dict[str, Slot] = {}
        self.load = RelayLoad()
        self.carrier = Carrier()
        self._counting = threading.Lock()  # the carrier's threads count into load and take from the bucket
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self, node_id: str) -> Slot | None:
        """A slot for ``node_id`` (a reservation it made again replaces its last), or None where none is left."""
        self._loop = asyncio.get_running_loop()
        old = self.slots.pop(node_id, None)
        if old is not None:
            await old.close()
        if len(self.slots) >= self.max_slots or self.spent:
            self.load.refused += 1
            return None
        slot = self.slots[node_id] = Slot(self, node_id)
        await slot.open()
        self.load.slots = len(self.slots)
        return slot

    async def close(self, slot: Slot) -> None:
        if self.slots.get(slot.node_id) is slot:
            del self.slots[slot.node_id]
        self.load.slots = len(self.slots)
        await slot.close()

    def carry(self, peer: socket.socket, tunnel: socket.socket, first: bytes) -> None:
        """A peer's connection (which sent ``first`` already) and its relayed node's, spliced both ways until
        either side ends, counted in :attr:`load`."""
        self.load.connections += 1
        self.carrier.carry(peer, tunnel, first, self._carried)

    async def stop(self) -> None:
        """Every slot closed, every connection it carries ended."""
        for slot in list(self.slots.values()):
            await self.close(slot)
        self.carrier.close()

    @property
    def spent(self) -> bool:
        """Whether it carried its ``max_bytes``."""
        return bool(self.max_bytes) and self.load.bytes >= self.max_bytes

    def _carried(self, n: int) -> None:
        """``n`` bytes moved (in a carrier's thread): counted, and held to the rate before the next move."""
        with self._counting:
            self.load.bytes += n
            owed = self.bucket.owe(n) if self.bucket is not None else 0.0
            give_back = self.spent and bool(self.slots)
        if give_back and self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._give_back()))
        if owed > 0:
            time.sleep(owed)

    async def _give_back(self) -> None:
        if not self.slots:
            return
        log.warning("relay: carried %d bytes, its bound (--relay-bytes): giving its %d slot(s) back",
                    self.load.bytes, len(self.slots))
        for slot in list(self.slots.values()):
            await self.close(slot)


class Carrier:
    """Connections spliced in pairs, each pair's bytes moved in threads of their own by the kernel (:func:`pump`),
    not through an event loop: a node's server, hashing and fusing what arrives, would otherwise share one core
    with the copying. :meth:`close` ends them all."""

    def __init__(self) -> None:
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def carry(self, a: socket.socket, b: socket.socket, first: bytes = b"",
              carried: Callable[[int], None] | None = None) -> None:
        """``a`` and ``b`` spliced in a thread of their own (``first``, what ``a`` sent already, passed on ahead),
        ``carried`` shown the bytes each move passed; both closed at the end."""
        threading.Thread(target=self._carry, args=(a, b, first, carried), name="dfl-carry", daemon=True).start()

    def _carry(self, a: socket.socket, b: socket.socket, first: bytes,
               carried: Callable[[int], None] | None) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._open.update((a, b))
        if not closed:
            for sock in (a, b):
                sock.setblocking(True)
            pump(a, b, first, carried)
        a.close()
        b.close()
        with self._lock:
            self._open.difference_update((a, b))

    def close(self) -> None:
        """Every pair ends (their threads see their sockets shut), and no more are carried."""
        with self._lock:
            self._closed = True
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Tunnels:
    """The relayed node's side of one reservation: each announced token answered by a connection to the slot
    (``slot``: host:port) spliced to the node's own server, by a :class:`Carrier`. The server is reached on an
    abstract Unix socket (``local``, its name), not over loopback TCP: that hop costs a third less there."""

    def __init__(self, slot: str, local: str) -> None:
        host, _, port = slot.rpartition(":")
        self.slot = (host.strip("[]"), int(port))
        self.local = local
        self.carrier = Carrier()

    def answer(self, token: bytes) -> None:
        threading.Thread(target=self._dial, args=(token,), name="dfl-tunnel", daemon=True).start()

    def _dial(self, token: bytes) -> None:
        held: list[socket.socket] = []
        try:
            held.append(socket.create_connection(self.slot, timeout=TUNNEL_WAIT_S))
            held[0].sendall(MAGIC + token + b"\n")
            held[0].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            held.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            held[1].settimeout(TUNNEL_WAIT_S)
            held[1].connect("\0" + self.local)
        except OSError as exc:
            log.info("relayed: cannot carry a connection through %s:%d: %s", *self.slot, exc)
            for sock in held:
                sock.close()
            return
        self.carrier.carry(held[0], held[1])

    def close(self) -> None:
        """Every tunnel ends."""
        self.carrier.close()


def pump(a: socket.socket, b: socket.socket, first: bytes = b"", carried: Callable[[int], None] | None = None) -> None:
    """Both ways between two connected, blocking sockets until both directions ended (each end's half-close passed
    on) or one broke, ``first`` sent to ``b`` ahead of ``a``'s bytes. One direction in this thread, the other in a
    second one, each moved by ``splice(2)`` through a pipe: the kernel copies, nothing is held in Python; ``carried``
    is shown each move's count (it may hold the next one back)."""
    back = threading.Thread(target=_one_way, args=(b, a, carried), name="dfl-carry-back", daemon=True)
    back.start()
    try:
        b.sendall(first)
    except OSError:
        pass
    else:
        _one_way(a, b, carried)
    back.join()


def _one_way(src: socket.socket, dst: socket.socket, carried: Callable[[int], None] | None) -> None:
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a larger pipe, fewer calls (the system's bound may refuse it)
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        while moved := os.splice(src.fileno(), write_end, PIPE_BYTES):
            if carried is not None:
                carried(moved)
            while moved:
                moved -= os.splice(read_end, dst.fileno(), moved)
        dst.shutdown(socket.SHUT_WR)
    except OSError:  # reset, or shut by close(): the other direction ends too
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(read_end)
        os.close(write_end)
