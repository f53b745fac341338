"""`dfl-node simulate`: run algorithms in the in-process simulator and report accuracies."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from dfl_node.cli.options import (
    DEMO_DEFAULTS,
    NODE_SETTINGS,
    experiment_config,
    experiment_options,
    node_options,
)
from dfl_node.config import ExperimentConfig
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
@click.option("--mode", type=click.Choice(["round", "async"]), default=None,
              help="Run K real nodes (the daemon's own schedulers, roles and checkpoints) on an in-memory network "
                   "and a virtual clock, in this mode; left out: the fast simulator (round mode, same results).")
@click.option("--duration", type=float, default=600.0, show_default=True,
              help="async mode (--mode async): how long each node volunteers, in virtual seconds.")
@click.option("--faults", "fault_source", type=click.Choice(["config", "random"]), default="config",
              show_default=True, help="--mode: the config's faults: schedule, or --kills random kills and a partition, "
                                      "then --slowdowns slow links and nodes.")
@click.option("--kills", type=click.IntRange(min=1), default=20, show_default=True, help="--faults random: kill -9s.")
@click.option("--slowdowns", type=click.IntRange(min=0), default=0, show_default=True,
              help="--faults random: slow, lossy links and slow nodes, in turn, after the kills.")
@click.option("--fault-seed", type=int, default=0, show_default=True, help="--faults random: the schedule's seed.")
@node_options
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="--mode: where the nodes' shards and state dirs go (default: a temporary folder).")
def simulate(out: Path | None, quiet: bool, config_path: Path | None, mode: str | None, duration: float,
             fault_source: str, kills: int, slowdowns: int, fault_seed: int, workdir: Path | None,
             **flags: object) -> None:
    """Run K virtual nodes in-process, round by round (no arguments: a quick demo on digits); with --mode, as
    real nodes on a virtual clock, with device and link costs and faults from the config."""
    node_settings = {name: flags.pop(name) for name in NODE_SETTINGS if flags.get(name) is not None}
    config = experiment_config(config_path, DEMO_DEFAULTS, **flags)
    if mode is not None:
        randomly = fault_source == "random"
        results = [_run_fleet(config, algorithm, mode, duration, (kills, slowdowns) if randomly else (0, 0),
                              fault_seed, workdir, node_settings, out) for algorithm in config.algorithms]
        _report(config, results)
        return
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
    _report(config, results)


def _report(config: ExperimentConfig, results: list[RunResult]) -> None:
    Console().print(summary_table(results, f"{config.name}: {config.dataset}, K={config.nodes}, {config.partition}"))
    Console().print(node_table(results))


def _run_fleet(config: ExperimentConfig, algorithm: str, mode: str, duration: float, random_faults: tuple[int, int],
               seed: int, workdir: Path | None, node_settings: dict[str, Any], out: Path | None) -> RunResult:
    """One algorithm as a fleet of real nodes (:func:`~dfl_node.sim.experiment.run_fleet`): a JSON line of what
    it did (virtual seconds, faults, device classes), its results written to ``out``."""
    from dfl_node.sim.experiment import run_fleet  # the daemon's node: imported only for --mode

    with contextlib.ExitStack() as stack:
        folder = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dfl-sim-")))
        try:
            result = run_fleet(config, algorithm, folder, mode=mode, duration=duration if mode == "async" else 0.0,
                               random_kills=random_faults[0], random_slowdowns=random_faults[1], fault_seed=seed,
                               **node_settings)
        except ValueError as exc:  # devices:/links: that do not fit the fleet
            raise click.UsageError(str(exc)) from None
    summary: dict[str, Any] = {"algorithm": algorithm, "mode": mode, "virtual_s": round(result.wall_time_s, 1)}
    if result.faults is not None:
        summary["faults"] = {k: v for k, v in result.faults.items() if k != "faults"}  # each fault: in --out
    if result.device_classes is not None:
        summary["device_classes"] = result.device_classes
    click.echo(json.dumps(summary))
    if out:
        write_results(result, out)
    return result
