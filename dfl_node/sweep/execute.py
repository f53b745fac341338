"""One run of a sweep, as a worker (a pool process or a Ray task) does it.

A worker returns the result instead of writing it: on a Ray cluster it may run on another machine,
and the driver alone owns the output folder, so a result file is written once, whole, by one process.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch

from dfl_node.learning.fleet import provision
from dfl_node.sim import Simulation
from dfl_node.sweep.grid import RunTask


@dataclass(frozen=True)
class Outcome:
    """What came back for one run: its result JSON, or the error that stopped it."""

    task: RunTask
    payload: dict[str, Any] | None = None
    error: str | None = None


def execute(task: RunTask) -> dict[str, Any]:
    """Provision the run's fleet, run the simulator, return the run's result JSON (a RunResult,
    its final averaged accuracies, and the grid point it belongs to)."""
    config = task.experiment()
    torch.set_num_threads(config.threads)
    result = Simulation(config, task.algorithm, provision(config)).run()
    payload = result.model_dump(mode="json")
    payload["global_accuracy"], payload["local_accuracy"] = result.global_accuracy, result.local_accuracy
    payload["sweep"] = {"name": task.name, "point": task.point, "algorithm": task.algorithm, "seed": task.seed}
    return payload


def attempt(task: RunTask) -> Outcome:
    """:func:`execute`, with a failure reported as this run's outcome rather than ending the sweep."""
    try:
        return Outcome(task, payload=execute(task))
    except Exception as exc:  # any failure of one run is that run's outcome, not the sweep's
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return Outcome(task, error=f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})")
