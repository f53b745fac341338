"""`dfl-node sweep GRID.yaml`: a grid of simulator configs × seeds, on a process pool or on Ray."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.console import Console

from dfl_node.cli.options import SettingsError
from dfl_node.settings.loading import ConfigError
from dfl_node.sweep import grid as grid_format
from dfl_node.sweep.driver import PLOTS_DIR, SUMMARY_FILE, run_sweep
from dfl_node.sweep.report import summary_table

HELP = f"""Run every grid point × seed × algorithm of GRID (a YAML or TOML file) in the simulator.

Runs go to a local process pool (--workers, one torch thread each) or, with --ray, to Ray: `auto`
joins this machine's cluster (`ray start`), an ADDRESS joins that one, `local` starts a private
instance here. On a GPU (device: cuda), --per-device N runs N at once on it: N pool processes, or
with --streams N threads of this process, each on a CUDA stream of its own (docs/gpu.md). Each
run writes OUT/<run name>.json when it ends; a sweep run again skips runs whose file is there,
and Ctrl-C keeps the finished ones. At the end: a table and OUT/{SUMMARY_FILE} (final accuracies,
mean ± std over seeds) and OUT/{PLOTS_DIR}/<grid point>.png (curves averaged over seeds).

GRID format:

{grid_format.__doc__}"""


@click.command(help=HELP)
@click.argument("grid", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the results (default: runs/<GRID file name without suffix>).")
@click.option("--workers", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default="CPU count",
              help="Runs at once: pool processes, or CPUs of a --ray local instance.")
@click.option("--ray", "ray", metavar="auto|local|ADDRESS",
              help="Run on Ray instead of the pool (needs pip install -e '.[ray]').")
@click.option("--per-device", type=click.IntRange(min=1), default=None,
              help="Runs at once on the one device the runs use (a GPU): in place of --workers.")
@click.option("--streams", is_flag=True,
              help="Runs at once as threads of this process, each on a CUDA stream of its own, not processes.")
def sweep(grid: Path, out: Path | None, workers: int, ray: str | None, per_device: int | None, streams: bool) -> None:
    out = out or Path("runs") / grid.stem
    if streams and ray is not None:
        raise click.UsageError("--streams runs threads of this process; --ray runs Ray tasks: choose one")
    try:
        outcome = run_sweep(grid, out, workers=per_device or workers, ray=ray, streams=streams,
                            echo=lambda line: click.echo(line))
    except ConfigError as exc:
        raise SettingsError(exc) from None
    if outcome.interrupted:
        click.echo(f"interrupted: {len(outcome.skipped) + len(outcome.ran)} of {len(outcome.tasks)} runs done in "
                   f"{out}; run the same command again to finish the rest", err=True)
        sys.exit(130)
    Console().print(summary_table(outcome.rows, f"sweep {grid.name}: {len(outcome.tasks)} runs in {out}"))
    click.echo(f"wrote {out / SUMMARY_FILE} and {out / PLOTS_DIR}/")
    if outcome.failed:
        click.echo(f"error: {len(outcome.failed)} runs failed: {', '.join(sorted(outcome.failed))}", err=True)
        sys.exit(1)
