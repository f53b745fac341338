"""Receive-side memory and work: the intake thread that copies and hashes chunks, and buffers reused across
transfers. (The C heap handed back between groups is :func:`dfl_node.heap.trim_heap`.)"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dfl_node.hashes import Hasher
from dfl_node.net.frames import Payload

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
