"""Running a node: gRPC server, REST server, mDNS, heartbeats and the scheduler, started and stopped in order.

Signal handlers are installed *before* the mDNS announcement, so a SIGTERM at any moment still
sends the goodbye (networking notes), and the final checkpoint is written on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import torch
import uvicorn

from dfl_node import PROTOCOL_VERSION
from dfl_node.api.app import create_app
from dfl_node.net.allocator import tune_for_streaming
from dfl_node.net.discovery import Announcement, MdnsDiscovery
from dfl_node.net.transport import start_server
from dfl_node.node.config import NodeConfig
from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our event loop: the node, not uvicorn, owns SIGINT/SIGTERM."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def announcement(node: Node) -> Announcement:
    cfg = node.config
    return Announcement(node_id=cfg.id, swarm=cfg.swarm, host=cfg.advertised_host, grpc_port=cfg.grpc_port,
                        http_port=cfg.http_port, algorithm=cfg.algorithm, fingerprint=node.fingerprint,
                        protocol_version=PROTOCOL_VERSION, boot_id=node.boot_id)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the REST socket ourselves: once bound, requests queue until uvicorn serves them (no start-up race)."""
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setblocking(False)
    return sock


async def serve(config: NodeConfig, stop: asyncio.Event | None = None) -> Node:
    """Build the node and run it until ``stop`` is set (or SIGINT/SIGTERM); returns it for inspection."""
    torch.set_num_threads(config.threads)
    tune_for_streaming()  # process-wide, so here rather than in run_node (which tests run in their own process)
    node = Node(config)
    await run_node(node, stop or asyncio.Event())
    return node


async def run_node(node: Node, stop: asyncio.Event) -> None:
    """Start everything in order, set ``node.ready``, wait for ``stop``, stop everything in reverse order."""
    config = node.config
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    grpc_server, port = await start_server(node, config.host, config.grpc_port)
    log.info("%s serving gRPC on %s:%d (advertised %s), swarm %r, %s/%s",
             config.id, config.host, port, node.grpc_address, config.swarm, config.algorithm, config.mode)
    workers: list[asyncio.Task] = []
    http, http_task = None, None
    if config.http_port:
        http = _EmbeddedUvicorn(uvicorn.Config(create_app(node.status, node.get_history), log_level="warning",
                                               lifespan="off"))
        http_task = loop.create_task(http.serve(sockets=[_listen(config.host, config.http_port)]))
    discovery = None
    if config.mdns:
        discovery = MdnsDiscovery(announcement(node), bind_host=config.host,
                                  on_found=lambda a: loop.create_task(node.peers.probe(a.grpc_address)),
                                  on_lost=node.peers.lost)
    try:
        if discovery:
            await discovery.start()
        if config.evaluate and not node.history:
            await node.model_changed("eval", node.round, None)  # the w0 point of the accuracy curve
        workers = [loop.create_task(node.peers.run()), loop.create_task(node.scheduler.run())]
        node.ready.set()
        await stop.wait()
    finally:
        log.info("%s stopping", config.id)
        if discovery:
            await discovery.stop()
        for task in workers:
            task.cancel()
        if http:
            http.should_exit = True  # uvicorn finishes its open requests, then its task ends
        await asyncio.gather(*workers, *([http_task] if http_task else []), return_exceptions=True)
        await grpc_server.stop(grace=1.0)
        for client in node.clients.values():
            await client.close()
        await node.settled()
        await node.save()
