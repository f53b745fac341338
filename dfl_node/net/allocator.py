"""Process-wide malloc settings that keep model streams from page-faulting (glibc only).

gRPC and the frame codec allocate and free a buffer of up to a chunk (1 MiB) per message. With
glibc's defaults those allocations end up handed back to the kernel after each free (mmap
threshold, heap trimming), so the next one page-faults on every 4 KiB it touches. Measured here on a
100 MB gRPC stream: ~270 MB/s with the defaults, ~850 MB/s with the settings below, which keep
allocations up to a few chunks on the heap and keep a few MiB of freed heap mapped. The cost is at
most ``TRIM_THRESHOLD`` of freed memory that stays resident.

One malloc arena (``ARENAS``): an aggregator receiving several streams at once frees gRPC's buffers
from several threads, and glibc's per-thread arenas each kept their own freed megabytes; with one
arena the peak of 4 concurrent 100 MB senders stayed near 5× the model instead of creeping to 8×
(benchmarks/aggregator.py), at no measurable cost in intake rate.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8  # from glibc's <malloc.h>
MMAP_THRESHOLD = 4 << 20  # allocations below this come from the heap (chunks, gRPC's message buffers)
TRIM_THRESHOLD = 16 << 20  # free heap kept mapped before it is returned to the kernel
TOP_PAD = 4 << 20  # extra heap obtained (and kept) whenever the heap grows
ARENAS = 1  # malloc arenas (glibc's default: 8 per core)


def tune_for_streaming() -> bool:
    """Apply the settings to this process; False (and nothing changed) where malloc is not glibc's."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        log.debug("no mallopt in this C library: malloc left at its defaults")
        return False
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD),
                (_M_ARENA_MAX, ARENAS))
    return all(mallopt(option, value) == 1 for option, value in settings)
