"""The bounds of :mod:`.swim`'s failure detector and gossip, derived from the membership settings and the fleet's
size: what the simulator's figures, the round-mode liveness bound (:mod:`~dfl_node.node.schedule.liveness`) and
the tests hold it to.

Liveness bound. A member that crashes is probed by some member in each period with probability ~1 − 1/e, and
each live member reaches it in its round robin within 2 N periods; from the first failed probe it is suspected
within one period, known suspect everywhere within the gossip's O(log N) periods, and dead everywhere at most
``max`` later: :func:`detection_bound`.
"""

from __future__ import annotations

import math

from dfl_node.settings.node import MembershipSettings

SYNC_BASE_MEMBERS = 32  # beyond this many members the push-pull interval grows (memberlist's pushPullScale)


def suspicion_timeouts(settings: MembershipSettings, members: int) -> tuple[float, float]:
    """Lifeguard's (min, max) suspicion timeout in a fleet of ``members``."""
    low = settings.peer_timeout * max(1.0, math.log10(max(members, 1)))
    return low, settings.suspicion_max * low


def detection_bound(settings: MembershipSettings, members: int) -> float:
    """How long after a crash every live member knows it dead, with high probability: six periods for some member
    to probe it (each period a probe misses it with probability ~1/e, ~1/√e while members confirm others in every
    other period: :meth:`.swim.Swim.run`), one for the indirect probes, the longest suspicion timeout, and the gossip's
    retransmission rounds for the news to reach every member."""
    period, rounds = settings.heartbeat, settings.retransmit_mult * math.ceil(math.log10(members + 1))
    return (6 + 1) * period + suspicion_timeouts(settings, members)[1] + rounds * period


def join_bound(settings: MembershipSettings, members: int) -> float:
    """How long after a new member starts every member knows it, with high probability: a period for its first
    Hello and push-pull (a join through a member it was given), then twice the gossip's retransmission rounds for
    its news to reach every member: an update is sent on ``retransmit_mult · ⌈log10(N + 1)⌉`` messages of each
    member that learns it, and while members confirm others by Hellos (which carry no gossip) one period in two
    carries a ping of theirs."""
    rounds = settings.retransmit_mult * math.ceil(math.log10(members + 1))
    return (1 + 2 * rounds) * settings.heartbeat


def notice_bound(settings: MembershipSettings, members: int) -> float:
    """How long after a crash every member knows a member that restarted within ``peer_timeout`` (never declared
    dead) under its new boot: back by then, its first period's Hello (or probe) to a member, and the gossip's
    retransmission rounds from there."""
    rounds = settings.retransmit_mult * math.ceil(math.log10(members + 1))
    return settings.peer_timeout + (1 + rounds) * settings.heartbeat


def sync_interval(settings: MembershipSettings, members: int) -> float:
    """memberlist's push-pull interval: ``sync_interval``, times ⌈log2 N − log2 32⌉ + 1 beyond 32 members."""
    if members <= SYNC_BASE_MEMBERS:
        return settings.sync_interval
    return settings.sync_interval * (math.ceil(math.log2(members) - math.log2(SYNC_BASE_MEMBERS)) + 1)
