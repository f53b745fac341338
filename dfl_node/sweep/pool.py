"""Running a sweep's runs on a local process pool, one torch thread per process.

Workers ignore SIGINT: Ctrl-C reaches the driver, which terminates the pool; results already
handed back have been written by then, and no worker writes anything itself.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence

import torch

from dfl_node.sweep.execute import Outcome, attempt
from dfl_node.sweep.grid import RunTask


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)


def _context() -> multiprocessing.context.BaseContext:
    """fork where there is one: a worker then needs no re-import, and spawn would re-run the main
    module of ``python -m dfl_node``. The driver has run no torch thread pool before it forks."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_pool(tasks: Sequence[RunTask], workers: int, on_outcome: Callable[[Outcome], None]) -> None:
    """Run ``tasks`` on ``workers`` processes, calling ``on_outcome`` in this process as each ends."""
    if not tasks:
        return
    pool = _context().Pool(processes=min(workers, len(tasks)), initializer=_init_worker)
    try:
        for outcome in pool.imap_unordered(attempt, tasks):
            on_outcome(outcome)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
