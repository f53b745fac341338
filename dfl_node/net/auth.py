"""Who may talk to a node, and as whom: the answering side of mutual TLS, with the swarm's CA from files or derived
from a swarm key.

A node brings its :class:`Security` (checked TLS material, or none). Its gRPC server asks its
:class:`Authenticator` on every RPC: a Hello must come from the node it names (the caller's certificate CN), and
a request that names its sender must name the one its certificate proved. Without TLS, every check passes, as
before (the default; README "Security model").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.tls import TlsError, TlsMaterial, caller_id, load_tls, tls_files


@dataclass(frozen=True)
class Security:
    tls: TlsMaterial | None = field(default=None, repr=False)  # never in a repr, a log line or a status
    swarm_key: bool = False  # the TLS material derives from a swarm key (dfl_node.net.swarm_tls)

    @property
    def mode(self) -> str:
        """``mtls``, ``swarm-key`` or ``none``: what ``/status`` and the start-up line say."""
        if self.tls is None:
            return "none"
        return "swarm-key" if self.swarm_key else "mtls"


NO_SECURITY = Security()


def load_security(node_id: str, *, tls_dir: Path | None = None, tls_ca: Path | None = None,
                  tls_cert: Path | None = None, tls_key: Path | None = None, swarm_key_file: Path | None = None,
                  hosts: tuple[str | None, ...] = ()) -> Security:
    """What a node's settings ask for, checked: ``ValueError`` (:class:`~dfl_node.net.tls.TlsError`,
    :class:`~dfl_node.secret_file.SecretFileError`) with one line when a file is missing or unusable — a node that
    was told to authenticate never runs without it. A swarm key gives this node a certificate for ``node_id`` and
    ``hosts`` (the addresses it serves on and advertises), issued now by the CA the key derives."""
    files = tls_files(tls_dir, tls_ca, tls_cert, tls_key)
    if files and swarm_key_file:
        raise TlsError("--swarm-key-file and mutual TLS (--tls-dir, --tls-ca/--tls-cert/--tls-key) are two ways to "
                       "the same TLS, with a CA derived from the key or the CA of the files: give one")
    if swarm_key_file:
        from dfl_node.net.swarm_tls import read_swarm_keys, swarm_tls  # cryptography only where TLS is on

        return Security(swarm_tls(read_swarm_keys(swarm_key_file), node_id, hosts), swarm_key=True)
    return Security(load_tls(files, node_id) if files else None)


class Authenticator:
    def __init__(self, security: Security = NO_SECURITY) -> None:
        self.enabled = security.tls is not None

    def hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> str | None:
        """Why this Hello does not come from the node it names (a stable reason), or None."""
        if self.enabled and caller_id(context) != request.node_id:
            return "identity_mismatch"
        return None

    def refusal(self, context: grpc.aio.ServicerContext, claimed: str | None = None) -> tuple[str, str] | None:
        """(reason, detail) when an RPC may not be served: the connection proved no node id (``unauthenticated``),
        or the request names a sender other than the one it proved (``identity_mismatch``); None when it may."""
        if not self.enabled:
            return None
        caller = caller_id(context)
        if caller is None:
            return "unauthenticated", f"{context.peer()} presented no certificate with a node id"
        if claimed is not None and claimed != caller:
            return "identity_mismatch", f"{context.peer()} authenticated as {caller!r} but says it is {claimed[:64]!r}"
        return None
