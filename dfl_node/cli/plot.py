"""`dfl-node plot`: accuracy curves of several runs on one figure (like 000's Figs. 4–6), or with
``--distribution`` the histograms of the nodes' final local accuracies (like 002's Figs. 3–10).

A round-mode run has a fleet-wide round to draw against; an async run has none (the ``round`` of its
records counts the fleet's fusions), so it is drawn against the seconds since it started, which its
records carry (:class:`XAxis`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from dfl_node.cli.plot_compare import plot_series, report
from dfl_node.plotting import use_agg
from dfl_node.results import EvalRecord, RunResult, read_results


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", "output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Figure (.png, .pdf, .svg); --out, as every verb that writes names it.")
@click.option("--title", default=None, help="Figure title (default: from the first run's config).")
@click.option("--baseline", metavar="ALGORITHM", default=None, help="Compare every run with this algorithm's run "
              "(003 Table 8): the rounds each needs to reach its final global accuracy, printed and written to "
              "the figure's .json.")
@click.option("--distribution", is_flag=True, help="Histograms of the nodes' final local accuracies instead "
              "(002's fairness view): one panel per experiment name, one bar per algorithm and bin.")
def plot(results: tuple[Path, ...], output: Path, title: str | None, distribution: bool,
         baseline: str | None = None) -> None:
    """Plot averaged global (left) and local (right) accuracy of RESULTS… (<algorithm>.json files).

    Round-mode runs are drawn against rounds. Async runs (testbed or simulate --mode async) have no
    rounds: they are drawn against seconds since the run started (a simulated fleet's are virtual
    seconds), or against the fleet's fusions where a result has no times. A plot of round and async
    runs gets one row of panels per x-axis: rounds on top, then seconds, then fusions.

    Legend: each run's algorithm, its driver and mode where the runs mix them, and the settings that
    tell apart runs of one algorithm, leaving out those a run's mode ignores (rounds of an async run,
    which ran for --duration); runs still alike are numbered #1, #2… in the order given.
    """
    use_agg("dfl-node plot")
    runs = [read_results(path) for path in results]
    labels = run_labels(runs)
    fig = distribution_figure(runs, title) if distribution else curves_figure(runs, labels, title)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    click.echo(f"wrote {output}")
    if not distribution:  # per-cluster accuracy (003 Fig. 5), rounds to reach --baseline (Table 8)
        report(runs, labels, output, baseline)


@dataclass(frozen=True)
class XAxis:
    """What one row of panels is drawn against: its label, the mode of its runs, and a record's x."""

    label: str
    mode: str
    at: Callable[[EvalRecord], float]


ROUNDS = XAxis("round", "round", lambda record: record.round)
SECONDS = XAxis("seconds since the run started", "async", lambda record: record.wall_time_s)
FUSIONS = XAxis("fusions (completed exchanges, summed over the fleet)", "async", lambda record: record.round)
X_AXES = (ROUNDS, SECONDS, FUSIONS)  # the order of the rows


def x_axis(run: RunResult) -> XAxis:
    """Rounds for a round-mode run; for an async run seconds, as every async result records them (the
    testbed's since its launch, a simulated fleet's virtual), or its fusions where the times are all
    zero (a result that has none)."""
    if run.mode != "async":
        return ROUNDS
    return SECONDS if any(record.wall_time_s > 0 for record in run.history) else FUSIONS


def axis_label(axis: XAxis, runs: list[RunResult]) -> str:
    """The axis's label, saying where its seconds are a simulated fleet's virtual ones."""
    if axis is SECONDS and any(run.driver == "simulate" for run in runs):
        return f"{axis.label} (simulate: virtual seconds)"
    return axis.label


def curves_figure(runs: list[RunResult], labels: list[str], title: str | None) -> Any:
    """Averaged global (left) and local (right) accuracy, a row of the two panels per x-axis the runs
    need (:func:`x_axis`): rounds and seconds do not share a scale, so round and async runs never
    share a panel; ``labels``: the runs' legend labels (:func:`run_labels`)."""
    import matplotlib.pyplot as plt

    rows: dict[XAxis, list[tuple[RunResult, str]]] = {axis: [] for axis in X_AXES}
    for run, label in zip(runs, labels):
        rows[x_axis(run)].append((run, label))
    drawn = {axis: members for axis, members in rows.items() if members}
    fig, panels = plt.subplots(len(drawn), 2, figsize=(11, 4.2 * len(drawn)), sharey=True, squeeze=False)
    for (ax_global, ax_local), (axis, members) in zip(panels, drawn.items()):
        for run, label in members:
            xs = [axis.at(record) for record in run.history]
            ax_global.plot(xs, [record.global_accuracy for record in run.history], label=label)
            ax_local.plot(xs, [record.local_accuracy for record in run.history], label=label)
            plot_series(ax_global, ax_local, run, label, axis.at)  # DFML's regular models, FML's memes: dashed
        for ax, name in ((ax_global, "averaged global accuracy"), (ax_local, "averaged local accuracy")):
            ax.set_xlabel(axis_label(axis, [run for run, _ in members]))
            ax.set_title(name if len(drawn) == 1 else f"{name}, {axis.mode} mode")
            ax.grid(alpha=0.3)
        ax_global.set_ylabel("accuracy")
        ax_global.legend(loc="lower right")
    config = runs[0].config
    fig.suptitle(title or f"{config.get('dataset')} {config.get('model')}, {config.get('partition')}"
                 + (f" ζ={config.get('zeta')}" if config.get("partition") in ("shards", "classes") else "")
                 + f", K={config.get('nodes')}")
    fig.tight_layout()
    return fig


NOT_SETTINGS = {"name", "data_dir"}  # what a run is called and where its data lay, not how it ran
ROUND_MODE_ONLY = {"rounds"}  # an async run ends by --duration: its config's rounds (a default) did nothing


def run_settings(run: RunResult) -> dict[str, Any]:
    """The config settings that shaped ``run``: those its mode ignores are left out, so that a legend
    never tells runs apart by a value that did nothing (the testbed's default rounds=20 of an async run)."""
    ignored = NOT_SETTINGS | (ROUND_MODE_ONLY if run.mode == "async" else set())
    return {key: value for key, value in run.config.items() if key not in ignored}


def run_labels(runs: list[RunResult]) -> list[str]:
    """A legend label per run: its algorithm, its driver and mode in parentheses where the runs mix them,
    plus the settings (:func:`run_settings`) that tell apart runs of one algorithm (``selection=probe-samples``,
    ``seed=1``); labels still alike (async runs that differ only in their --duration, which results do not
    record) are numbered, so that no two curves share one."""
    mixed = [field for field in ("driver", "mode") if len({getattr(run, field) for run in runs}) > 1]
    base = [run.algorithm + (f" ({', '.join(getattr(run, field) for field in mixed)})" if mixed else "")
            for run in runs]
    labels = list(base)
    for label in set(base):
        same = [i for i, other in enumerate(base) if other == label]
        settings = {i: run_settings(runs[i]) for i in same}
        keys = sorted({key for s in settings.values() for key in s})
        differ = [key for key in keys if len({repr(s.get(key)) for s in settings.values()}) > 1]
        for i, s in settings.items():
            shown = [f"{key}={s[key]}" for key in differ if key in s]
            if shown:
                labels[i] += " " + ", ".join(shown)
    return numbered(labels)


def numbered(labels: list[str]) -> list[str]:
    """``labels`` with each one that occurs more than once numbered #1, #2… in order."""
    counts, seen = Counter(labels), Counter[str]()
    out = []
    for label in labels:
        seen[label] += 1
        out.append(f"{label} #{seen[label]}" if counts[label] > 1 else label)
    return out


def distribution_figure(runs: list[RunResult], title: str | None) -> Any:
    """One panel per experiment (config name, in order of appearance): nodes per 5 % bin of final local
    accuracy, a bar per algorithm, over the bins from the lowest node's up to 100 %."""
    import matplotlib.pyplot as plt

    panels: dict[str, list[RunResult]] = {}
    for run in runs:
        panels.setdefault(str(run.config.get("name", "")), []).append(run)
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.2 * columns, 3.8 * rows), squeeze=False)
    for ax, (name, group) in zip(axes.flat, panels.items()):
        edges = group[0].fairness.bin_edges
        first = min(min(i for i, n in enumerate(r.fairness.histogram) if n) for r in group)
        bins = range(first, len(edges) - 1)
        width = 0.8 / len(group)
        for k, run in enumerate(group):
            counts = [run.fairness.histogram[b] for b in bins]
            label = f"{run.algorithm}: mean {run.local_accuracy:.3f}"
            ax.bar([i + (k - (len(group) - 1) / 2) * width for i in range(len(bins))], counts, width, label=label)
        ax.set_xticks(range(len(bins)), [f"{edges[b]:.0%}–{edges[b + 1]:.0%}" for b in bins], rotation=45,
                      ha="right", fontsize=8)
        ax.set_ylabel("nodes")
        ax.set_xlabel("local accuracy")
        ax.set_title(name)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
