"""A weak link in userspace: a TCP proxy that slows, cuts or drops the connections it forwards.

The kernel here has no ``netem`` (``tc qdisc … netem`` is missing), so a slow or breaking link cannot be set on
an interface. Put this proxy in front of a node's port instead and send every connection to that node through
it: each direction of each connection is held to ``rate`` bytes/s (a token bucket with a 1/20 s burst, so the
rate holds over any window of a second or more), each connection is reset ``cut_after`` seconds after it was
accepted, and ``down`` resets them at once. That is what resumable transfers are tested against.

The proxy reads from a side only as many bytes as its bucket allows, and reads again only once the other side's
kernel took them: a slow link's sender is slowed by TCP backpressure, not queued in the proxy.

In-process (tests, scripts) :class:`LinkProxy` runs on a thread of its own; inside a running event loop,
:class:`AsyncLinkProxy`. From the shell::

    python -m dfl_node.testbed.proxy --listen 127.0.0.1:6000 --target 127.0.0.1:50051 --rate 100k --cut-after 5
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any, NoReturn, Self, TypeVar

from dfl_node.rates import TokenBucket, parse_rate

__all__ = ["AsyncLinkProxy", "LinkCounts", "LinkProxy", "format_address", "main", "parse_address"]

log = logging.getLogger("dfl_node.testbed.proxy")  # the same name run with -m (not __main__)

Address = tuple[str, int]
T = TypeVar("T")
F = TypeVar("F", bound="asyncio.Future[Any]")

CHUNK = 64 * 1024  # the most read at once, limited or not
BUFFER = 16 * 1024  # a stream reader stops reading its socket past 2 × this: the proxy's own queue stays small
START_TIMEOUT_S = 10.0
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


@dataclass(frozen=True)
class LinkCounts:
    """A proxy's totals at one moment: connections accepted, reset (``cut_after`` ran out, or the link was
    ``down``) and closed because the target could not be reached; bytes each side of the proxy wrote (handed to
    the kernel, not merely read)."""

    accepted: int = 0
    cut: int = 0
    failed: int = 0
    bytes_client_to_target: int = 0
    bytes_target_to_client: int = 0

    @property
    def bytes_total(self) -> int:
        return self.bytes_client_to_target + self.bytes_target_to_client

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "bytes_total": self.bytes_total}


class LinkCounters:
    """A proxy's totals since it started, counted from its loop's thread and read from any other (:meth:`now`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = LinkCounts()

    def add(self, **amounts: int) -> None:
        """Add to the named counts (the proxy's own bookkeeping)."""
        with self._lock:
            self._counts = replace(self._counts, **{k: getattr(self._counts, k) + v for k, v in amounts.items()})

    def now(self) -> LinkCounts:
        with self._lock:
            return self._counts


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


def format_address(address: Address) -> str:
    """``host:port``; ``[host]:port`` for an IPv6 host."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


class LinkProxy:
    """The proxy on its own event loop in a daemon thread, for code that has no loop (tests, scripts)::

        with LinkProxy(target=("127.0.0.1", port), rate=100_000, cut_after=5.0) as proxy:
            connect_to(proxy.port)
            ...
            proxy.cut_after = None  # connections accepted from now on are not cut

    Leaving the ``with`` block (or :meth:`stop`) closes the listener and every open connection and joins the
    thread; :attr:`counters` stay readable."""

    def __init__(self, target: Address, listen: Address = ("127.0.0.1", 0), *, rate: float | None = None,
                 cut_after: float | None = None, down: bool = False) -> None:
        self._proxy = AsyncLinkProxy(target, listen, rate=rate, cut_after=cut_after, down=down)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()

    # settings, shared with the loop's thread: each is one attribute, read when a connection is accepted
    @property
    def rate(self) -> float | None:
        """Bytes/s allowed each way on each new connection; None: unlimited."""
        return self._proxy.rate

    @rate.setter
    def rate(self, rate: float | None) -> None:
        self._proxy.rate = rate

    @property
    def cut_after(self) -> float | None:
        """Seconds after which each new connection is reset; None: never."""
        return self._proxy.cut_after

    @cut_after.setter
    def cut_after(self, cut_after: float | None) -> None:
        self._proxy.cut_after = cut_after

    @property
    def down(self) -> bool:
        """Whether new connections are reset as soon as they are accepted."""
        return self._proxy.down

    @down.setter
    def down(self, down: bool) -> None:
        self._proxy.down = down

    @property
    def target(self) -> Address:
        """Where connections are forwarded."""
        return self._proxy.target

    @property
    def counters(self) -> LinkCounts:
        """Connections accepted and cut, bytes forwarded each way, now: readable while it runs and after."""
        return self._proxy.counters.now()

    @property
    def address(self) -> Address:
        """Where it listens (the port the kernel chose, for port 0)."""
        return self._proxy.address

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._proxy.port

    def start(self) -> Self:
        """Start the thread and listen; raises what binding raised (the port is taken, …)."""
        if self._thread is not None:
            raise RuntimeError("the proxy was started already")
        self._thread = threading.Thread(target=self._run, name=f"link-proxy-{format_address(self.target)}",
                                        daemon=True)
        self._thread.start()
        try:
            self._started.result(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every open connection, and join the thread. Idempotent."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            with suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the proxy's thread did not stop within {timeout:g} s")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # handed to start(), which raises it
            if not self._started.done():
                self._started.set_exception(error)
            else:
                log.exception("the link proxy's loop failed")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self._proxy.start()
        self._started.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await self._proxy.close()


# --------------------------------------------------------------------------- command line
def parse_address(text: str) -> Address:
    """``(host, port)`` from ``host:port`` or ``[ipv6]:port``; port 0 means any free one."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host, int(port)


def _argument(parse: Callable[[str], T], what: str) -> Callable[[str], T]:
    """``parse`` as an argparse type: its ValueError becomes argparse's one-line error (exit 2), named ``what``."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = what
    return convert


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not seconds: {text!r}") from None
    if not value >= 0:
        raise ValueError(f"seconds must be >= 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block above it): ``prog: error: …``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m dfl_node.testbed.proxy",
        description="Forward TCP connections through an emulated weak link (the kernel here has no netem): "
                    "each direction held to --rate, each connection reset --cut-after seconds after it was "
                    "accepted, or every connection reset at once (--down). Logs one line per connection; on "
                    "SIGINT/SIGTERM prints the counters as JSON and exits 0.",
        epilog="example: --listen 127.0.0.1:6000 --target 127.0.0.1:50051 --rate 100k --cut-after 5, then point "
               "a peer at 127.0.0.1:6000",
    )
    parser.add_argument("--listen", type=_argument(parse_address, "address"), default=("127.0.0.1", 0),
                        metavar="HOST:PORT",
                        help="where to accept connections (default 127.0.0.1:0: a free port, printed as "
                             "'listening on HOST:PORT' on stdout)")
    parser.add_argument("--target", type=_argument(parse_address, "address"), required=True, metavar="HOST:PORT",
                        help="where to forward them (a node's gRPC port, say)")
    parser.add_argument("--rate", type=_argument(parse_rate, "rate"), default=None, metavar="BYTES_PER_S",
                        help="bytes/s each way, per connection: 2000, 100k (1e3), 1.5M (1e6); default unlimited")
    parser.add_argument("--cut-after", type=_argument(_seconds, "seconds"), default=None, metavar="SECONDS",
                        help="reset each connection this long after accepting it; default never")
    parser.add_argument("--down", action="store_true", help="accept connections and reset them at once")
    return parser


async def _serve(proxy: AsyncLinkProxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await proxy.start()
    print(f"listening on {format_address(proxy.address)} -> {format_address(proxy.target)}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.close()


def main(argv: list[str] | None = None) -> int:
    """The command line: run the proxy until SIGINT or SIGTERM, then print its counters as JSON."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    proxy = AsyncLinkProxy(args.target, args.listen, rate=args.rate, cut_after=args.cut_after, down=args.down)
    try:
        asyncio.run(_serve(proxy))
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(proxy.counters.now().as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
