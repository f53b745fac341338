"""`dfl-node simulate`: run algorithms in the in-process simulator and report accuracies."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from dfl_node.cli.options import DEMO_DEFAULTS, experiment_config, experiment_options
from dfl_node.learning.fleet import provision
from dfl_node.results import EvalRecord, RunResult, write_results
from dfl_node.sim import Simulation


def summary_table(results: list[RunResult], title: str) -> Table:
    """Final averaged accuracies per algorithm (shared by simulate and testbed)."""
    table = Table(title=title)
    for col in ("algorithm", "driver", "rounds", "global acc", "local acc", "MB sent", "wall s"):
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for r in results:
        table.add_row(
            r.algorithm, r.driver, str(r.rounds), f"{r.global_accuracy:.4f}", f"{r.local_accuracy:.4f}",
            f"{r.bytes_transmitted / 1e6:.1f}", f"{r.wall_time_s:.1f}",
        )
    return table


def node_table(results: list[RunResult]) -> Table:
    """Each node's final global / local accuracy under each algorithm."""
    table = Table(title="per node: global / local accuracy")
    table.add_column("node")
    for r in results:
        table.add_column(r.algorithm, justify="right")
    for i, node in enumerate(results[0].nodes):
        cells = [f"{r.nodes[i].global_accuracy:.3f} / {r.nodes[i].local_accuracy:.3f}" for r in results]
        table.add_row(node.id, *cells)
    return table


@click.command()
@experiment_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Folder for <algorithm>.json/.csv.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def simulate(out: Path | None, quiet: bool, config_path: Path | None, **flags: object) -> None:
    """Run K virtual nodes in-process, round by round (no arguments: a quick demo on digits)."""
    config = experiment_config(config_path, DEMO_DEFAULTS, **flags)
    console = Console(stderr=True)
    fleet = provision(config)
    results = []
    for algorithm in config.algorithms:
        sim = Simulation(config, algorithm, fleet)
        with Progress(
            TextColumn(f"[bold]{algorithm}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[acc]}"), console=console, disable=quiet, transient=False,
        ) as progress:
            task = progress.add_task(algorithm, total=config.rounds, acc="")

            def advance(done: int, record: EvalRecord | None, task: TaskID = task) -> None:
                fields = ({"acc": f"global {record.global_accuracy:.3f} local {record.local_accuracy:.3f}"}
                          if record else {})
                progress.update(task, completed=done, **fields)  # type: ignore[arg-type]  # rich's **fields: Any

            result = sim.run(advance)
        results.append(result)
        if out:
            write_results(result, out)
    Console().print(summary_table(results, f"{config.name}: {config.dataset}, K={config.nodes}, {config.partition}"))
    Console().print(node_table(results))
