"""Running a daemon (:class:`~dfl_node.service.wiring.Daemon`): gRPC server, REST server, mDNS, heartbeats and the
scheduler, started and stopped in one place (:func:`running`). Each step registers its undo on one exit stack the
moment it succeeded, so a failed step and a stop are undone by the same code, in reverse.

Start-up is all-or-nothing: the state dir is locked (by :class:`Node`, before it reads the checkpoint),
every socket bound and every check passed (a duplicate id among the static peers) *before* the node
announces itself on mDNS or logs that it serves. Any failure undoes what was taken and raises
:class:`~dfl_node.errors.OperatorError` with one line that says what to change, so a half-started node
never joins a swarm.

Signal handlers are installed *before* the mDNS announcement: a SIGTERM that arrives while the
announcement is under way would otherwise end the process with no goodbye, and peers would keep a
dead node's record for many minutes. So a SIGTERM at any moment still sends the goodbye, and the
final checkpoint is written on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass

import grpc
import torch
import uvicorn
from fastapi import FastAPI
from zeroconf import NonUniqueNameException

from dfl_node import PROTOCOL_VERSION
from dfl_node.api.app import create_app
from dfl_node.errors import OperatorError
from dfl_node.net.allocator import tune_for_streaming
from dfl_node.net.discovery import Announcement, MdnsDiscovery
from dfl_node.net.server import start_server
from dfl_node.node.node import Node
from dfl_node.node.views import rest_url
from dfl_node.service.wiring import Daemon
from dfl_node.settings.node import ApiSettings, NodeConfig

log = logging.getLogger(__name__)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our event loop: the node, not uvicorn, owns SIGINT/SIGTERM; and it wakes once a second,
    not ten times: uvicorn's own loop polls ``should_exit`` every 0.1 s, which was most of an idle node's CPU
    (0.3 % of a core of 0.35 %). :meth:`stop` wakes it at once."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopping = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        ticks = 0
        while not await self.on_tick(ticks):  # a multiple of 10: uvicorn refreshes its Date header on each
            ticks = (ticks + 10) % 864000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._stopping.wait()

    def stop(self) -> None:
        """Finish the open requests, then end :meth:`serve`."""
        self.should_exit = True
        self._stopping.set()


def announcement(node: Node) -> Announcement:
    cfg = node.config
    return Announcement(node_id=cfg.id, swarm=cfg.swarm, host=cfg.network.advertised_host,
                        grpc_port=cfg.network.advertised_port, http_port=cfg.api.http_port, algorithm=cfg.algorithm,
                        fingerprint=node.identity.fingerprint, protocol_version=PROTOCOL_VERSION, boot_id=node.boot_id)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the REST socket ourselves: once bound, requests queue until uvicorn serves them (no start-up race).

    With TCP_NODELAY, which the connections it accepts inherit: asyncio sets it only on sockets made with
    ``proto=IPPROTO_TCP`` (this one's is 0), and without it every answer's body, written after its headers,
    waited for the client's delayed ACK: 44 ms a request, /healthz included."""
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


def _bind_failure(what: str, flag: str, host: str, port: int, exc: OSError, host_flag: str = "--host") -> OperatorError:
    """Why ``host:port`` cannot be bound, in the operator's terms (the errno alone says little)."""
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):  # its errno is a resolver code, not an errno
        return OperatorError(f"cannot bind {where}: {host_flag} {host!r} does not resolve to an address "
                             f"({exc.strerror})")
    if exc.errno == errno.EADDRINUSE:
        return OperatorError(f"{what} port {where} is already in use (another node? choose {flag})")
    if exc.errno == errno.EADDRNOTAVAIL:
        return OperatorError(f"cannot bind {where}: that address is not on this machine "
                             f"({host_flag} must be one of its addresses, or 0.0.0.0"
                             f"{' with --advertise' if host_flag == '--host' else ''})")
    if exc.errno == errno.EACCES:
        return OperatorError(f"cannot bind {where}: permission denied (ports below 1024 need privileges; "
                             f"choose {flag})")
    return OperatorError(f"cannot bind {what} to {where}: {exc.strerror or exc}")


async def _serve_grpc(daemon: Daemon) -> grpc.aio.Server:
    """The gRPC server, bound and serving; a port in use or a foreign --host is one line.

    A plain socket tries the address first: gRPC's own bind error carries no errno and writes a log
    line of its C core to stderr, so it is only the fallback (for a port taken in between).
    """
    network = daemon.config.network
    host, port = network.host, network.grpc_port
    try:
        _listen(host, port).close()
        server, _ = await start_server(daemon.node.requests, daemon.network.wire, network.stream_timeout, host, port,
                                       daemon.security, reflection=network.reflection, pacing=daemon.network.pacing,
                                       relay=daemon.network.relay, tunnels=daemon.network.local)
    except OSError as exc:
        raise _bind_failure("gRPC", "--grpc-port", host, port, exc) from None
    except RuntimeError as exc:  # grpc: "Failed to bind to address …"
        raise OperatorError(f"cannot bind gRPC to {host}:{port}: {exc}") from None
    return server


def _bind_http(api: ApiSettings) -> socket.socket | None:
    if not api.http_port:
        return None
    try:
        return _listen(api.http_host, api.http_port)
    except OSError as exc:
        raise _bind_failure("HTTP", "--http-port", api.http_host, api.http_port, exc, "--http-host") from None


async def _check_static_peers(node: Node) -> None:
    """One Hello to each static peer before we serve: a live node with our id among them stops the start."""
    await node.membership.greet_static()
    node.membership.stop_if_duplicate()


async def _announce_on_mdns(node: Node) -> MdnsDiscovery:
    """Register on mDNS (after every other check passed); zeroconf's probe may also catch a duplicate id. A peer
    announced there is greeted (:meth:`~dfl_node.node.membership.membership.Membership.found`): with mTLS its
    certificate must be for the id it announced (mDNS gives an IP address, which no certificate names)."""
    config = node.config
    try:
        discovery = MdnsDiscovery(announcement(node), bind_host=config.network.host,
                                  on_found=lambda found: node.membership.found(found.grpc_address, found.node_id),
                                  on_lost=node.membership.lost)
        await discovery.start()
    except NonUniqueNameException:
        raise OperatorError(f"node id {config.id!r} is already announced on mDNS by another node; "
                            "give every node its own --id") from None
    except ValueError as exc:  # an --advertise name that does not resolve, an interface that is not there
        raise OperatorError(f"mDNS: {exc}") from None
    return discovery


@dataclass
class Bound:
    """What start-up took that the serving node uses: its REST socket (uvicorn serves it) and its mDNS registration
    (its goodbye comes first when it stops)."""

    http_socket: socket.socket | None
    discovery: MdnsDiscovery | None


async def start_up(daemon: Daemon, undo: contextlib.AsyncExitStack,
                   stop_grpc: Callable[[grpc.aio.Server], Awaitable[None]]) -> Bound:
    """Bind, check, announce (``Node()`` locked the state dir): all or nothing. Each step registers on ``undo`` what
    gives it back the moment it succeeded (the gRPC server's: ``stop_grpc``), so on a failure the steps before are
    undone, in reverse, and :class:`OperatorError` says why; nothing was announced and no checkpoint was written."""
    node, config = daemon.node, daemon.config
    with node.membership.start_checks():  # until the end, a live node with our id stops the start
        grpc_server = await _serve_grpc(daemon)
        undo.push_async_callback(stop_grpc, grpc_server)
        http_socket = _bind_http(config.api)
        if http_socket:
            undo.callback(http_socket.close)
        await _check_static_peers(node)
        discovery = None
        if config.membership.mdns:
            discovery = await _announce_on_mdns(node)
            undo.push_async_callback(discovery.stop)
        node.membership.stop_if_duplicate()  # a Hello with our id arrived while we were starting
    return Bound(http_socket, discovery)


class _Work:
    """What a serving node runs: uvicorn on its REST socket, and its own tasks (heartbeats and scheduler, the wait
    of ``--exit-when-done``). Stopped together: the tasks cancelled, uvicorn told to finish its open requests, then
    all awaited (their errors are not the stop's)."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None

    def serve_http(self, app: FastAPI, sock: socket.socket) -> None:
        # no WebSocket route: ws="auto" would import wsproto (80 ms, 0.6 MB) for nothing
        self._http = _EmbeddedUvicorn(uvicorn.Config(app, log_level="warning", lifespan="off", ws="none"))
        self._http_task = asyncio.get_running_loop().create_task(self._http.serve(sockets=[sock]))

    def run(self, work: Coroutine[object, object, None]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(work))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._http:
            self._http.stop()  # uvicorn finishes its open requests, then its task ends
        await asyncio.gather(*self._tasks, *([self._http_task] if self._http_task else []), return_exceptions=True)


async def serve(config: NodeConfig, stop: asyncio.Event | None = None) -> Daemon:
    """Build the daemon and run it until ``stop`` is set (or SIGINT/SIGTERM); returns it for inspection."""
    torch.set_num_threads(config.learning.threads)
    tune_for_streaming()  # process-wide, so here rather than in run_node (which tests run in their own process)
    daemon = Daemon.build(config)
    await run_node(daemon, stop or asyncio.Event())
    return daemon


async def _stop_when_done(node: Node, stop: asyncio.Event) -> None:
    """``--exit-when-done``: stop once this node's run is over. In round mode, first until every peer it sees
    alive says it is done too, for ``peer_timeout`` at most: a peer that missed the final announcement learns
    it from a node still up (``RoundScheduler.on_join``), so the last ones must not all leave at once."""
    await node.scheduler.finished.wait()
    membership = node.config.membership
    deadline = node.clock.monotonic() + membership.peer_timeout
    while node.config.schedule.mode == "round" and node.clock.monotonic() < deadline:
        await node.membership.refresh()
        if all(progress.done for progress in node.membership.progress().values()):
            break
        await asyncio.sleep(membership.heartbeat)
    log.info("%s: done, exiting (--exit-when-done)", node.node_id)
    stop.set()


def _log_serving(daemon: Daemon) -> None:
    """The line that says the node serves, and a warning for what it serves with no authentication."""
    node, config = daemon.node, daemon.config
    network = config.network
    log.info("%s serving gRPC on %s:%d (advertised %s), swarm %r, %s/%s, authentication: %s",
             config.id, network.host, network.grpc_port, node.address, config.swarm, config.algorithm,
             config.schedule.mode, daemon.security.mode)
    if network.open_to_network:  # allowed only with --insecure (NodeConfig refuses it otherwise)
        log.warning("%s is INSECURE: it serves %s with no authentication (--insecure), so anyone who reaches it can "
                    "push a model into it; use --tls-dir or --swarm-key-file beyond a private network",
                    config.id, network.host)
    if config.api.open_to_network:  # allowed only with --insecure, as above
        log.warning("%s's REST API on %s needs no token (--insecure): anyone who reaches it can take the model and "
                    "ask for predictions; use --http-token-file beyond a private network", config.id,
                    config.api.http_host)


async def _say_goodbye(node_id: str, discovery: MdnsDiscovery | None) -> None:
    """A stop begins with the goodbye, before the node's work stops: peers drop it now, not after its REST requests
    finish. (:meth:`MdnsDiscovery.stop` is idempotent: start-up's undo of the announcement is then a no-op.)"""
    log.info("%s stopping", node_id)
    if discovery:
        await discovery.stop()


@contextlib.asynccontextmanager
async def running(daemon: Daemon, stop: asyncio.Event) -> AsyncIterator[None]:
    """The daemon started, serving while the ``async with`` body runs, then stopped: both in this one place.

    Each step registers its undo on one exit stack for the daemon's lifetime right when it succeeded, so whatever
    ends it — a failed step, the body's end, a cancellation — undoes what was started, in reverse. Until the "serving"
    line that is :func:`start_up`, all or nothing. A node that served is stopped as such: its "stopping" line and
    mDNS goodbye first, gRPC given a second for the calls under way, its final checkpoint written before the state
    dir is released, then its "stopped" line; a failed start writes none of them.
    """
    node, config = daemon.node, daemon.config
    served = False  # set once start-up got through: leaving then is a stop, not an undone start

    async def leave_state_dir() -> None:
        """The lock ``Node()`` took before it read its checkpoint, given back after the final checkpoint."""
        try:
            if served:
                await node.save(copy=True)
        finally:
            node.learner.checkpoint.lock.release()
        if served:
            log.info("%s stopped at round %d (checkpoint in %s)", config.id, node.progress.round,
                     node.learner.checkpoint.directory)

    async def stop_grpc(server: grpc.aio.Server) -> None:
        await server.stop(grace=1.0 if served else None)
        node.roles.stop_waiting()  # nothing can arrive now: the checkpoint after must not wait for a group's deadline

    async with contextlib.AsyncExitStack() as undo:
        undo.push_async_callback(leave_state_dir)
        undo.push_async_callback(daemon.network.close)  # its channels to peers and its relay: once nothing is served
        bound = await start_up(daemon, undo, stop_grpc)
        served = True
        _log_serving(daemon)
        work = _Work()
        undo.push_async_callback(work.stop)
        undo.push_async_callback(_say_goodbye, config.id, bound.discovery)
        if bound.http_socket:
            node.metrics.add_process_metrics()  # this process is the node's own
            work.serve_http(create_app(node, token=daemon.http_token), bound.http_socket)
            log.info("%s: dashboard and REST API on %s/ (metrics at /metrics)", config.id, rest_url(config))
        await node.start()
        work.run(node.run())
        if config.schedule.exit_when_done:
            work.run(_stop_when_done(node, stop))
        yield


async def run_node(daemon: Daemon, stop: asyncio.Event) -> None:
    """Run the daemon (:func:`running`) until ``stop`` is set; SIGINT and SIGTERM set it, from before the node
    announces itself on mDNS."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    async with running(daemon, stop):
        await stop.wait()
