"""Rates in bytes per second: how they are written (:func:`parse_rate`) and how a stream is held to one
(:class:`TokenBucket`) — a node's caps on its model transfers (``--max-upload``, ``--max-download``:
:mod:`dfl_node.net.pacing`) and the weak-link proxy's links (:mod:`dfl_node.testbed.proxy`)."""

from __future__ import annotations

import asyncio
import re
import time

BURST_S = 0.05  # a bucket holds at most this many seconds' worth of bytes: over W s, at most rate * (W + BURST_S)
PIECE_S = 0.01  # a rate-limited side is read in pieces of at least this many seconds' worth (unless the bucket is
                # smaller): no sleep-and-read per byte at high rates


class TokenBucket:
    """``rate`` bytes/s, at most ``burst`` bytes at once (default: 1/20 s worth, at least one byte)."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.burst = max(self.rate * BURST_S, 1.0) if burst is None else float(burst)
        self._piece = min(self.burst, max(1.0, self.rate * PIECE_S))
        self._tokens = self.burst
        self._stamp = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def allowance(self, most: int) -> int:
        """How many bytes (1 to ``most``) may pass now, after waiting until a piece may; :meth:`spend` what did."""
        self._refill()
        want = min(float(most), self._piece)
        while self._tokens < want:
            await asyncio.sleep((want - self._tokens) / self.rate)
            self._refill()
        return max(1, min(most, int(self._tokens)))

    def spend(self, n: int) -> None:
        """Take ``n`` bytes that passed out of the bucket."""
        self._tokens -= n

    async def take(self, n: int) -> None:
        """``n`` bytes pass: they are taken from the bucket at once, and the caller waits until the bucket is out of
        debt, that is, until they would have passed at the rate (less the burst it held). A chunk larger than the
        burst so costs its own time, and a stream of chunks holds the rate from its first chunk on."""
        owed = self.owe(n)
        while owed > 0:
            await asyncio.sleep(owed)
            owed = self.owe(0)

    def owe(self, n: int) -> float:
        """:meth:`take` for a thread, which sleeps itself: ``n`` bytes taken, the seconds until the bucket is out
        of debt."""
        self._refill()
        self._tokens -= n
        return max(0.0, -self._tokens / self.rate)


_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKMG]?)\s*$")
_SUFFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


def parse_rate(text: str) -> float:
    """Bytes/s (or bytes) from ``"2000"``, ``"100k"`` (1e3), ``"1.5M"`` (1e6) or ``"2G"`` (1e9); positive."""
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f"not a rate: {text!r} (bytes/s, e.g. 2000, 100k, 1.5M)")
    rate = float(match[1]) * _SUFFIX[match[2]]
    if rate <= 0:
        raise ValueError(f"the rate must be positive, got {text!r}")
    return rate


def parse_cap(text: str) -> float:
    """A cap as written: bytes/s (``0``: none), or ``100k``, ``1.5M``."""
    try:
        cap = float(text)
    except ValueError:
        return parse_rate(text)
    if not cap >= 0:  # negative, or NaN
        raise ValueError(f"a cap is bytes/s, 0 or more: got {text!r}")
    return cap
