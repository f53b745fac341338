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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dfl_node.peering.relays import RelayLoad
from dfl_node.rates import TokenBucket

log = logging.getLogger(__name__)

MAGIC = b"DFL-TUNNEL "  # how a relayed node's connection to its slot begins (a peer's begins with TLS or HTTP/2)
TOKEN_BYTES = 16  # random, sent as hex: a token is one line, with no newline in it
TUNNEL_WAIT_S = 10.0  # a peer's connection waits this long for the relayed node to answer its announcement
FIRST_BYTES_WAIT_S = 10.0  # a connection to a slot says what it is within this long (a peer speaks first)
PIPE_BYTES = 256 << 10  # what one read moves at most
MAX_ANNOUNCED = 64  # connections a slot announces and waits for its node to answer, at most at once


@dataclass
class _Pending:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    first: bytes  # what the peer sent before we knew it was a peer
    tunnel: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class Slot:
    """One relayed node's port on the relay, its announcements (``incoming``: tokens; None once the relay closed
    it), while it is held."""

    def __init__(self, relay: RelayServer, node_id: str) -> None:
        self.relay, self.node_id = relay, node_id
        self.incoming: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._pending: dict[bytes, _Pending] = {}
        self._server: asyncio.Server | None = None
        self.address = ""

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.relay.host, 0)
        port = self._server.sockets[0].getsockname()[1]
        host = self.relay.advertised_host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(FIRST_BYTES_WAIT_S):
                first = await reader.readexactly(len(MAGIC))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        if first == MAGIC:
            await self._tunnel(reader, writer)
            return
        if len(self._pending) >= MAX_ANNOUNCED:  # a flood of connections its node could not answer
            writer.close()
            return
        token = secrets.token_hex(TOKEN_BYTES).encode()
        pending = self._pending[token] = _Pending(reader, writer, first)
        await self.incoming.put(token)
        try:
            async with asyncio.timeout(TUNNEL_WAIT_S):
                tunnel_reader, tunnel_writer = await pending.tunnel
        except TimeoutError:
            log.info("relay: %s did not answer an incoming connection within %g s", self.node_id, TUNNEL_WAIT_S)
            writer.close()
            return
        finally:
            self._pending.pop(token, None)
        self.relay.load.connections += 1
        await self.relay.splice(reader, writer, tunnel_reader, tunnel_writer, first=pending.first)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The relayed node's connection for one announced peer: its token, then the bytes."""
        try:
            async with asyncio.timeout(FIRST_BYTES_WAIT_S):
                line = await reader.readline()
        except (TimeoutError, ValueError, ConnectionError):
            writer.close()
            return
        pending = self._pending.get(line.rstrip(b"\n"))
        if pending is None or pending.tunnel.done():  # not a token of ours: a stranger guessing
            writer.close()
            return
        pending.tunnel.set_result((reader, writer))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pending in self._pending.values():
            pending.writer.close()
        self.incoming.put_nowait(None)  # the reservation's stream ends: its node finds another relay


class RelayServer:
    """Node ``node_id``'s relay (it is reachable): at most ``slots`` reservations, their connections' bytes held to
    ``rate`` bytes/s all together (0: no cap) and to ``max_bytes`` in all (0: no bound; spent, the relay gives its
    slots back and takes no more), on ``host`` (the node's serving address), advertised as ``advertised_host``."""

    def __init__(self, node_id: str, host: str, advertised_host: str, slots: int, rate: float = 0.0,
                 max_bytes: float = 0.0) -> None:
        self.node_id, self.host, self.advertised_host = node_id, host, advertised_host
        self.max_slots, self.max_bytes = slots, max_bytes
        self.bucket = TokenBucket(rate) if rate else None
        self.slots: dict[str, Slot] = {}
        self.load = RelayLoad()

    async def open(self, node_id: str) -> Slot | None:
        """A slot for ``node_id`` (a reservation it made again replaces its last), or None where none is left."""
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

    async def splice(self, a_reader: asyncio.StreamReader, a_writer: asyncio.StreamWriter,
                     b_reader: asyncio.StreamReader, b_writer: asyncio.StreamWriter, first: bytes = b"") -> None:
        """A peer's connection (``a``, which sent ``first`` already) and its relayed node's (``b``), both ways until
        either side ends (its half-close passed on), counted in :attr:`load`."""
        await splice(a_reader, a_writer, b_reader, b_writer, self._carried, first)

    @property
    def spent(self) -> bool:
        """Whether it carried its ``max_bytes``."""
        return bool(self.max_bytes) and self.load.bytes >= self.max_bytes

    async def _carried(self, data: bytes) -> None:
        self.load.bytes += len(data)
        if self.spent and self.slots:
            log.warning("relay: carried %d bytes, its bound (--relay-bytes): giving its %d slot(s) back",
                        self.load.bytes, len(self.slots))
            for slot in list(self.slots.values()):
                await self.close(slot)
        if self.bucket is not None:
            await self.bucket.take(len(data))


async def splice(a_reader: asyncio.StreamReader, a_writer: asyncio.StreamWriter, b_reader: asyncio.StreamReader,
                 b_writer: asyncio.StreamWriter, carried: Callable[[bytes], Awaitable[None]] | None = None,
                 first: bytes = b"") -> None:
    """Pipe two connections into each other until both directions ended (or one broke), ``first`` (what ``a`` sent
    before) passed on ahead of ``a``'s bytes; ``carried`` is shown each piece (and may hold it back) before it is
    passed on. Both are closed at the end."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes = b"") -> None:
        try:
            while data or (data := await reader.read(PIPE_BYTES)):
                if carried is not None:
                    await carried(data)
                writer.write(data)
                await writer.drain()
                data = b""
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.transport.abort()
            raise

    try:
        await asyncio.gather(pipe(a_reader, b_writer, first), pipe(b_reader, a_writer))
    except (ConnectionError, OSError):
        pass
    finally:
        for writer in (a_writer, b_writer):
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


class Tunnels:
    """The relayed node's side of one reservation: each announced token answered by a connection to the slot
    (``slot``: host:port) spliced to the node's own server (``local``: host:port).

    Each tunnel's bytes move in threads of their own, by the kernel (:func:`pump`), not through the node's event
    loop: the node's server, hashing and fusing what arrives, would otherwise share one core with the copying."""

    def __init__(self, slot: str, local: tuple[str, int]) -> None:
        host, _, port = slot.rpartition(":")
        self.slot = (host.strip("[]"), int(port))
        self.local = local
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def answer(self, token: bytes) -> None:
        threading.Thread(target=self._carry, args=(token,), name="dfl-tunnel", daemon=True).start()

    def _carry(self, token: bytes) -> None:
        held: list[socket.socket] = []
        try:
            held.append(socket.create_connection(self.slot, timeout=TUNNEL_WAIT_S))
            held[0].sendall(MAGIC + token + b"\n")
            held.append(socket.create_connection(self.local, timeout=TUNNEL_WAIT_S))
        except OSError as exc:
            log.info("relayed: cannot carry a connection through %s:%d: %s", *self.slot, exc)
            for sock in held:
                sock.close()
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._open.update(held)
        if closed:
            for sock in held:
                sock.close()
            return
        for sock in held:
            sock.settimeout(None)
        pump(*held)
        with self._lock:
            self._open.difference_update(held)

    async def close(self) -> None:
        """Every tunnel ends (their threads see their sockets shut)."""
        with self._lock:
            self._closed = True
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def pump(a: socket.socket, b: socket.socket) -> None:
    """Both ways between two connected sockets until both directions ended (each end's half-close passed on) or one
    broke; both closed at the end. One direction in this thread, the other in a second one, each moved by
    ``splice(2)`` through a pipe: the kernel copies, nothing is held in Python."""
    back = threading.Thread(target=_one_way, args=(b, a), name="dfl-tunnel-back", daemon=True)
    back.start()
    _one_way(a, b)
    back.join()
    a.close()
    b.close()


def _one_way(src: socket.socket, dst: socket.socket) -> None:
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):  # a larger pipe, fewer calls (the system's bound may refuse it)
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        while moved := os.splice(src.fileno(), write_end, PIPE_BYTES):
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
