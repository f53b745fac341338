"""The weak-link proxy on a running event loop (:class:`AsyncLinkProxy`): it accepts connections and splices each
to the target through a link of its own (:class:`_Link`), held to the proxy's ``rate``, reset after its
``cut_after`` or at once while the proxy is ``down`` (why and how: :mod:`dfl_node.testbed.proxy`).

Each direction of a link reads only as many bytes as its token bucket allows, and reads again only once the other
side's kernel took them, so a slow link's sender is slowed by TCP backpressure, not queued in the proxy.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from contextlib import suppress
from types import TracebackType
from typing import Any, Self, TypeVar

from dfl_node.rates import TokenBucket
from dfl_node.testbed.addresses import Address, format_address
from dfl_node.testbed.link_counts import LinkCounters

log = logging.getLogger("dfl_node.testbed.proxy")  # the proxy's one logger, under the name it has run with -m

F = TypeVar("F", bound="asyncio.Future[Any]")

CHUNK = 64 * 1024  # the most read at once, limited or not
BUFFER = 16 * 1024  # a stream reader stops reading its socket past 2 × this: the proxy's own queue stays small
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


def _check_rate(rate: float | None) -> float | None:
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be positive bytes/s or None, got {rate!r}")
    return rate


def _check_cut_after(cut_after: float | None) -> float | None:
    if cut_after is not None and not cut_after >= 0:
        raise ValueError(f"cut_after must be seconds >= 0 or None, got {cut_after!r}")
    return cut_after


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close abruptly: the peer sees a reset (RST), not a clean end of stream."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()


def _outcome(task: asyncio.Future[Any]) -> BaseException | None:
    return None if task.cancelled() else task.exception()



class _Link:
    """One accepted connection and the one it opened to the target."""

    def __init__(self, proxy: AsyncLinkProxy, number: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.number = number
        self.counters = proxy.counters
        self.target = proxy.target
        self.rate = proxy.rate  # the settings when it was accepted; later changes apply to later connections
        self.cut_after = proxy.cut_after
        self.client = (reader, writer)
        self.writers = [writer]
        self.children: set[asyncio.Future[Any]] = set()
        self.accepted_at = time.monotonic()
        self.sent = 0  # client → target, written
        self.returned = 0  # target → client, written
        self.cut_reason: str | None = None
        self.finished = False

    def _bytes(self) -> str:
        return f"{self.sent} B to target, {self.returned} B back"

    def cut(self, reason: str) -> None:
        """Reset both sides now and count the connection as cut (a no-op once it has ended)."""
        if self.finished or self.cut_reason is not None:
            return
        self.cut_reason = reason
        self.counters.add(cut=1)
        log.info("link %d: cut (%s) after %.2f s: %s", self.number, reason, time.monotonic() - self.accepted_at,
                 self._bytes())
        self.abort()

    def abort(self) -> None:
        """Reset both sides and stop forwarding, uncounted."""
        for writer in self.writers:
            _reset(writer)
        for child in self.children:
            child.cancel()

    async def run(self, down: bool) -> None:
        """Forward until both sides have ended, a side resets, or the link is cut."""
        if down:
            self.cut("down")
            self.finished = True
            return
        timer = None
        if self.cut_after is not None:
            timer = asyncio.get_running_loop().call_later(self.cut_after, self.cut, f"cut_after {self.cut_after:g} s")
        try:
            await self._forward()
        finally:
            if timer is not None:
                timer.cancel()
            if not self.finished:  # cancelled (the proxy is closing) or broken: nothing may keep running
                self.finished = True
                log.info("link %d: stopped after %.2f s: %s", self.number, time.monotonic() - self.accepted_at,
                         self._bytes())
                self.abort()

    def _child(self, future: F) -> F:
        self.children.add(future)
        return future

    async def _forward(self) -> None:
        host, port = self.target
        connect = self._child(asyncio.ensure_future(asyncio.open_connection(host, port, limit=BUFFER)))
        await asyncio.wait({connect})
        if connect.cancelled():  # cut while connecting
            return
        if (error := connect.exception()) is not None:
            self.counters.add(failed=1)
            log.warning("link %d: target %s unreachable: %s", self.number, format_address(self.target), error)
            self.finished = True
            self.abort()
            return
        target_reader, target_writer = connect.result()
        self.writers.append(target_writer)
        if self.cut_reason is not None:  # cut in the same step as the connection completed
            self.abort()
            return
        client_reader, client_writer = self.client
        for writer in self.writers:
            writer.transport.set_write_buffer_limits(high=0)  # drain() returns once the kernel holds every byte
        up = self._child(asyncio.ensure_future(self._pump(client_reader, target_writer, True)))
        down = self._child(asyncio.ensure_future(self._pump(target_reader, client_writer, False)))
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
        errors = [error for task in done if (error := _outcome(task)) is not None]
        if self.cut_reason is not None:
            return
        self.finished = True
        if errors:
            log.info("link %d: reset (%s): %s", self.number, errors[0].__class__.__name__, self._bytes())
            self.abort()
            return
        log.info("link %d: closed after %.2f s: %s", self.number, time.monotonic() - self.accepted_at, self._bytes())
        for writer in self.writers:
            writer.close()
        for writer in self.writers:
            with suppress(OSError):
                await writer.wait_closed()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, upstream: bool) -> None:
        bucket = None if self.rate is None else TokenBucket(self.rate)
        while True:
            size = CHUNK if bucket is None else await bucket.allowance(CHUNK)
            data = await source.read(size)
            if not data:
                break
            if bucket is not None:
                bucket.spend(len(data))
            sink.write(data)
            await sink.drain()
            if upstream:
                self.sent += len(data)
                self.counters.add(bytes_client_to_target=len(data))
            else:
                self.returned += len(data)
                self.counters.add(bytes_target_to_client=len(data))
        if sink.can_write_eof():  # half-close: the other direction goes on until its side ends too
            with suppress(OSError):
                sink.write_eof()


class AsyncLinkProxy:
    """The proxy on the running event loop: ``async with AsyncLinkProxy(target) as proxy`` (or :meth:`start` and
    :meth:`close`). ``rate`` (bytes/s, each direction of each connection), ``cut_after`` (seconds after accept)
    and ``down`` may be changed while it runs; a change applies to connections accepted after it."""

    def __init__(self, target: Address, listen: Address = ("127.0.0.1", 0), *, rate: float | None = None,
                 cut_after: float | None = None, down: bool = False) -> None:
        self.target = target
        self.listen = listen
        self.rate = rate
        self.cut_after = cut_after
        self.down = down
        self.counters = LinkCounters()
        self._server: asyncio.Server | None = None
        self._address: Address | None = None
        self._links: dict[asyncio.Task[None], _Link] = {}
        self._closing = False

    @property
    def rate(self) -> float | None:
        """Bytes/s allowed each way on each new connection; None: unlimited."""
        return self._rate

    @rate.setter
    def rate(self, rate: float | None) -> None:
        self._rate = _check_rate(rate)

    @property
    def cut_after(self) -> float | None:
        """Seconds after which each new connection is reset; None: never."""
        return self._cut_after

    @cut_after.setter
    def cut_after(self, cut_after: float | None) -> None:
        self._cut_after = _check_cut_after(cut_after)

    @property
    def address(self) -> Address:
        """Where it listens (the port the kernel chose, for port 0)."""
        if self._address is None:
            raise RuntimeError("the proxy is not listening")
        return self._address

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self.address[1]

    async def start(self) -> Self:
        """Listen; connections are forwarded from now on."""
        if self._server is not None:
            raise RuntimeError("the proxy was started already")
        host, port = self.listen
        self._server = await asyncio.start_server(self._accept, host, port, limit=BUFFER)
        bound = self._server.sockets[0].getsockname()
        self._address = (host, bound[1])
        log.info("listening on %s, forwarding to %s", format_address(self._address), format_address(self.target))
        return self

    async def close(self) -> None:
        """Stop listening and reset every open connection (not counted as cuts)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._links)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.add(accepted=1)
        number = self.counters.now().accepted
        link = _Link(self, number, reader, writer)
        peer = writer.get_extra_info("peername")
        log.info("link %d: accepted from %s", number, format_address(peer[:2]) if peer else "?")
        if self._closing:
            link.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._links[task] = link
        try:
            await link.run(self.down)
        except asyncio.CancelledError:
            pass  # close(): run() has reset both sides (and asyncio 3.11 would log a cancelled callback task)
        except Exception:  # a bug here must not kill the server's callback silently
            log.exception("link %d: failed", number)
        finally:
            del self._links[task]
