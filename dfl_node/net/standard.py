"""gRPC's standard services on a node's port: health always, server reflection only when asked.

Both are served through :func:`~dfl_node.net.handlers.service_handlers`, like the node's own service, so
that bytes from anyone who reaches the port are decoded by us: a request that does not decode is refused
(INVALID_ARGUMENT) and counted (``undecodable``), never an ERROR with a traceback. grpcio's own health
servicer, registered the generated way, logged one for every malformed request and another for every List
(which it does not implement).

Health is static: while the server runs, the server (``""``) and ``dfl.v1.DflNode`` are SERVING; whether the
node takes part in rounds is ``/status``'s business. So Check and List are all a probe needs
(``grpc_health_probe``, Kubernetes' ``grpc:`` probes); Watch, whose stream would stay open for as long as the
node runs (one per caller, unbounded), is refused with UNIMPLEMENTED: poll Check.

Reflection is a debugging aid (``grpcurl``): off unless ``--reflection``. It lists the services and hands
out their descriptors to anyone who asks, which a deployment has no use for; grpcio-reflection is imported
only then (2.5 MB of a node's memory otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_health.v1 import health_pb2

from dfl_node.net.handlers import OnRejected, register, service_handlers

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
SERVING = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class Health:
    """``grpc.health.v1.Health``: the server (``""``) and each of ``services`` are SERVING."""

    def __init__(self, services: Iterable[str]) -> None:
        self.services = frozenset(("", *services))

    async def Check(self, request: health_pb2.HealthCheckRequest,  # noqa: N802  (gRPC's method names)
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        if request.service not in self.services:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service[:100]!r}")
        return SERVING

    async def List(self, request: health_pb2.HealthListRequest,  # noqa: N802
                   context: grpc.aio.ServicerContext) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(statuses={name: SERVING for name in self.services})

    async def Watch(self, request: health_pb2.HealthCheckRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext):  # noqa: ANN201  (an async generator that never yields)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not served: poll Check")
        yield SERVING  # unreachable: makes this an async generator, as a server-streaming handler must be


def add_standard_services(server: grpc.aio.Server, services: Iterable[str], on_rejected: OnRejected, *,
                          reflection: bool = False) -> None:
    """Serve health for ``services`` (the names of the services already on ``server``) and, with
    ``reflection``, server reflection of all of them; undecodable requests go to ``on_rejected``."""
    services = tuple(services)
    register(server, HEALTH, service_handlers(HEALTH, Health(services), on_rejected))
    if reflection:
        from grpc_reflection.v1alpha import reflection_pb2
        from grpc_reflection.v1alpha._async import ReflectionServicer

        service = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
        names = (*services, HEALTH.full_name, service.full_name)
        register(server, service, service_handlers(service, ReflectionServicer(names), on_rejected))
