"""What a link of the simulator's fabric costs (:mod:`dfl_node.sim.network`): each direction's latency and
bandwidth, as :mod:`dfl_node.sim.costs` derives them from an experiment's ``links:`` and its faults."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkProfile:
    """What one direction of a link costs: ``latency_s`` per message, plus its bytes at ``bandwidth`` bytes/s."""

    latency_s: float = 0.0
    bandwidth: float = math.inf

    def delay(self, nbytes: int = 0) -> float:
        return self.latency_s + nbytes / self.bandwidth


ProfileFn = Callable[[str, str], LinkProfile]  # (from address, to address) -> that direction's profile
