"""Running a sweep's runs on a local process pool, one torch thread per process.

Workers ignore SIGINT: Ctrl-C reaches the driver, which terminates the pool; results already
handed back have been written by then, and no worker writes anything itself.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable, Sequence

import torch

from dfl_node.sweep import execute as execute_module
from dfl_node.sweep.execute import Outcome, attempt
from dfl_node.sweep.grid import RunTask


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)


# What a forkserver imports once for all its workers: the runner, and what datasets import only when loaded
# (skipped if absent).
PRELOAD = [execute_module.__name__, "safetensors.torch"]


def _context() -> multiprocessing.context.BaseContext:
    """fork, where there is one and the driver never loaded gRPC (``dfl-node sweep``): a worker then needs no
    import at all. A process that has run gRPC cannot be forked safely — a worker forked from a test session
    that had run gRPC nodes spun for good in a gRPC finalizer — so there workers fork from a clean forkserver
    that imported the runner once; spawn where neither exists."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and "grpc" not in sys.modules:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


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
