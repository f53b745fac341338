"""A node's monotonic counters (sends, fusions, bytes, probes…): kept by its tally, saved in its checkpoint, served
flattened at the top level of ``/status`` (:class:`~dfl_node.records.status.NodeStatus` inherits them) and counted
by ``/metrics``."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["COUNTER_FIELDS", "Counters"]


class Counters(BaseModel):
    """Monotonic traffic/work counters of a node (since its state was created, survive restarts)."""

    models_sent: int = 0
    models_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    fusions: int = 0
    rounds_completed: int = 0
    busy_refusals: int = 0
    senders_abandoned: int = 0  # senders an aggregator left out: their transfer never came (in time)
    groups_abandoned: int = 0  # round mode, as holder: groups whose members, alive, refused for a round_timeout
    probes_sent: int = 0  # client selection (001): probes this node sent to candidate receivers
    probes_unanswered: int = 0  # … of which no valid answer came in time (skipped: silent, refused, invalid)
    probes_answered: int = 0  # probes this node answered as a candidate
    transfers_cut: int = 0  # model streams a link cut mid-way, at either end (resumed where they could be)
    bytes_resent: int = 0  # bytes this node sent again because a stream was cut
    groups_replanned: int = 0  # round mode, as holder: groups that failed group_attempts times, planned around
    rounds_held: int = 0  # round mode: rounds this node played as the token's holder (planned, saw fused)


COUNTER_FIELDS = tuple(Counters.model_fields)
