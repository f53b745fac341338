"""Receive-side memory and work: the intake thread that copies and hashes chunks, buffers reused across
transfers, and the C heap handed back between groups."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dfl_node.net.frames import Payload
from dfl_node.net.hashes import Hasher

# One thread: chunks are copied and hashed in order, and a message built after its chunks. Off the event
# loop, which was a stream's bottleneck: with the copy into the receive buffer on it, a receiver's main
# thread spent ~95 ms of CPU per 100 MB here against ~62 ms without (gRPC's own copies are the rest).
INTAKE = ThreadPoolExecutor(1, thread_name_prefix="intake")
MAX_PENDING_CHUNKS = 8  # chunks handed to the intake thread and not yet absorbed: the memory it may hold


def absorb(digest: Hasher, target: memoryview, data: Payload) -> None:
    """Copy a chunk into its place in the receive buffer and hash it, both without the GIL (numpy's copy,
    hashlib's and blake3's updates), so the event loop goes on receiving meanwhile."""
    np.copyto(np.frombuffer(target, dtype=np.uint8), np.frombuffer(data, dtype=np.uint8))
    digest.update(data)



def _refcount(buffers: list[bytearray], i: int) -> int:
    return sys.getrefcount(buffers[i])


_ALONE = _refcount([bytearray()], 0)  # the count of a buffer only a list refers to, on this interpreter


class BufferPool:
    """Receive buffers kept for the next transfer of the same size.

    Writing to freshly allocated memory costs a page fault per 4 KiB; measured here, filling a new
    100 MB buffer took ~0.2 s against ~0.03 s for one already touched, which capped a whole transfer
    at ~500 MB/s. A buffer is handed out again only when nothing but the pool refers to it: the
    tensors of a received message are views made by ``torch.frombuffer``, which holds a reference to
    the buffer (as does the intake thread's ``memoryview`` of a chunk's place), so a model still in use
    is never overwritten. Use a pool from one thread.
    """

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._buffers: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        """A buffer of exactly ``size`` bytes (contents undefined): a free pooled one, else a new one."""
        free = [i for i in range(len(self._buffers)) if _refcount(self._buffers, i) == _ALONE]
        for i in free:
            if len(self._buffers[i]) == size:
                return self._buffers[i]
        fresh = bytearray(size)
        if len(self._buffers) >= self._keep and free:
            del self._buffers[free[0]]
        if len(self._buffers) < self._keep:
            self._buffers.append(fresh)
        return fresh


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


def trim_heap() -> bool:
    """Hand the C heap's free memory back to the kernel (glibc's ``malloc_trim``) once more than
    :data:`KEEP_FREE` of it is free; False where there is no ``malloc_trim``.

    A receiver calls it once a group's transfers are over (:meth:`~dfl_node.node.collector.Collector.close`).
    Concurrent streams leave gRPC's freed read buffers spread over malloc's per-thread arenas, where
    glibc keeps them mapped (:mod:`dfl_node.net.allocator` keeps freed memory on the heap on purpose
    while a stream runs). Measured on an aggregator (FullAvg) taking groups of 4 concurrent 100 MB
    models: without it, its RSS between groups grew by 40-60 MB a group (2 pooled buffers + 1.3x the
    model after the first group, + 2.9x after the fourth) and its peak from 5.6x to 8.2x the model;
    with it, the RSS between groups stayed at the pooled buffers + 0.1-0.5x over 8 groups, peaks
    4.7-6.9x (``benchmarks/aggregator.py``), for 3-6 ms per call. Up to :data:`KEEP_FREE` stays: what the
    next transfer would otherwise fault back in (where ``mallinfo2`` is missing, everything goes back).
    ``fordblks`` counts free heap whether or not it is still resident, so this errs towards trimming.
    """
    trim, mallinfo2 = _heap_calls()
    if trim is None:
        return False
    if mallinfo2 is None or mallinfo2().fordblks > KEEP_FREE:
        trim(0)
    return True
