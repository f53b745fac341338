"""Log lines a peer can cause, rate-limited: a flood of bad input must not become a flood of log lines.

Every refusal (a bad transfer, an incompatible Hello, a request that does not decode) is counted by
reason in ``/status`` — that is the exact record. The log gets the first refusal of each reason, then
at most one line per reason every ``interval`` seconds, which says how many were left out meanwhile.
Tracebacks stay for bugs (``log.exception`` where a failure is ours, not the peer's).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

MAX_KEYS = 256  # reasons are our own stable codes; the bound only guards against a bug that invents keys


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, clock: Callable[[], float], interval: float = 10.0) -> None:
        """``clock``: the node's (:meth:`~dfl_node.node.core.clock.Clock.monotonic`), so a virtual clock paces it
        too."""
        self.logger, self.interval, self.clock = logger, interval, clock
        self._last: dict[str, float] = {}
        self.suppressed: Counter[str] = Counter()

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Log ``message`` under ``key`` unless a line of that key went out less than ``interval`` ago;
        returns whether it was logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self.suppressed[key] += 1
            return False
        left_out = self.suppressed.pop(key, 0)
        if left_out and last is not None:  # something was left out only after a line went out
            message, args = f"{message} (and %d more %s in the last %.0f s)", (*args, left_out, key, now - last)
        if len(self._last) >= MAX_KEYS and key not in self._last:
            self._last.clear()
        self._last[key] = now
        self.logger.warning(message, *args)
        return True
