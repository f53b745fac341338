"""A node's gRPC server: its :class:`~dfl_node.net.servicer.DflServicer` (with the request decoding of
:mod:`dfl_node.net.handlers`), plus the standard health service (and, when asked, server reflection:
:mod:`dfl_node.net.standard`) so that ordinary gRPC tools can probe a node, bound with or without TLS."""

from __future__ import annotations

import grpc

from dfl_node.net.auth import NO_SECURITY, Authenticator, Security
from dfl_node.net.handlers import method_handlers, register
from dfl_node.net.pacing import NO_PACING, Pacing
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.relay import RelayServer
from dfl_node.net.servicer import DflServicer
from dfl_node.net.standard import add_standard_services
from dfl_node.net.wire import SERVICE_NAME, WireIdentity, channel_options
from dfl_node.peering.port import PeerHandler


async def start_server(node: PeerHandler, wire: WireIdentity, idle_timeout: float, host: str, port: int,
                       security: Security = NO_SECURITY, *, reflection: bool = False,
                       pacing: Pacing = NO_PACING, relay: RelayServer | None = None,
                       tunnels: str = "") -> tuple[grpc.aio.Server, int]:
    """Serve the node (plus health, and reflection if asked) on ``host:port``; returns the server and the
    bound port. Received models are checked against ``wire``; a Transfer stream silent for ``idle_timeout`` is
    dropped; model streams keep to ``pacing``'s caps; ``relay`` holds the slots it relays; ``tunnels`` names an
    abstract Unix socket it serves too, where a relayed node's tunnels arrive (:class:`~dfl_node.net.relay.Tunnels`).
    With TLS material in ``security`` both speak mutual TLS only (a client certificate signed by the swarm CA, from
    files or derived from a swarm key, is required).

    SO_REUSEPORT is off (gRPC turns it on by default): with it, a second node on a port in use
    would bind too, and the kernel would split the connections between the two.
    """
    server = grpc.aio.server(options=[*channel_options(wire.limits), ("grpc.so_reuseport", 0)])
    handlers = method_handlers(DflServicer(node, wire, idle_timeout, Authenticator(security), pacing, relay))
    register(server, pb.DESCRIPTOR.services_by_name["DflNode"], handlers)
    add_standard_services(server, (SERVICE_NAME,), node.on_rejected, reflection=reflection)
    def add(address: str) -> int:
        tls = security.tls
        return server.add_secure_port(address, tls.server_credentials()) if tls else server.add_insecure_port(address)

    bound = add(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {host}:{port}")
    if tunnels and not add(f"unix-abstract:{tunnels}"):
        raise OSError(f"cannot listen on the abstract Unix socket {tunnels!r} (the relay's tunnels)")
    await server.start()
    return server, bound
