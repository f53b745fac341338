"""A node's gRPC server: its :class:`~dfl_node.net.servicer.DflServicer` (with the request decoding of
:mod:`dfl_node.net.handlers`), plus the standard health service and server reflection so that ordinary
gRPC tools can inspect a node, bound with or without TLS."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dfl_node.net.auth import NO_SECURITY, Authenticator, Security
from dfl_node.net.handlers import method_handlers
from dfl_node.net.servicer import DflServicer, NodeHandler
from dfl_node.net.wire import SERVICE_NAME, channel_options


async def start_server(node: NodeHandler, host: str, port: int,
                       security: Security = NO_SECURITY) -> tuple[grpc.aio.Server, int]:
    """Serve the node (plus health and reflection) on ``host:port``; returns the server and the bound port.
    With TLS material in ``security`` the port speaks mutual TLS only (a client certificate signed by the
    swarm CA is required); with a swarm key, RPCs other than Hello need an authenticated connection.

    SO_REUSEPORT is off (gRPC turns it on by default): with it, a second node on a port in use
    would bind too, and the kernel would split the connections between the two.
    """
    server = grpc.aio.server(options=[*channel_options(node.wire.limits), ("grpc.so_reuseport", 0)])
    handlers = method_handlers(DflServicer(node, Authenticator(security)))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if security.tls is not None:
        bound = server.add_secure_port(f"{host}:{port}", security.tls.server_credentials())
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {host}:{port}")
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, bound
