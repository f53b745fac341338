"""The C heap handed back to the kernel between groups (glibc's ``malloc_trim``): a process-wide concern of whoever
receives models, whatever network they came over. A leaf: it imports nothing of the package."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33): ten ``size_t``, summed over every arena."""

    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _heap_calls() -> tuple[Callable[[int], int] | None, Callable[[], _MallInfo2] | None]:
    """glibc's ``malloc_trim`` and ``mallinfo2``, each None where this C library lacks it (musl, an older glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None, None
    trim = getattr(libc, "malloc_trim", None)
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is not None:
        mallinfo2.restype = _MallInfo2
    return trim, mallinfo2


# Free heap left mapped between groups. One 100 MB stream leaves 14-19 MiB free (its chunks in flight, gRPC's
# buffers); handing that back made the next transfer fault it in again, page by page: measured here, a push's
# wire ran 1-13 % slower (median of the runs 7 %) behind a trim than with that memory kept (9 runs, each of
# 16-30 pushes alternated between a daemon of each kind). An aggregator's RSS between groups of 4 concurrent
# 100 MB streams did not change (2.02-2.10x the model, its pooled buffers): their leftovers exceed this.
KEEP_FREE = 32 << 20

# Seconds (of the process's own clock) at least between two trims that do anything, for the calls of one thread
# (unset: none; :func:`spaced`): per thread, because a threaded sweep runs several simulations at once, each in
# :func:`spaced` on its own thread, and one's end must not end another's; and when the last trim ran (the heap is
# the process's: any thread's trim counts).
_spacing = threading.local()
_trimmed_at = -math.inf


@contextlib.contextmanager
def spaced(seconds: float) -> Iterator[None]:
    """While it lasts, :func:`trim_heap` called from this thread trims at most once every ``seconds``: for a process
    that hosts many receivers (the simulator's thousand nodes), where each trim walks the whole process's heap
    (gigabytes, ~4 ms) and a group closes a hundred times a second of its time, handing back what one node's group
    freed."""
    before = getattr(_spacing, "seconds", 0.0)
    _spacing.seconds = seconds
    try:
        yield
    finally:
        _spacing.seconds = before


def trim_heap() -> bool:
    """Hand the C heap's free memory back to the kernel (glibc's ``malloc_trim``) once more than
    :data:`KEEP_FREE` of it is free; False where there is no ``malloc_trim``.

    A receiver calls it once a group's transfers are over (:meth:`~dfl_node.node.exchange.collector.Collector.close`).
    Concurrent streams leave gRPC's freed read buffers spread over malloc's per-thread arenas, where
    glibc keeps them mapped (:mod:`dfl_node.net.allocator` keeps freed memory on the heap on purpose
    while a stream runs). Measured on an aggregator (FullAvg) taking groups of 4 concurrent 100 MB
    models: without it, its RSS between groups grew by 40-60 MB a group (2 pooled buffers + 1.3x the
    model after the first group, + 2.9x after the fourth) and its peak from 5.6x to 8.2x the model;
    with it, the RSS between groups stayed at the pooled buffers + 0.1-0.5x over 8 groups, peaks
    4.7-6.9x (``benchmarks/aggregator.py``), for 3-6 ms per call. Up to :data:`KEEP_FREE` stays: what the
    next transfer would otherwise fault back in (where ``mallinfo2`` is missing, everything goes back).
    ``fordblks`` counts free heap whether or not it is still resident, so this errs towards trimming. Within
    :func:`spaced`, a call that comes too soon after the last trim does nothing.
    """
    global _trimmed_at
    trim, mallinfo2 = _heap_calls()
    if trim is None:
        return False
    spacing = getattr(_spacing, "seconds", 0.0)
    if spacing and time.monotonic() - _trimmed_at < spacing:
        return True
    if mallinfo2 is None or mallinfo2().fordblks > KEEP_FREE:
        trim(0)
        _trimmed_at = time.monotonic()
    return True
