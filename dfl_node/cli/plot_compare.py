"""What `dfl-node plot` adds for comparisons of 003's kind: every other model a run reports (DFML's regular
models, FML's memes) as a dashed curve beside its solid one, the final global accuracy of each
architecture cluster (003 Fig. 5) as a second figure, and with ``--baseline`` the rounds every run needs
to reach the baseline's final global accuracy (003 Table 8), printed and written next to the figure."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from dfl_node.results import EvalRecord, RunResult, cluster_accuracy, comparison


def plot_series(ax_global: Any, ax_local: Any, run: RunResult, label: str, at: Callable[[EvalRecord], float]
                ) -> None:
    """The run's other reported models, dashed, in the colour of its last solid curve; ``at``: a record's x,
    as for the solid curve (its round, or an async run's seconds), so that both share the panel's axis."""
    color = ax_global.lines[-1].get_color() if ax_global.lines else None
    names = dict.fromkeys(name for record in run.history for name in record.series)
    for name in names:
        points = [r for r in run.history if name in r.series]
        xs = [at(r) for r in points]
        ax_global.plot(xs, [r.series[name].global_accuracy for r in points], "--", color=color,
                       label=f"{label}: {name}")
        ax_local.plot(xs, [r.series[name].local_accuracy for r in points], "--", color=color,
                      label=f"{label}: {name}")


def report(runs: list[RunResult], labels: list[str], output: Path, baseline: str | None) -> None:
    """The cluster figure (when some run has several architectures), its bars named by ``labels`` as the
    curves are, and the ``--baseline`` comparison."""
    clusters = [cluster_accuracy(run) for run in runs]
    if any(len(c) > 1 for c in clusters):
        path = output.with_name(f"{output.stem}-clusters{output.suffix}")
        cluster_figure(labels, clusters).savefig(path, dpi=120)
        click.echo(f"wrote {path}")
    if baseline:
        try:
            table = comparison(runs, baseline)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--baseline") from None
        path = output.with_suffix(".json")
        path.write_text(json.dumps(table, indent=1))
        Console().print(comparison_table(table))
        click.echo(f"wrote {path}")


def cluster_figure(labels: list[str], clusters: list[dict[str, float]]) -> Any:
    """003 Fig. 5: one group of bars per architecture cluster, one bar per run (its legend label)."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(name for c in clusters for name in c))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(names) + 2), 4.2))
    width = 0.8 / len(labels)
    for k, (label, accs) in enumerate(zip(labels, clusters)):
        xs = [i + (k - (len(labels) - 1) / 2) * width for i, name in enumerate(names) if name in accs]
        ax.bar(xs, [accs[name] for name in names if name in accs], width, label=label)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("final global accuracy")
    ax.set_title("per architecture cluster")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def comparison_table(table: dict) -> Table:
    out = Table(title=f"against {table['baseline']}'s final global accuracy "
                      f"{table['baseline_final_global_accuracy']:.4f}")
    for col in ("algorithm", "global acc", "other models", "rounds", "rounds to reach it", "speed-up"):
        out.add_column(col, justify="left" if col == "algorithm" else "right")
    for name, row in table["runs"].items():
        others = ", ".join(f"{k} {v:.4f}" for k, v in row["series"].items())
        reached = "—" if row["rounds_to_baseline_final"] is None else str(row["rounds_to_baseline_final"])
        speedup = "—" if row["speedup"] is None else f"{row['speedup']:.2f}×"
        out.add_row(name, f"{row['global_accuracy']:.4f}", others, str(row["rounds"]), reached, speedup)
    return out
