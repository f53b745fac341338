"""What this node measured of its link to each peer: how fast its models crossed each way, how often a transfer was
cut or failed, and whether the link is weak now (:class:`LinkQuality`: the node's transports record into it, the
views and the schedulers read it).

A link is *weak* while one of its newest :data:`RECENT` transfers was cut or failed. What that changes:

* a transfer over a weak link streams small chunks from its first attempt (:data:`~dfl_node.peering.resume.
  SMALL_CHUNK`: a gRPC message crosses whole or not at all, and a link that drops every few seconds never carries a
  1 MiB chunk at 100 kB/s);
* async mode invites peers over weak links last (:mod:`.async_mode`);
* round mode plans from its seed alone, never from these measures, so that a fleet stays reproducible; its holder
  plans around a group only once it failed (:mod:`.rounds`), and sets each group's deadline from its members'
  measured computation (their Hello's ``work_s``), not from their links.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from dfl_node.peering.resume import SMALL_CHUNK
from dfl_node.records.peers import LinkReport

RECENT = 4  # transfers per link that say whether it is weak now
SMOOTHING = 0.5  # weight of the newest transfer in a link's throughput (an exponential moving average)
MAX_LINKS = 4096  # links remembered at most: peers cannot grow the table without bound

Direction = Literal["sent", "received"]


@dataclass
class _Record:
    rates: dict[str, float] = field(default_factory=dict)  # direction -> bytes/s, smoothed
    transfers: int = 0
    failed: int = 0
    cuts: int = 0
    resent: int = 0
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT))  # cut or failed, newest last


class LinkQuality:
    def __init__(self) -> None:
        self._links: dict[str, _Record] = {}

    def _record(self, peer: str) -> _Record:
        if peer not in self._links and len(self._links) >= MAX_LINKS:
            del self._links[next(iter(self._links))]  # the oldest peer heard of
        return self._links.setdefault(peer, _Record())

    def cut(self, peer: str) -> None:
        """A model stream with ``peer`` was cut mid-way (at either end)."""
        record = self._record(peer)
        record.cuts += 1
        record.recent.append(True)

    def transferred(self, peer: str, direction: Direction, nbytes: int, seconds: float, *, resent: int = 0,
                    ok: bool = True) -> None:
        """One model's transfer with ``peer`` ended (``ok``: it arrived whole, after its cuts if any): ``nbytes``
        crossed ``direction`` in ``seconds`` (0: not timed), ``resent`` of them sent again after cuts."""
        record = self._record(peer)
        record.transfers += ok
        record.failed += not ok
        record.resent += resent
        record.recent.append(not ok)
        if ok and seconds > 0 and nbytes > 0:
            rate, old = nbytes / seconds, record.rates.get(direction)
            record.rates[direction] = rate if old is None else SMOOTHING * rate + (1 - SMOOTHING) * old

    def weak(self, peer: str) -> bool:
        record = self._links.get(peer)
        return record is not None and any(record.recent)

    def chunk_for(self, peer: str) -> int:
        """The largest chunk a transfer with ``peer`` should carry (0: the network's own)."""
        return SMALL_CHUNK if self.weak(peer) else 0

    def report(self, peer: str) -> LinkReport | None:
        """What ``/status`` and ``/fleet`` show of the link to ``peer`` (None: no transfer with it yet)."""
        record = self._links.get(peer)
        if record is None:
            return None
        return LinkReport(sent_bytes_per_s=record.rates.get("sent"), received_bytes_per_s=record.rates.get("received"),
                          transfers=record.transfers, failed=record.failed, cuts=record.cuts,
                          resent_bytes=record.resent, weak=any(record.recent))
