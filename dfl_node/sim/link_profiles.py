"""What a link of the simulator's fabric costs (:mod:`dfl_node.sim.network`): each direction's latency and
bandwidth, and how long a connection over it lasts before the link drops it, as :mod:`dfl_node.sim.costs` derives
them from an experiment's ``links:`` and its faults."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkProfile:
    """What one direction of a link costs: ``latency_s`` per message, plus its bytes at ``bandwidth`` bytes/s; and
    how long a connection over it lasts: cut after an exponential time of mean ``mtbf_s`` (inf: never)."""

    latency_s: float = 0.0
    bandwidth: float = math.inf
    mtbf_s: float = math.inf

    def delay(self, nbytes: int = 0) -> float:
        return self.latency_s + nbytes / self.bandwidth

    def carried(self, seconds: float) -> int:
        """The bytes this direction carries in ``seconds`` (after its latency)."""
        return int(min(max(0.0, seconds - self.latency_s) * self.bandwidth, 2**62))

    def lifetime(self, rng: random.Random) -> float:
        """How long a connection opened now lasts before the link cuts it, drawn from ``rng`` (inf: it is not)."""
        return rng.expovariate(1.0 / self.mtbf_s) if math.isfinite(self.mtbf_s) else math.inf


ProfileFn = Callable[[str, str], LinkProfile]  # (from address, to address) -> that direction's profile
