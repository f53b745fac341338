"""dfl_node.heap.trim_heap: a group's leftover heap (one stream's chunks) stays mapped for the next
transfer, more than :data:`~dfl_node.heap.KEEP_FREE` goes back to the kernel. What keeping it buys
is measured by benchmarks/transfer.py, not asserted here.

Each case runs in a fresh process with the daemon's malloc settings, so the heap holds only what it frees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from dfl_node import heap

pytestmark = pytest.mark.skipif(None in heap._heap_calls(), reason="needs glibc's malloc_trim and mallinfo2")

# Frees every other 64 KiB piece of a heap it filled (freed pieces between live ones: free() alone cannot
# hand them back), then prints how much the RSS fell across trim_heap() and the free heap before it.
FRAGMENTED_HEAP = """
import json, sys
from dfl_node import heap
from dfl_node.net.allocator import tune_for_streaming

def rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith("VmRSS:"))

assert tune_for_streaming()
pieces = [bytearray(b"x" * (64 << 10)) for _ in range(2 * int(sys.argv[1]))]
del pieces[::2]
free, before = heap._heap_calls()[1]().fordblks, rss()
assert heap.trim_heap()
print(json.dumps({"free": free, "released": before - rss()}))
"""


def trimmed(freed_pieces: int) -> dict[str, int]:
    run = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP, str(freed_pieces)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(run.stdout)


def test_a_streams_leftover_heap_stays_mapped() -> None:
    got = trimmed(128)  # 8 MiB free: about what one 100 MB stream leaves
    assert got["free"] <= heap.KEEP_FREE
    assert got["released"] < 1 << 20


def test_more_free_heap_than_it_keeps_goes_back() -> None:
    got = trimmed(1024)  # 64 MiB free: concurrent streams' leftovers
    assert got["free"] > heap.KEEP_FREE
    assert got["released"] > 48 << 20


def test_spaced_trims_at_most_once_in_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "_heap_calls", lambda: (calls.append, None))  # no mallinfo2: every trim is due
    monkeypatch.setattr(heap, "_trimmed_at", float("-inf"))
    with heap.spaced(3600.0):
        assert heap.trim_heap() and heap.trim_heap()
    assert calls == [0]  # the second came within the hour: nothing
    assert heap.trim_heap()
    assert calls == [0, 0]  # outside spaced(): every call trims, as before


def test_spacing_is_the_thread_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threaded sweep runs simulations on several threads at once: one's spacing must not reach another thread's
    calls, nor outlive its own ``spaced()``."""
    calls: list[int] = []
    monkeypatch.setattr(heap, "_heap_calls", lambda: (calls.append, None))
    monkeypatch.setattr(heap, "_trimmed_at", float("-inf"))
    entered, leave = threading.Event(), threading.Event()

    def simulation() -> None:
        with heap.spaced(3600.0):
            entered.set()
            leave.wait(10)

    other = threading.Thread(target=simulation)
    other.start()
    try:
        assert entered.wait(10)
        assert heap.trim_heap() and heap.trim_heap()
    finally:
        leave.set()
        other.join()
    assert calls == [0, 0]  # the other thread's spacing spaced nothing here
