"""One run of a sweep, as a worker (a pool process or a Ray task) does it.

A worker returns the result instead of writing it: on a Ray cluster it may run on another machine,
and the driver alone owns the output folder, so a result file is written once, whole, by one process.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from dfl_node.sim import run_fleet
from dfl_node.sweep.grid import RunTask


@dataclass(frozen=True)
class Outcome:
    """What came back for one run: its result JSON, or the error that stopped it."""

    task: RunTask
    payload: dict[str, Any] | None = None
    error: str | None = None


def execute(task: RunTask) -> dict[str, Any]:
    """Run the simulator on the run's config, return the run's result JSON (a RunResult, its final averaged
    accuracies, and the grid point it belongs to)."""
    result = run_fleet(task.experiment(), task.algorithm, **task.run)
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
