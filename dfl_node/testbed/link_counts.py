"""What a weak-link proxy (:mod:`dfl_node.testbed.proxy`) counted: connections accepted, cut and failed, bytes
forwarded each way.

Its own module because the counts are read from two sides: the proxy's loop adds to them as it forwards, and a test,
a benchmark or the command line reads them from another thread, while the proxy runs and after it stopped.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class LinkCounts:
    """A proxy's totals at one moment: connections accepted, reset (``cut_after`` ran out, or the link was
    ``down``) and closed because the target could not be reached; bytes each side of the proxy wrote (handed to
    the kernel, not merely read)."""

    accepted: int = 0
    cut: int = 0
    failed: int = 0
    bytes_client_to_target: int = 0
    bytes_target_to_client: int = 0

    @property
    def bytes_total(self) -> int:
        return self.bytes_client_to_target + self.bytes_target_to_client

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "bytes_total": self.bytes_total}


class LinkCounters:
    """A proxy's totals since it started, counted from its loop's thread and read from any other (:meth:`now`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = LinkCounts()

    def add(self, **amounts: int) -> None:
        """Add to the named counts (the proxy's own bookkeeping)."""
        with self._lock:
            self._counts = replace(self._counts, **{k: getattr(self._counts, k) + v for k, v in amounts.items()})

    def now(self) -> LinkCounts:
        with self._lock:
            return self._counts
