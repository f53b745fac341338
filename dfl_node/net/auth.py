"""Who may talk to a node, and as whom: the answering side of mutual TLS and of the swarm key.

A node brings its :class:`Security` (checked TLS material, a swarm key, both or neither). Its gRPC
server asks its :class:`Authenticator` on every RPC: a Hello must come from the node it names (mTLS:
the caller's certificate CN; swarm key: the Hello's proof, :mod:`dfl_node.net.psk`), and every other
RPC must come on an authenticated connection, in the name it proved where the request names its
sender. Without either, every check passes, as before (the default; README "Security model").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.psk import PskServer, read_swarm_key
from dfl_node.net.tls import TlsMaterial, caller_id, load_tls, tls_files


@dataclass(frozen=True)
class Security:
    tls: TlsMaterial | None = field(default=None, repr=False)
    swarm_key: bytes | None = field(default=None, repr=False)  # never in a repr, a log line or a status

    @property
    def mode(self) -> str:
        """``mtls``, ``psk``, ``mtls+psk`` or ``none``: what ``/status`` and the start-up line say."""
        modes = [name for name, on in (("mtls", self.tls), ("psk", self.swarm_key)) if on]
        return "+".join(modes) or "none"


NO_SECURITY = Security()


def load_security(node_id: str, *, tls_dir: Path | None = None, tls_ca: Path | None = None,
                  tls_cert: Path | None = None, tls_key: Path | None = None,
                  swarm_key_file: Path | None = None) -> Security:
    """What a node's settings ask for, checked: ``ValueError`` (:class:`~dfl_node.net.tls.TlsError`,
    :class:`~dfl_node.secret_file.SecretFileError`) with one line when a file is missing or unusable — a node that
    was told to authenticate never runs without it."""
    files = tls_files(tls_dir, tls_ca, tls_cert, tls_key)
    tls = load_tls(files, node_id) if files else None
    key = read_swarm_key(swarm_key_file) if swarm_key_file else None
    return Security(tls, key)


class Authenticator:
    def __init__(self, security: Security = NO_SECURITY) -> None:
        self.tls = security.tls is not None
        self.psk = PskServer(security.swarm_key) if security.swarm_key else None

    @property
    def enabled(self) -> bool:
        return self.tls or self.psk is not None

    def hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> str | None:
        """Why this Hello does not come from the node it names (a stable reason), or None. A Hello that
        authenticates with the swarm key authenticates its connection too."""
        if self.tls and caller_id(context) != request.node_id:
            return "identity_mismatch"
        if self.psk is not None:
            reason = self.psk.verify(request, context.peer())
            if reason:
                return reason
            self.psk.bind(context.peer(), request.node_id)
        return None

    def sign(self, request: pb.HelloRequest, reply: pb.HelloReply) -> None:
        if self.psk is not None:
            self.psk.sign(request, reply)

    def caller(self, context: grpc.aio.ServicerContext) -> str | None:
        """The node id this connection proved; None when it proved none."""
        tls_id = caller_id(context) if self.tls else None
        if self.psk is None:
            return tls_id
        psk_id = self.psk.session(context.peer())
        return psk_id if not self.tls or psk_id == tls_id else None

    def refusal(self, context: grpc.aio.ServicerContext, claimed: str | None = None) -> tuple[str, str] | None:
        """(reason, detail) when an RPC may not be served: the connection is not authenticated
        (``unauthenticated``), or the request names a sender other than the one it proved
        (``identity_mismatch``); None when it may."""
        if not self.enabled:
            return None
        caller = self.caller(context)
        if caller is None:
            return "unauthenticated", f"{context.peer()} has not authenticated (a Hello with the swarm key first)"
        if claimed is not None and claimed != caller:
            return "identity_mismatch", f"{context.peer()} authenticated as {caller!r} but says it is {claimed[:64]!r}"
        return None
