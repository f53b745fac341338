"""A sweep from start to end: expand the grid, skip finished runs, run the rest on a pool or on Ray,
write each result as it comes back, then the summary and plots.

Ctrl-C (KeyboardInterrupt) stops the runner; the results written so far stay, whole, and the
outcome says the sweep was interrupted (no report: a sweep run again finishes the missing runs and
reports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dfl_node.plotting import require_matplotlib
from dfl_node.sweep.execute import Outcome
from dfl_node.sweep.grid import RunTask, expand
from dfl_node.sweep.pool import run_pool
from dfl_node.sweep.ray_runner import require_ray, run_ray
from dfl_node.sweep.report import SummaryRow, plot_points, summarize, write_csv
from dfl_node.sweep.store import read_result, remove_leftovers, result_path, write_atomic
from dfl_node.sweep.threads import run_threads

SUMMARY_FILE, PLOTS_DIR = "summary.csv", "plots"


@dataclass
class SweepOutcome:
    tasks: list[RunTask]
    skipped: list[str] = field(default_factory=list)  # names of runs finished before this sweep
    ran: list[str] = field(default_factory=list)  # names of runs this sweep finished
    failed: dict[str, str] = field(default_factory=dict)  # run name → error
    interrupted: bool = False
    rows: list[SummaryRow] = field(default_factory=list)


def run_sweep(grid_path: Path, out: Path, *, workers: int, ray: str | None = None, streams: bool = False,
              echo: Callable[[str], None] = print) -> SweepOutcome:
    """Run every missing run of ``grid_path`` into ``out``, ``workers`` at once; ``ray``: None (a process pool, or
    with ``streams`` threads of this process each on a CUDA stream: :mod:`dfl_node.sweep.threads`), ``auto``,
    ``local`` or a cluster address (see :mod:`dfl_node.sweep.ray_runner`)."""
    tasks = expand(grid_path)
    require_matplotlib("dfl-node sweep")  # its report's plots: fail before the runs, not after them
    if ray is not None:
        require_ray()
    out.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    outcome = SweepOutcome(tasks)
    todo: list[RunTask] = []
    for task in tasks:
        if read_result(result_path(out, task)) is not None:
            outcome.skipped.append(task.name)
        else:
            todo.append(task)
    if outcome.skipped:
        echo(f"{len(outcome.skipped)} of {len(tasks)} runs already done in {out}")

    def finished(result: Outcome) -> None:
        done = len(outcome.ran) + len(outcome.failed) + 1
        if result.payload is None:
            outcome.failed[result.task.name] = result.error or "unknown error"
            echo(f"[{done}/{len(todo)}] FAILED {result.task.name}: {result.error}")
            return
        write_atomic(result_path(out, result.task), result.payload)
        outcome.ran.append(result.task.name)
        echo(f"[{done}/{len(todo)}] done {result.task.name}: global {result.payload['global_accuracy']:.4f} "
             f"local {result.payload['local_accuracy']:.4f} ({result.payload['wall_time_s']:.1f} virtual s)")

    try:
        if ray is not None:
            run_ray(todo, ray, finished, num_cpus=workers)
        elif streams:
            run_threads(todo, workers, finished)
        else:
            run_pool(todo, workers, finished)
    except KeyboardInterrupt:
        outcome.interrupted = True
        return outcome
    outcome.rows = report(tasks, out)
    return outcome


def report(tasks: list[RunTask], out: Path) -> list[SummaryRow]:
    """``summary.csv`` and ``plots/<grid point>.png`` from the finished runs' files."""
    results = [(task, read_result(result_path(out, task))) for task in tasks]
    finished = [(task, payload) for task, payload in results if payload is not None]
    rows = summarize(finished)
    write_csv(rows, out / SUMMARY_FILE)
    plot_points(finished, out / PLOTS_DIR)
    return rows
