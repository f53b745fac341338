"""The composition root of ``dfl-node start``: a node built on gRPC, with the security its settings ask for.

The node knows nothing of gRPC, TLS or the swarm key: this module checks the security settings first (a node told
to authenticate never runs without it), then builds the :class:`~dfl_node.node.node.Node` with a network factory
that turns the node's model identity into the wire's (:class:`~dfl_node.net.wire.WireIdentity`: the codec's
manifests and limits) and a :class:`~dfl_node.net.network.GrpcNetwork` over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dfl_node.errors import OperatorError
from dfl_node.net.auth import Security, load_security
from dfl_node.net.manifest import Limits, Manifest, manifest_of
from dfl_node.net.network import GrpcNetwork
from dfl_node.net.pacing import Pacing
from dfl_node.net.relay import RelayServer
from dfl_node.net.wire import WireIdentity
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.identity import ModelIdentity, NetworkFactory
from dfl_node.node.node import Node
from dfl_node.peering.messages import Hello
from dfl_node.secret_file import SecretFileError, read_secret
from dfl_node.settings.node import NodeConfig


def security_of(config: NodeConfig) -> Security:
    """Mutual TLS and/or the swarm key, as ``config`` asks: checked first, and never silently left out (a missing
    or unusable file is the one-line :class:`OperatorError`)."""
    network = config.network
    try:
        return load_security(config.id, tls_dir=network.tls_dir, tls_ca=network.tls_ca, tls_cert=network.tls_cert,
                             tls_key=network.tls_key, swarm_key_file=network.swarm_key_file,
                             hosts=(network.host, network.advertised_host if network.advertise else None))
    except ValueError as exc:
        raise OperatorError(str(exc)) from None


def http_token_of(config: NodeConfig) -> bytes | None:
    """The REST API's bearer token, read at start (``--http-token-file``): a missing or short file is the one-line
    :class:`OperatorError`, never a REST API served without the token it was told to require."""
    path = config.api.http_token_file
    try:
        return read_secret(path, "REST token", "http-token") if path is not None else None
    except SecretFileError as exc:
        raise OperatorError(str(exc)) from None


def wire_identity(identity: ModelIdentity) -> WireIdentity:
    """The node's model identity as the codec checks received models against it."""
    resolve = identity.resolve
    manifests: Callable[[str], tuple[str, Manifest]] | None = None
    if resolve is not None:
        def manifests(model: str) -> tuple[str, Manifest]:
            found, layout = resolve(model)
            return found, manifest_of(layout)

    return WireIdentity(identity.swarm, identity.model, identity.fingerprint, manifest_of(identity.layout), Limits(),
                        manifests, wire_dtype=identity.wire_dtype)


def grpc_network(config: NodeConfig, security: Security) -> NetworkFactory:
    """The factory of a daemon's network: gRPC with ``security``."""
    def build(identity: ModelIdentity, _hello: Callable[[], Hello]) -> GrpcNetwork:  # TLS proves who we are
        network = config.network
        relay = (RelayServer(config.id, network.host, network.advertised_host, network.relay_slots, network.relay_rate,
                             network.relay_bytes) if network.relay_slots else None)
        return GrpcNetwork(wire_identity(identity), security, connect_timeout=network.connect_timeout,
                           retire_after=config.schedule.round_timeout,
                           pacing=Pacing.of(network.max_upload, network.max_download),
                           relay=relay)

    return build


@dataclass(frozen=True)
class Daemon:
    """What ``dfl-node start`` runs: a node on the real clock, its gRPC network, the security it was built with and
    its REST API's token (:func:`dfl_node.service.run.run_node` serves it)."""

    node: Node
    network: GrpcNetwork
    security: Security
    http_token: bytes | None

    @classmethod
    def build(cls, config: NodeConfig) -> Daemon:
        security, http_token = security_of(config), http_token_of(config)
        node = Node(config, grpc_network(config, security), Clock())
        assert isinstance(node.network, GrpcNetwork)
        return cls(node, node.network, security, http_token)

    @property
    def config(self) -> NodeConfig:
        return self.node.config
