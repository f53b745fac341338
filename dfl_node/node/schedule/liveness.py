"""The round mode's liveness bound: how long after a member's crash a fleet of token-passing nodes may go
without fusing. Its own module, apart from the scheduler (:mod:`.rounds`) that it bounds, because the simulator's
fault schedules and the chaos tests space their kills by it without needing a scheduler.

A member that crashes and is serving again within ``peer_timeout`` (the shortest suspicion)
was never seen to leave, and nobody waits for it to come back: its first Hello or gossip after the restart
carries a new boot id, and an aggregator that expects it stops waiting as soon as it hears it
(:meth:`~dfl_node.node.exchange.absences.Absences.peer_joined`), as the holder's own Assign to its old incarnation
failed with its connection.
A member that stays down is known dead by every member within the membership's detection bound
(:func:`~dfl_node.node.membership.swim_bounds.detection_bound`: a few probe periods, the longest suspicion, the
gossip's rounds), and one back within ``peer_timeout`` is known under its new boot within
:func:`~dfl_node.node.membership.swim_bounds.notice_bound`. So the fleet fuses again within
``detection + token_timeout + 2·heartbeat + min(1 s, token_timeout/4)`` plus one round's own work:
the restart (or the crash) known, a lost token's ``token_timeout`` of silence, the watchdog's
tick and the holder's replay period. A *holder* that crashes may have assigned an aggregator and not yet
its senders: once that aggregator sees the holder restarted (or gone), it asks its peers where they
stand and stops waiting for those that play no role, which were never assigned, rather than at its deadline,
as its role would otherwise count as the token at work and keep it from being regenerated; the senders that
were assigned still send, and are fused (:meth:`~dfl_node.node.exchange.absences.Absences._holder_gone`). A member
down for longer is waited for up to ``round_timeout`` more (it may be the only one that knows the newest round): then
add ``round_timeout``.
:func:`liveness_bound` computes it; ``tests/test_faults.py``'s real storm and ``tests/test_sim_storms.py``'s
in-process ones check it after every kill.
"""


def liveness_bound(*, detection: float, token_timeout: float, heartbeat: float, round_timeout: float,
                   quick: bool) -> float:
    """The module's "Liveness" bound, without the round's own work: how long after a member's crash the fleet
    may go without fusing — back within ``peer_timeout`` (``quick``), or later (``round_timeout`` more);
    ``detection``: the membership's notice bound (``quick``) or its detection bound for the fleet."""
    bound = detection + token_timeout + 2 * heartbeat + min(1.0, token_timeout / 4)
    return bound if quick else bound + round_timeout
