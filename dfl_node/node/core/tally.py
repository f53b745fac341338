"""What a node counts: its counters (sends, fusions, bytes, probes…), the requests it refused by reason, its recent
sends, fusions and refusals (``/fleet``), and the timings and sizes ``/metrics`` observes. One owner: every part
of the node counts through :class:`Tally`'s methods; ``/status`` and the checkpoint read it.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from dfl_node.node.core.clock import Clock
from dfl_node.node.core.logs import RateLimitedLog
from dfl_node.node.core.progress import RoundProgress
from dfl_node.records.fleet import FleetEvent
from dfl_node.records.metrics import NodeMetrics, Timed

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits
RECENT_LIMIT = 50  # /fleet's recent sends, fusions and refusals (this process only: not checkpointed)


class Tally:
    def __init__(self, clock: Clock, metrics: NodeMetrics, progress: RoundProgress) -> None:
        self._clock, self._progress = clock, progress  # a refusal's event is dated by the node's round
        self.metrics = metrics  # its own registry, which counts on its own (read at each scrape)
        self._counters: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._recent: deque[FleetEvent] = deque(maxlen=RECENT_LIMIT)
        self._refusals = RateLimitedLog(log, clock.monotonic)  # a line per reason at most every 10 s

    @property
    def counters(self) -> Mapping[str, int]:
        return MappingProxyType(self._counters)

    @property
    def rejected(self) -> Mapping[str, int]:
        return MappingProxyType(self._rejected)

    def recent(self) -> list[FleetEvent]:
        return list(self._recent)

    def count(self, counter: str, n: int = 1) -> None:
        self._counters[counter] += n

    def refused(self, reason: str) -> None:
        """A refusal by ``reason``, counted only (its caller says it, once per peer: :mod:`.refusals`)."""
        self._rejected[reason] += 1

    def reject(self, reason: str, detail: str, sender: str) -> None:
        """A refused request: counted by reason (durable, in ``/status``), a recent event, and a WARNING at most
        every 10 s per reason."""
        self._rejected[reason] += 1
        self.event("refusal", sender[:64], reason)
        self._refusals.warning(reason, "rejected a request from %s: %s (%s)", sender, reason, detail[:300])

    def warn(self, reason: str, message: str, *args: object) -> None:
        """A WARNING about a refusal counted apart, rate-limited by ``reason`` as :meth:`reject`'s lines are."""
        self._refusals.warning(reason, message, *args)

    def event(self, kind: Literal["send", "fusion", "refusal", "replan"], peer: str, detail: str,
              round_: int | None = None) -> None:
        """One of ``/fleet``'s recent events (a send, a fusion, a refusal, a round planned around); ``round_``: the
        one it completed (by default the node's)."""
        self._recent.append(FleetEvent(time=self._clock.wall(), event=kind, peer=peer, detail=detail,
                                       round=self._progress.round if round_ is None else round_))

    def transferred(self, direction: str, nbytes: int, seconds: float | None = None) -> None:
        """One model (or reply) crossed the wire: counted (``bytes_sent`` or ``bytes_received``), its size and,
        where the caller timed it, its transfer observed."""
        if nbytes <= 0:
            return
        self._counters[f"bytes_{direction}"] += nbytes
        self.metrics.observe("model_size", nbytes, direction=direction)
        if seconds is not None:
            self.metrics.observe("transfer", seconds, direction=direction)

    def observe(self, kind: Timed, seconds: float, **labels: str) -> None:
        self.metrics.observe(kind, seconds, **labels)

    def durable(self) -> dict[str, Any]:
        """What a checkpoint keeps (recent events are about this process only)."""
        return {"counters": dict(self._counters), "rejected": dict(self._rejected)}

    def restore(self, saved: Mapping[str, Any]) -> None:
        self._counters.update(saved.get("counters", {}))
        self._rejected.update(saved.get("rejected", {}))
