"""How a call between peers fails, whatever the network: each failure with a short stable ``reason``
(counted in ``/status``, matched by code) and a ``detail`` for people."""

from __future__ import annotations


class PeerError(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class TransferRejected(PeerError):
    """This node refuses what a peer sent or asked for (busy, stale epoch, a malformed stream…): the
    receiving side's refusal, which the network reports back to the peer."""


class TransferRefused(PeerError):
    """The peer said no to our call (busy, incompatible, invalid), or our channel to it is gone."""


class PeerUnreachable(PeerError):
    """Nothing answered our call (in time). ``reason``: the network's status, e.g. ``unavailable``,
    ``deadline_exceeded``; ``detail``: why, in an operator's words (the rest of "peer ADDRESS …")."""


class PeerUnauthenticated(PeerError):
    """A peer answered our Hello without proving who it is: ``tls_handshake`` (its certificate failed our
    checks, or ours its), or a swarm-key failure (``unauthenticated``, ``auth_failed``)."""
