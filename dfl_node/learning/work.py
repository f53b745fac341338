"""What this thread has computed: training steps and evaluated samples, counted where they happen.

The simulator charges virtual time by it (:mod:`dfl_node.sim.costs`): a device profile says what a step and an
evaluated sample cost, and the work a call did is the difference of these counters across it. Counting is an
integer add per batch, nothing beside a step's own cost.

Counted per thread: a simulation runs its nodes' work inline on its loop's thread
(:class:`~dfl_node.sim.clock.InlineExecutor`), and several simulations may run at once as threads of one process
(``--per-device N --streams``), each charged only for its own work.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class Work:
    steps: int = 0  # training batches: one optimiser step of each model trained on the batch
    samples_evaluated: int = 0

    def since(self, before: Work) -> Work:
        return Work(self.steps - before.steps, self.samples_evaluated - before.samples_evaluated)

    def copy(self) -> Work:
        return Work(self.steps, self.samples_evaluated)


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.work = Work()


_DONE = _PerThread()


def done() -> Work:
    """This thread's work so far."""
    return _DONE.work
