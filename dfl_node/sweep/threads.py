"""Several runs at once as threads of this process, each on a CUDA stream of its own (``--per-device N --streams``).

Why threads: N runs as N processes take turns on a GPU (without NVIDIA's MPS daemon, a GPU runs one process's
kernels at a time), so their GPU times add up; the kernels of N streams of one process may run at the same time,
and one run of small kernels leaves most of an H100 idle. ``benchmarks/gpu_speed.py`` measures both ways.

The runs share the process, so what they must not share is kept apart: work counters are per thread
(:mod:`dfl_node.learning.work`), model builds take torch's CPU generator one at a time
(:func:`dfl_node.learning.models.build_model`), CUDA graphs are captured ``thread_local``
(:mod:`dfl_node.learning.cuda_graphs`), and torch's intra-op threads are 1 throughout, as in the pool's workers
(the thread count decides a CPU float sum's order: a run gives the bits it gives alone). Each run's own settings
must then agree on the process-wide ones (``threads``, ``precision``, ``cudnn_benchmark``): a sweep keeps them.

Ctrl-C reaches the driver, which stops waiting; the runs under way are daemon threads and end with the process,
their results unwritten (finished runs' files stay, as with the pool).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import torch

from dfl_node.learning.devices import resolve_device, torch_threads
from dfl_node.sweep.execute import Outcome, attempt
from dfl_node.sweep.grid import RunTask


def run_threads(tasks: Sequence[RunTask], workers: int, on_outcome: Callable[[Outcome], None]) -> None:
    """Run ``tasks`` on ``workers`` threads, calling ``on_outcome`` in this thread as each ends."""
    if not tasks:
        return
    todo: queue.SimpleQueue[RunTask] = queue.SimpleQueue()
    for task in tasks:
        todo.put(task)
    finished: queue.SimpleQueue[Outcome] = queue.SimpleQueue()

    def work() -> None:
        streams: dict[str, torch.cuda.Stream] = {}  # this thread's, made when a run first needs it
        while True:
            try:
                task = todo.get_nowait()
            except queue.Empty:
                return
            try:
                with _stream_for(task, streams):
                    outcome = attempt(task)
            except BaseException as exc:  # noqa: BLE001 - the driver must hear of every run, or it waits for ever
                outcome = Outcome(task, error=f"{type(exc).__name__}: {exc}")
            finished.put(outcome)

    with torch_threads(1):
        for i in range(min(workers, len(tasks))):
            threading.Thread(target=work, name=f"dfl-run-{i}", daemon=True).start()
        for _ in tasks:
            on_outcome(finished.get())


@contextlib.contextmanager
def _stream_for(task: RunTask, streams: dict[str, torch.cuda.Stream]) -> Iterator[None]:
    """The thread's own CUDA stream as the current one, where the run's device is a GPU."""
    device = resolve_device(task.config.get("device", "cpu"))
    if device.type != "cuda":
        yield
        return
    stream = streams.setdefault(str(device), torch.cuda.Stream(device))
    with torch.cuda.stream(stream):
        yield
