"""What a sweep found: final accuracies mean ± std over seeds per grid point and algorithm (a table
and ``summary.csv``), and per grid point a figure of the accuracy curves averaged over seeds.

Built from the result files, so a sweep run again (all runs skipped) reports the same.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

from rich.table import Table

from dfl_node.plotting import use_agg
from dfl_node.sweep.grid import RunTask

Finished = list[tuple[RunTask, dict[str, Any]]]  # each finished run with its result JSON


@dataclass(frozen=True)
class SummaryRow:
    """One grid point × algorithm over its seeds."""

    point: dict[str, Any]
    label: str
    algorithm: str
    seeds: list[int]
    rounds: int
    global_mean: float
    global_std: float
    local_mean: float
    local_std: float


def _spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one seed)."""
    return fmean(values), stdev(values) if len(values) > 1 else 0.0


def _by_point_and_algorithm(finished: Finished) -> dict[tuple[str, str], Finished]:
    groups: dict[tuple[str, str], Finished] = defaultdict(list)
    for task, payload in finished:
        groups[task.label, task.algorithm].append((task, payload))
    return groups


def summarize(finished: Finished) -> list[SummaryRow]:
    rows = []
    for (label, algorithm), runs in _by_point_and_algorithm(finished).items():
        glob, loc = _spread([p["global_accuracy"] for _, p in runs]), _spread([p["local_accuracy"] for _, p in runs])
        rows.append(SummaryRow(runs[0][0].point, label, algorithm, sorted(t.seed for t, _ in runs),
                               runs[0][1]["rounds"], *glob, *loc))
    return rows


def write_csv(rows: list[SummaryRow], path: Path) -> None:
    settings = sorted({key for row in rows for key in row.point})
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*settings, "algorithm", "seeds", "rounds", "global_accuracy_mean", "global_accuracy_std",
                         "local_accuracy_mean", "local_accuracy_std"])
        for r in rows:
            stats = (r.global_mean, r.global_std, r.local_mean, r.local_std)
            writer.writerow([*(r.point.get(k, "") for k in settings), r.algorithm, len(r.seeds), r.rounds,
                             *(f"{value:.6f}" for value in stats)])


def summary_table(rows: list[SummaryRow], title: str) -> Table:
    table = Table(title=title)
    for col in ("grid point", "algorithm", "seeds", "rounds", "global acc", "local acc"):
        table.add_column(col, justify="left" if col in ("grid point", "algorithm") else "right")
    for r in rows:
        table.add_row(r.label, r.algorithm, str(len(r.seeds)), str(r.rounds),
                      f"{r.global_mean:.4f} ± {r.global_std:.4f}", f"{r.local_mean:.4f} ± {r.local_std:.4f}")
    return table


def plot_points(finished: Finished, out_dir: Path) -> list[Path]:
    """``<grid point>.png`` per grid point: global (left) and local (right) accuracy against rounds,
    one line per algorithm, the mean over seeds with a ± std band."""
    use_agg("dfl-node sweep")
    import matplotlib.pyplot as plt

    by_point: dict[str, dict[str, Finished]] = defaultdict(dict)
    for (label, algorithm), runs in _by_point_and_algorithm(finished).items():
        by_point[label][algorithm] = runs
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for label, algorithms in by_point.items():
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for algorithm, runs in algorithms.items():
            histories = [p["history"] for _, p in runs]
            rounds = [h["round"] for h in histories[0]]
            for ax, key in zip(axes, ("global_accuracy", "local_accuracy")):
                curves = [[h[key] for h in history] for history in histories]
                mean_std = [_spread(list(at_round)) for at_round in zip(*curves)]
                mean = [m for m, _ in mean_std]
                line, = ax.plot(rounds, mean, label=f"{algorithm} ({len(runs)} seeds)")
                ax.fill_between(rounds, [m - s for m, s in mean_std], [m + s for m, s in mean_std],
                                color=line.get_color(), alpha=0.15)
        for ax, name in zip(axes, ("averaged global accuracy", "averaged local accuracy")):
            ax.set_xlabel("round")
            ax.set_title(name)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("accuracy (mean over seeds)")
        axes[0].legend(loc="lower right")
        fig.suptitle(label)
        fig.tight_layout()
        path = out_dir / f"{label}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
