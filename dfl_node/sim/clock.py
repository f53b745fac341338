"""Virtual time for the simulator: an asyncio loop whose clock jumps to its next timer when nothing is ready.

Why our own loop rather than ``looptime`` (PyPI, 0.9): looptime is built for tests (a pytest plugin that
patches loops) and, while an executor future is pending, moves its clock in steps *of real time* — so
anything run with ``asyncio.to_thread`` makes the virtual timeline depend on how fast the machine is, and a
run is no longer deterministic for its seed. It also spends 42 no-op loop cycles before each jump. The
node runs its training, evaluation and checkpoints with ``asyncio.to_thread``, so that case is the normal
one here. What we need is ~40 lines over asyncio's own scheduling:

* :class:`VirtualTimeLoop`: ``time()`` is a number the loop owns. asyncio asks its selector to wait only
  when no callback is ready, for exactly the time until the next timer; our selector polls the real one
  without waiting and, if nothing came, moves the clock by that much instead. Every ``asyncio.sleep``,
  ``wait_for`` and ``timeout`` of the node reads ``loop.time()`` (:class:`~dfl_node.node.core.clock.Clock`), so a
  120 s token timeout costs no wall time. A loop with nothing ready and no timer is deadlocked (nothing can
  wake it: the simulator has no sockets): it raises :class:`Deadlock` instead of hanging.
* :class:`InlineExecutor`, the loop's default executor: ``to_thread`` work runs *inline*, on the loop's
  thread, in the order it was asked for, and its result is delivered ``cost(work)`` virtual seconds
  later, ``work`` being the training steps and evaluated samples it did (:mod:`dfl_node.learning.work`).
  That is how compute is charged: the work itself takes no virtual time, the device profile says what it
  costs (:mod:`dfl_node.sim.costs`). (Default cost 0: free.)
* :class:`VirtualClock`: the node's clock port on such a loop, its wall time following the loop's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from dfl_node import heap
from dfl_node.learning import work
from dfl_node.learning.devices import torch_threads
from dfl_node.learning.work import Work
from dfl_node.node.core.clock import Clock

# Where virtual wall time starts: 2020-01-01T00:00:00Z, a fixed epoch so that timestamps are reproducible.
VIRTUAL_EPOCH = 1_577_836_800.0

# The collector's thresholds while a simulation runs (see run_virtual), as gc.set_threshold takes them: allocations
# between two young collections (700 by default), and the collections of each generation between two of the next
# (a full one walks every live object: millions in a large fleet).
SIM_GC_THRESHOLDS = (50_000, 20, 100)
# Wall seconds at least between two trims of the C heap while a simulation runs (:func:`dfl_node.heap.spaced`): each
# of a thousand nodes' groups that closes would otherwise walk the whole process's heap, a twentieth of a 1,000-node
# run's time; what a group frees is reused by the next within the second.
SIM_TRIM_SPACING_S = 1.0

T = TypeVar("T")
CostFn = Callable[[Work], float]  # the work a call run off the loop did -> its cost in virtual seconds


class Deadlock(RuntimeError):
    """Every task waits and no timer is set: in a simulation, nothing can ever wake the loop again."""


class _VirtualSelector(selectors.DefaultSelector):
    """The real selector, polled without waiting; a wait it was asked for becomes a jump of the loop's clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        assert self.loop is not None
        if timeout is None:
            raise Deadlock("every task waits and no timer is set (a simulated node waits for something that "
                           "can never come)")
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module's docstring). ``cost`` charges executor work."""

    def __init__(self, cost: CostFn | None = None) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self.set_default_executor(InlineExecutor(self, cost or (lambda work: 0.0)))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (never back): the loop then runs the timers that fell due."""
        self._now += max(seconds, 0.0)


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each submitted function at once on the calling (the loop's) thread; its future resolves
    ``cost(work)`` virtual seconds later, ``work`` being what the function computed. A ThreadPoolExecutor
    only because asyncio accepts no other as its default; it never starts a thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cost: CostFn) -> None:
        super().__init__(max_workers=1)
        self._loop, self._cost = loop, cost

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        before = work.done().copy()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # delivered to the awaiting task, as a worker thread would
            self._loop.call_later(self._cost(work.done().since(before)), future.set_exception, exc)
        else:
            self._loop.call_later(self._cost(work.done().since(before)), future.set_result, result)
        return future


class VirtualClock(Clock):
    """The clock port on a :class:`VirtualTimeLoop`: waits on the loop's (virtual) time, and wall time that
    follows it from :data:`VIRTUAL_EPOCH`, so histories and ``/status`` read in virtual seconds."""

    def wall(self) -> float:
        return VIRTUAL_EPOCH + asyncio.get_running_loop().time()


def run_virtual(main: Coroutine[Any, Any, T], cost: CostFn | None = None, threads: int = 1) -> T:
    """Run ``main`` to its end on a new :class:`VirtualTimeLoop` (executor work charged by ``cost``), with torch
    on ``threads`` threads as a daemon sets them for its process: the work runs inline on this thread, and
    the number of threads decides a float sum's order, so the bits a simulated node computes."""
    loop = VirtualTimeLoop(cost)
    gc.freeze()  # what exists now (imports, the data) outlives the run: no full collection need scan it again
    # A fleet's messages, tasks and timers are millions of short-lived objects: at the default threshold (700) the
    # young generation is collected every few messages, a fifth of a 300-node run's time; every 50,000 costs ~1 %.
    thresholds = gc.get_threshold()
    gc.set_threshold(*SIM_GC_THRESHOLDS)
    try:
        with torch_threads(threads), heap.spaced(SIM_TRIM_SPACING_S):
            return loop.run_until_complete(main)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        loop.close()
