"""`dfl-node plot`: accuracy-versus-rounds curves of several runs on one figure (like 000's Figs. 4–6), or
with ``--distribution`` the histograms of the nodes' final local accuracies (like 002's Figs. 3–10)."""

from __future__ import annotations

from pathlib import Path

import click

from dfl_node.cli.plot_compare import plot_series, report
from dfl_node.results import RunResult, read_results


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
    """Plot averaged global (left) and local (right) accuracy against rounds for RESULTS… (<algorithm>.json files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_results(path) for path in results]
    if distribution:
        fig = distribution_figure(runs, title)
        output.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(output, dpi=120)
        click.echo(f"wrote {output}")
        return
    fig, (ax_global, ax_local) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for run, label in zip(runs, run_labels(runs)):
        rounds = [r.round for r in run.history]
        ax_global.plot(rounds, [r.global_accuracy for r in run.history], label=label)
        ax_local.plot(rounds, [r.local_accuracy for r in run.history], label=label)
        plot_series(ax_global, ax_local, run, label)  # DFML's regular models, FML's memes: dashed
    for ax, name in ((ax_global, "averaged global accuracy"), (ax_local, "averaged local accuracy")):
        ax.set_xlabel("round")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    ax_global.set_ylabel("accuracy")
    ax_global.legend(loc="lower right")
    config = runs[0].config
    fig.suptitle(title or f"{config.get('dataset')} {config.get('model')}, {config.get('partition')}"
                 + (f" ζ={config.get('zeta')}" if config.get("partition") in ("shards", "classes") else "")
                 + f", K={config.get('nodes')}")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    click.echo(f"wrote {output}")
    report(runs, output, baseline)  # per-cluster accuracy (003 Fig. 5), rounds to reach --baseline (Table 8)


def run_labels(runs: list[RunResult]) -> list[str]:
    """A legend label per run: its algorithm (and driver, when runs mix them), plus the settings that tell
    apart runs of one algorithm (``selection=probe-samples``, ``seed=1``)."""
    base = [f"{r.algorithm} ({r.driver})" if len({x.driver for x in runs}) > 1 else r.algorithm for r in runs]
    labels = list(base)
    for label in set(base):
        same = [i for i, other in enumerate(base) if other == label]
        keys = sorted({k for i in same for k in runs[i].config} - {"name", "data_dir"})
        differ = [k for k in keys if len({repr(runs[i].config.get(k)) for i in same}) > 1]
        for i in same:
            if differ:
                labels[i] += " " + ", ".join(f"{k}={runs[i].config.get(k)}" for k in differ)
    return labels


def distribution_figure(runs: list[RunResult], title: str | None):
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
