"""`dfl-node simulate`: run algorithms on K real nodes in one process (:mod:`dfl_node.sim`) and report accuracies."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from dfl_node.cli.logs import quieter_by_default
from dfl_node.cli.options import (
    DEMO_DEFAULTS,
    NODE_SETTINGS,
    experiment_config,
    experiment_options,
    node_options,
)
from dfl_node.cli.plugins import EPILOG
from dfl_node.learning.provision import provision
from dfl_node.results import RunResult, write_results
from dfl_node.settings.experiment import ExperimentConfig

if TYPE_CHECKING:
    from dfl_node.sim.experiment import Progress
    from dfl_node.sweep.execute import Outcome


def summary_table(results: list[RunResult], title: str, seconds: str = "wall s") -> Table:
    """Final averaged accuracies per algorithm (shared by simulate and testbed); ``seconds`` names the run's
    time column (a simulated fleet's seconds are virtual). With adversaries, the honest nodes' beside the fleet's;
    with differential privacy, the largest ε a node spent."""
    attacked = any(r.adversaries for r in results)
    private = any(n.epsilon is not None for r in results for n in r.nodes)
    table = Table(title=title)
    honest = ("honest global", "honest local") if attacked else ()
    metric = short_metric(results[0].metric)
    for col in ("algorithm", "driver", "rounds", f"global {metric}", f"local {metric}", *honest,
                *(("max ε",) if private else ()), "MB sent", seconds):
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for r in results:
        figures = (f"{r.honest_global_accuracy:.4f}", f"{r.honest_local_accuracy:.4f}") if attacked else ()
        spent = [n.epsilon for n in r.nodes if n.epsilon is not None]
        epsilon = (f"{max(spent):.3g}" if spent else "–",) if private else ()
        table.add_row(
            r.algorithm, r.driver, str(r.rounds), f"{r.global_accuracy:.4f}", f"{r.local_accuracy:.4f}", *figures,
            *epsilon, f"{r.bytes_transmitted / 1e6:.1f}", f"{r.wall_time_s:.1f}",
        )
    return table


def short_metric(metric: str) -> str:
    """A metric as a table's column names it (classification's accuracy, "acc", as it always was)."""
    return "acc" if metric == "accuracy" else metric


def node_table(results: list[RunResult]) -> Table:
    """Each node's final global / local figure (the task's metric) under each algorithm, and the ε it spent with
    differential privacy; a compromised node's attack beside its id."""
    table = Table(title=f"per node: global / local {results[0].metric}")
    table.add_column("node")
    for r in results:
        table.add_column(r.algorithm, justify="right")
    for i, node in enumerate(results[0].nodes):
        cells = [f"{n.global_accuracy:.3f} / {n.local_accuracy:.3f}" + ("" if n.epsilon is None else
                 f" ε {n.epsilon:.3g}") for n in (r.nodes[i] for r in results)]
        attack = results[0].adversaries.get(node.id)
        table.add_row(f"{node.id} ({attack})" if attack else node.id, *cells)
    return table


@click.command(epilog=EPILOG)
@experiment_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Folder for <algorithm>.json/.csv.")
@click.option("--quiet", is_flag=True, help="No progress: no bars on a terminal, no line per tenth of a run in a log.")
@click.option("--mode", type=click.Choice(["round", "async"]), default="round", show_default=True,
              help="The nodes' mode: rounds passed by a token, or async (each node volunteers, for --duration).")
@click.option("--duration", type=float, default=600.0, show_default=True,
              help="async mode (--mode async): how long each node volunteers, in virtual seconds.")
@click.option("--faults", "fault_source", type=click.Choice(["config", "random"]), default="config",
              show_default=True, help="the config's faults: schedule, or --kills random kills and a partition, "
                                      "then --slowdowns slow links and nodes.")
@click.option("--kills", type=click.IntRange(min=1), default=20, show_default=True, help="--faults random: kill -9s.")
@click.option("--slowdowns", type=click.IntRange(min=0), default=0, show_default=True,
              help="--faults random: slow, lossy links and slow nodes, in turn, after the kills.")
@click.option("--fault-seed", type=int, default=0, show_default=True, help="--faults random: the schedule's seed.")
@node_options
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the nodes' shards and state dirs go (default: a temporary folder).")
@click.option("--per-device", type=click.IntRange(min=1), default=1, show_default=True,
              help="Algorithms run at once on the device (on a GPU, 3 runs 000's three together): pool processes, or "
                   "with --streams threads of this process; 1: one after the other, with progress bars.")
@click.option("--streams", is_flag=True,
              help="Run the algorithms at once as threads of this process, each on a CUDA stream of its own.")
def simulate(out: Path | None, quiet: bool, config_path: Path | None, mode: str, duration: float,
             fault_source: str, kills: int, slowdowns: int, fault_seed: int, workdir: Path | None, per_device: int,
             streams: bool, **flags: object) -> None:
    """Run K real nodes in one process — the daemon's own schedulers, roles and checkpoints — on an in-memory
    network and a virtual clock, with device and link costs and faults from the config (no arguments: a quick
    demo on digits). The nodes log warnings only, unless --log-level says otherwise."""
    quieter_by_default("WARNING")
    node_settings = {name: flags.pop(name) for name in NODE_SETTINGS if flags.get(name) is not None}
    config = experiment_config(config_path, DEMO_DEFAULTS, **flags)
    randomly = fault_source == "random"
    run = {"mode": mode, "duration": duration if mode == "async" else 0.0, "random_kills": kills if randomly else 0,
           "random_slowdowns": slowdowns if randomly else 0, "fault_seed": fault_seed, **node_settings}

    def finished(result: RunResult) -> None:  # as each run ends: a later failure loses nothing written
        _say_what_happened(result)
        if out:
            write_results(result, out)

    if per_device > 1 or streams:
        results = _at_once(config, run, workdir, per_device, streams, quiet, finished)
    else:
        results = _one_after_another(config, run, workdir, quiet, finished)
    _report(config, results)


def _one_after_another(config: ExperimentConfig, run: dict[str, Any], workdir: Path | None, quiet: bool,
                       finished: Callable[[RunResult], None]) -> list[RunResult]:
    """Each algorithm in turn in this process, on data provisioned once, with a progress bar."""
    from dfl_node.sim.experiment import run_fleet  # the daemon's node: imported once the flags are read

    data = provision(config)
    results = []
    for algorithm in config.algorithms:
        with _progress_bar(algorithm, run["mode"], _total(config, run), quiet) as bar:
            try:
                results.append(run_fleet(config, algorithm, workdir, data=data, progress=bar, **run))
            except ValueError as exc:  # devices:/links: that do not fit the fleet
                raise click.UsageError(str(exc)) from None
        finished(results[-1])
    return results


def _at_once(config: ExperimentConfig, run: dict[str, Any], workdir: Path | None, per_device: int, streams: bool,
             quiet: bool, finished: Callable[[RunResult], None]) -> list[RunResult]:
    """Each algorithm as a run of its own, ``per_device`` at once, as a sweep runs them (pool processes, or threads
    on CUDA streams): the same results as one after another (each run provisions the same data). Progress is a
    line on stderr per tenth of a run (bars of runs in other processes would interleave), unless ``quiet``."""
    from dfl_node.sweep.grid import RunTask  # noqa: PLC0415 - the runners import the node
    from dfl_node.sweep.pool import run_pool  # noqa: PLC0415
    from dfl_node.sweep.threads import run_threads  # noqa: PLC0415

    tasks = [RunTask(f"{i}-{algorithm}", {}, algorithm, config.learning.seed,
                     config.model_copy(update={"algorithms": [algorithm]}).flat(mode="json"),
                     run={**run, "workdir": workdir / f"{i}-{algorithm}" if workdir else None,
                          "progress": None if quiet else ProgressLines(algorithm, _total(config, run), run["mode"])})
             for i, algorithm in enumerate(config.algorithms)]
    results: dict[str, RunResult] = {}
    failed: list[str] = []

    def done(outcome: Outcome) -> None:
        if outcome.payload is None:
            failed.append(f"{outcome.task.algorithm}: {outcome.error}")
            click.echo(f"{outcome.task.algorithm} failed: {outcome.error}", err=True)
            return
        results[outcome.task.name] = RunResult.model_validate(outcome.payload)
        finished(results[outcome.task.name])

    (run_threads if streams else run_pool)(tasks, per_device, done)
    if failed:
        raise click.ClickException("; ".join(failed))
    return [results[task.name] for task in tasks]


def _total(config: ExperimentConfig, run: dict[str, Any]) -> float:
    """What a run's progress counts to: its rounds, or in async mode its virtual seconds."""
    return config.rounds if run["mode"] == "round" else run["duration"]


@dataclass
class ProgressLines:
    """A run's progress as a line on stderr at each tenth of it: ``defkt: 300/1000 rounds (41 s)``. Picklable,
    so that a pool process reports its own run."""

    label: str
    total: float
    mode: str
    tenths: int = 0
    started: float | None = None

    def __call__(self, rounds: int, virtual_s: float) -> None:
        now = time.monotonic()
        self.started = self.started or now
        reached = rounds if self.mode == "round" else virtual_s
        tenths = int(10 * reached / self.total) if self.total else 10
        if tenths > self.tenths:
            self.tenths = tenths
            unit = "rounds" if self.mode == "round" else "virtual s"
            click.echo(f"{self.label}: {reached:.0f}/{self.total:g} {unit} ({now - self.started:.0f} s)", err=True)


@contextlib.contextmanager
def _progress_bar(algorithm: str, mode: str, total: float, quiet: bool) -> Iterator[Progress | None]:
    """A progress bar on stderr, fed from the simulation's progress thread: rounds, or virtual seconds (async); a
    line per tenth of the run where stderr is no terminal (a log file, a pipe); nothing with ``quiet``."""
    if quiet or not sys.stderr.isatty():
        yield None if quiet else ProgressLines(algorithm, total, mode)
        return
    unit = "rounds" if mode == "round" else "virtual s"
    columns = (TextColumn(f"[bold]{algorithm}"), BarColumn(), TextColumn(f"{{task.completed:.0f}}/{total:g} {unit}"),
               TimeElapsedColumn())
    with RichProgress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(algorithm, total=total)

        def advance(rounds: int, virtual_s: float) -> None:
            bar.update(task, completed=min(total, rounds if mode == "round" else virtual_s))

        yield advance
        bar.update(task, completed=total)


def _say_what_happened(result: RunResult) -> None:
    """One JSON line: virtual seconds, and the faults, the links' cuts, the relays, the device classes and the
    membership-inference attacks (``--privacy-audit``) where the config has them."""
    summary: dict[str, Any] = {"algorithm": result.algorithm, "mode": result.mode,
                               "virtual_s": round(result.wall_time_s, 1)}
    if result.transfers_cut or result.groups_replanned:
        summary["links"] = {"transfers_cut": result.transfers_cut, "bytes_resent": result.bytes_resent,
                            "bytes_transmitted": result.bytes_transmitted, "groups_replanned": result.groups_replanned}
    if result.relays is not None:
        summary["relays"] = result.relays
    if result.faults is not None:
        summary["faults"] = {k: v for k, v in result.faults.items() if k != "faults"}  # each fault: in --out
    if result.device_classes is not None:
        summary["device_classes"] = result.device_classes
    if result.membership_inference is not None:
        summary["membership_inference"] = result.membership_inference.model_dump(mode="json")
    click.echo(json.dumps(summary))


def _report(config: ExperimentConfig, results: list[RunResult]) -> None:
    Console().print(summary_table(results, f"{config.name}: {config.shards.dataset}, K={config.nodes}, "
                                           f"{config.shards.partition}",
                                  seconds="virtual s"))
    Console().print(node_table(results))
