"""How a call between peers fails, whatever the network: each failure with a short stable ``reason``
(counted in ``/status``, matched by code) and a ``detail`` for people."""

from __future__ import annotations

# Refusals that a node answers (a Pull's result, a ProbeReply, an Ack) rather than raises, and that the network
# does not count (every network counts the others with PeerHandler.on_rejected): a busy node (counted apart,
# busy_refusals), a sender's own transfer that failed or that its aggregator did not fuse (outcomes of the role
# it took, not refusals: round mode's holder plays such a round again) and a bad probe (the node counts it where
# it knows the detail).
UNCOUNTED_REFUSALS = frozenset({"busy", "transfer_failed", "not_fused", "bad_probe"})


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


class TransferCut(PeerUnreachable):
    """A model stream broke after it began (the link dropped, or the peer died): what had arrived may be resumed
    (:mod:`dfl_node.peering.resume`). ``reason`` is ``cut``."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("cut", detail)


class PeerUnauthenticated(PeerError):
    """A peer answered our Hello without proving who it is: ``tls_handshake`` (its certificate failed our
    checks, or ours its), or ``identity_mismatch`` (it answers as another node than its certificate's)."""
