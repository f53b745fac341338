"""How a client's gRPC failures read as the port's (:mod:`dfl_node.peering.errors`): a call that got no answer,
in an operator's words, and a call that its connection cut.

:class:`~dfl_node.net.client.PeerClient` raises these in place of gRPC's statuses, so that nothing above the
network sees gRPC.
"""

from __future__ import annotations

import grpc

from dfl_node.peering.errors import PeerUnreachable


def why_unanswered(exc: grpc.aio.AioRpcError, timeout: float) -> str:
    """Why a call got no answer, in an operator's words (the rest of a log line "peer ADDRESS …"): gRPC
    says it in one UNAVAILABLE status with the resolver's or the socket's text inside."""
    details = (exc.details() or "")[:200]
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"does not answer within {timeout:g} s"
    if "resolv" in details.lower():  # "errors resolving …" (c-ares), "DNS resolution failed …" (native)
        return f"does not resolve ({details})"
    if "Connection refused" in details:
        return "refuses connections (nothing listens on that port)"
    return f"is unreachable ({exc.code().name}: {details})"


def unreachable(exc: grpc.aio.AioRpcError, timeout: float) -> PeerUnreachable:
    """The port's failure for a call that got no answer (:func:`why_unanswered`)."""
    return PeerUnreachable(exc.code().name.lower(), why_unanswered(exc, timeout))


def was_cut(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a call that had begun ended because its connection did (the link dropped, or the peer died): gRPC
    says so with UNAVAILABLE (or INTERNAL, CANCELLED: a stream reset, a server gone under the call)."""
    return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)

