"""The weak-link proxy (:mod:`dfl_node.testbed.proxy`) on loopback: bytes pass unchanged, the rate holds, a cut
resets a connection on time and the next one works, a link that is down carries nothing, and the command line
forwards, logs and prints its counters on SIGINT/SIGTERM.

Rates and cuts are about real time, so those tests measure elapsed time; everything else waits on events."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from dfl_node.rates import TokenBucket, parse_rate
from dfl_node.testbed.addresses import parse_address
from dfl_node.testbed.async_proxy import AsyncLinkProxy
from dfl_node.testbed.threaded_proxy import LinkProxy

LOOPBACK = "127.0.0.1"
IO_TIMEOUT_S = 5.0  # no socket call of a test blocks longer: a broken proxy fails the test, not hangs it


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        with self.server.lock:
            self.server.connections += 1
        try:
            while data := self.request.recv(65536):
                if self.server.echo:
                    self.request.sendall(data)
                with self.server.lock:
                    self.server.received += len(data)
                    self.server.last_byte_at = time.monotonic()
            self.request.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # reset by the proxy: what a cut does
        finally:
            self.server.ended.release()


class _Server(socketserver.ThreadingTCPServer):
    """A target on 127.0.0.1: echoes (or only counts) what it receives, one thread per connection."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, echo: bool) -> None:
        super().__init__((LOOPBACK, 0), _Handler)
        self.echo = echo
        self.lock = threading.Lock()
        self.connections = 0
        self.received = 0
        self.last_byte_at = 0.0
        self.ended = threading.Semaphore(0)  # released once per connection it has finished with

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), int(port)


def _serving(echo: bool) -> Iterator[_Server]:
    server = _Server(echo)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # shutdown() polls: quick
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(IO_TIMEOUT_S)


@pytest.fixture
def echo() -> Iterator[_Server]:
    yield from _serving(echo=True)


@pytest.fixture
def sink() -> Iterator[_Server]:
    yield from _serving(echo=False)


def connect(port: int) -> socket.socket:
    return socket.create_connection((LOOPBACK, port), timeout=IO_TIMEOUT_S)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        assert piece, f"EOF after {len(data)} of {n} bytes"
        data += piece
    return data


def recv_to_end(sock: socket.socket) -> bytes:
    chunks = []
    while piece := sock.recv(65536):
        chunks.append(piece)
    return b"".join(chunks)


def round_trip(port: int, payload: bytes) -> bytes:
    """``payload`` through the proxy at ``port`` to an echo server and back, then a clean half-close both ways."""
    with connect(port) as sock:
        sender = threading.Thread(target=lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR)))
        sender.start()
        try:
            return recv_to_end(sock)
        finally:
            sender.join(IO_TIMEOUT_S)


def ends_with_reset(sock: socket.socket) -> bool:
    """Reads until the connection ends: True for a reset, False for a clean EOF."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    return False


# --------------------------------------------------------------------------- in-process (LinkProxy)
def test_bytes_pass_both_ways_unchanged(echo: _Server) -> None:
    payload = os.urandom(512 * 1024)
    with LinkProxy(target=echo.address) as proxy:
        assert proxy.port > 0
        assert round_trip(proxy.port, payload) == payload
        assert round_trip(proxy.port, b"second") == b"second"
        # the client's EOF comes after the proxy's last write back: the counters are final by then
        counters = proxy.counters.as_dict()
    assert counters == {"accepted": 2, "cut": 0, "failed": 0, "bytes_client_to_target": len(payload) + 6,
                        "bytes_target_to_client": len(payload) + 6, "bytes_total": 2 * (len(payload) + 6)}


def test_rate_limit_holds_within_ten_percent(sink: _Server) -> None:
    rate, size = 200_000, 300_000
    with LinkProxy(target=sink.address, rate=rate) as proxy, connect(proxy.port) as sock:
        started = time.monotonic()
        sock.sendall(b"r" * size)
        sock.shutdown(socket.SHUT_WR)
        assert recv_to_end(sock) == b""  # the sink has seen our EOF and closed: every byte went through
        with sink.lock:
            received, elapsed = sink.received, sink.last_byte_at - started
        assert proxy.counters.bytes_client_to_target == size
    assert received == size
    measured = size / elapsed
    assert 0.9 * rate <= measured <= 1.1 * rate, f"{measured:.0f} B/s through a {rate} B/s link ({elapsed:.2f} s)"


def test_cut_after_resets_on_time_and_the_next_connection_works(echo: _Server) -> None:
    cut_after = 0.4
    with LinkProxy(target=echo.address, cut_after=cut_after) as proxy:
        started = time.monotonic()
        with connect(proxy.port) as sock:
            sock.sendall(b"before the cut")
            assert recv_exactly(sock, 14) == b"before the cut"
            assert ends_with_reset(sock), "a cut resets the connection, it does not end it cleanly"
            elapsed = time.monotonic() - started
        assert cut_after - 0.2 <= elapsed <= cut_after + 0.2
        assert echo.ended.acquire(timeout=IO_TIMEOUT_S), "the target's side was not closed by the cut"
        counters = proxy.counters
        assert (counters.accepted, counters.cut) == (1, 1)
        assert (counters.bytes_client_to_target, counters.bytes_target_to_client) == (14, 14)

        assert round_trip(proxy.port, b"after the cut") == b"after the cut"  # well inside its own 0.4 s
        proxy.cut_after = None  # for connections accepted from now on
        with connect(proxy.port) as sock:
            sock.sendall(b"x")
            assert recv_exactly(sock, 1) == b"x"
            sock.settimeout(cut_after + 0.2)
            with pytest.raises(TimeoutError):  # outlives the old cut_after
                sock.recv(1)
        assert (proxy.counters.accepted, proxy.counters.cut) == (3, 1)


def test_down_link_resets_at_once_and_forwards_nothing(echo: _Server) -> None:
    with LinkProxy(target=echo.address, down=True) as proxy:
        started = time.monotonic()
        # the reset can come before connect() returns, or after it
        with pytest.raises(ConnectionResetError), connect(proxy.port) as sock:
            sock.sendall(b"lost" * 1000)
            sock.recv(1)
        assert time.monotonic() - started < 0.5
        assert proxy.counters.as_dict() == {"accepted": 1, "cut": 1, "failed": 0, "bytes_client_to_target": 0,
                                            "bytes_target_to_client": 0, "bytes_total": 0}
        assert echo.connections == 0, "a link that is down opened a connection to the target"

        proxy.down = False
        assert round_trip(proxy.port, b"up again") == b"up again"
        assert echo.connections == 1


def test_unreachable_target_is_counted_and_the_client_reset(sink: _Server) -> None:
    with socket.socket() as unused:  # bound, never listening: connecting to it is refused
        unused.bind((LOOPBACK, 0))
        # the reset may reach the client inside connect() (the proxy's dial fails at once), or after it
        with (LinkProxy(target=unused.getsockname()) as proxy, pytest.raises(ConnectionResetError),
              connect(proxy.port) as sock):
            while sock.recv(65536):
                pass
        assert (proxy.counters.accepted, proxy.counters.failed, proxy.counters.cut) == (1, 1, 0)


def test_stop_resets_open_connections_and_joins_the_thread(echo: _Server) -> None:
    proxy = LinkProxy(target=echo.address).start()
    with connect(proxy.port) as sock:
        sock.sendall(b"open")
        assert recv_exactly(sock, 4) == b"open"
        proxy.stop()
        assert ends_with_reset(sock)
    assert not any(t.name.startswith("link-proxy") for t in threading.enumerate())
    with pytest.raises(OSError):
        connect(proxy.port).close()
    assert proxy.counters.cut == 0  # a stop is not a cut


def test_a_taken_port_fails_start(echo: _Server) -> None:
    with pytest.raises(OSError), LinkProxy(target=echo.address, listen=echo.address):
        pass


async def test_async_proxy_inside_a_running_loop() -> None:
    async def echo_back(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        writer.close()

    server = await asyncio.start_server(echo_back, LOOPBACK, 0)
    try:
        async with AsyncLinkProxy(target=(LOOPBACK, server.sockets[0].getsockname()[1])) as proxy:
            reader, writer = await asyncio.open_connection(LOOPBACK, proxy.port)
            writer.write(b"async")
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), IO_TIMEOUT_S) == b"async"
            writer.close()
            assert proxy.counters.now().bytes_total == 10
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("text", "rate"), [("2000", 2000.0), ("100k", 1e5), ("100K", 1e5), ("1.5M", 1.5e6),
                                            (" 7 ", 7.0)])
def test_parse_rate(text: str, rate: float) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["nonsense", "", "0", "-5k", "1T", "1.5MB", "k"])
def test_parse_rate_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:6000") == ("127.0.0.1", 6000)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("127.0.0.1", ":80", "host:port", "host:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_bucket_burst_is_a_twentieth_of_a_second() -> None:
    assert TokenBucket(200_000).burst == 10_000
    assert TokenBucket(10).burst == 1  # never less than a byte
    with pytest.raises(ValueError):
        TokenBucket(0)


# --------------------------------------------------------------------------- command line
@pytest.fixture
def cli_proxy(echo: _Server) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``python -m dfl_node.testbed.proxy`` against ``echo`` on a port of its choosing, and that port."""
    process = subprocess.Popen([sys.executable, "-m", "dfl_node.testbed.proxy", "--listen", f"{LOOPBACK}:0",
                                "--target", f"{LOOPBACK}:{echo.address[1]}", "--rate", "1M"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.fullmatch(rf"listening on {re.escape(LOOPBACK)}:(\d+) -> {re.escape(LOOPBACK)}:\d+\n", line)
        assert match, f"not the listening line: {line!r}"
        yield process, int(match[1])
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=IO_TIMEOUT_S)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_forwards_logs_and_prints_counters_on_signal(cli_proxy: tuple[subprocess.Popen[str], int],
                                                         sig: signal.Signals) -> None:
    process, port = cli_proxy
    payload = os.urandom(20_000)
    assert round_trip(port, payload) == payload
    process.send_signal(sig)
    out, err = process.communicate(timeout=IO_TIMEOUT_S)
    assert process.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary == {"accepted": 1, "cut": 0, "failed": 0, "bytes_client_to_target": 20_000,
                       "bytes_target_to_client": 20_000, "bytes_total": 40_000}
    assert re.search(r"link 1: accepted from 127\.0\.0\.1:\d+", err), err
    # its last line: closed, or (the signal came first) stopped with the proxy
    assert re.search(r"link 1: (closed|stopped) after [\d.]+ s: 20000 B to target, 20000 B back", err), err


@pytest.mark.parametrize(("args", "complaint"), [
    (["--rate", "nonsense"], "argument --rate: not a rate: 'nonsense'"),
    (["--cut-after", "-1"], "argument --cut-after: seconds must be >= 0"),
    (["--listen", "6000"], "argument --listen: not HOST:PORT: '6000'"),
])
def test_cli_refuses_bad_arguments_in_one_line(args: list[str], complaint: str) -> None:
    result = subprocess.run([sys.executable, "-m", "dfl_node.testbed.proxy", "--target", "127.0.0.1:1", *args],
                            capture_output=True, text=True, timeout=IO_TIMEOUT_S)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("python -m dfl_node.testbed.proxy: error: "), result.stderr
    assert complaint in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_cli_help_describes_the_link() -> None:
    result = subprocess.run([sys.executable, "-m", "dfl_node.testbed.proxy", "--help"], capture_output=True,
                            text=True, timeout=IO_TIMEOUT_S)
    assert result.returncode == 0
    for option in ("--listen", "--target", "--rate", "--cut-after", "--down", "netem"):
        assert option in result.stdout
