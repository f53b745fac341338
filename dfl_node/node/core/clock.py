"""The node's clock port: every wait, timeout and timestamp of :mod:`dfl_node.node` reads one :class:`Clock`.

Waits and timeouts read the event loop's clock (``loop.time()``), which is also what ``asyncio.sleep``
and ``asyncio.wait_for`` wait on, so a loop whose time is virtual (one that jumps to its next timer when
every task waits, e.g. ``looptime``) drives all of them at once and a 120 s timeout costs no wall time.
Timestamps for people (the history, ``/status``) are :meth:`Clock.wall`; a virtual-time driver gives
the node a clock whose wall time follows its loop. Nothing in ``node/`` calls ``time.monotonic()`` or
``time.time()`` itself: that would escape a virtual clock.
"""

from __future__ import annotations

import asyncio
import time


class Clock:
    """The daemon's clock: the running loop's time for waits, the system's for timestamps."""

    def monotonic(self) -> float:
        """Seconds on the running event loop's clock: for deadlines, timeouts and intervals."""
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        """Seconds since the Unix epoch: for timestamps that people read."""
        return time.time()
