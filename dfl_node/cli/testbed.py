"""`dfl-node testbed`: provision shards, launch N real daemons, watch them, collect, tear down."""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dfl_node.cli.options import DEMO_DEFAULTS, experiment_config, experiment_options
from dfl_node.cli.simulate import node_table, summary_table
from dfl_node.learning.fleet import provision, write_fleet
from dfl_node.results import RunResult, write_results
from dfl_node.testbed.launcher import Placement, all_done, collect, plan_fleet, wait_until

TESTBED_DEFAULTS = {**DEMO_DEFAULTS, "name": "digits-testbed", "nodes": 4, "rounds": 20, "eval_every": 5,
                    "algorithms": ["defkt"]}


def fleet_table(statuses: dict[str, dict | None]) -> Table:
    table = Table(title="fleet")
    for col in ("node", "round", "role", "peers", "sent", "recv", "fusions", "local", "global", "done"):
        table.add_column(col)
    for node_id, s in statuses.items():
        if s is None:
            table.add_row(node_id, "-", "starting…", *[""] * 7)
            continue
        fmt = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
        table.add_row(node_id, str(s["round"]), s["role"], str(sum(p["alive"] for p in s["peers"])),
                      str(s["models_sent"]), str(s["models_received"]), str(s["fusions"]),
                      fmt(s["local_accuracy"]), fmt(s["global_accuracy"]), "yes" if s["done"] else "")
    return table


@contextlib.contextmanager
def placements(count: int, netns: bool) -> Iterator[list[Placement]]:
    if not netns:
        yield [Placement("127.0.0.1") for _ in range(count)]
        return
    from dfl_node.testbed.netns import NetnsTopology

    with NetnsTopology(count) as topology:
        yield [Placement(h.address, h.wrap) for h in topology.hosts]


@click.command()
@experiment_options
@click.option("--out", type=click.Path(path_type=Path), help="RESULTS.json (one algorithm) or a folder.")
@click.option("--mode", type=click.Choice(["round", "async"]), default="round", show_default=True)
@click.option("--netns", is_flag=True, help="One network namespace per node on a bridge (needs root).")
@click.option("--mdns/--no-mdns", default=True, show_default=True, help="Discover by mDNS.")
@click.option("--static-peers", is_flag=True, help="Also give every node the others' addresses.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Give up after this many seconds.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), help="Keep shards, state and logs here.")
def testbed(out: Path | None, mode: str, netns: bool, mdns: bool, static_peers: bool, timeout: float,
            workdir: Path | None, config_path: Path | None, **flags: Any) -> None:
    """Run a fleet of real daemons on this machine and collect results in the simulator's schema."""
    config = experiment_config(config_path, TESTBED_DEFAULTS, **flags)
    if out and out.suffix == ".json" and len(config.algorithms) > 1:
        raise click.UsageError("several algorithms need --out FOLDER")
    console = Console()
    fleet = provision(config)
    results: list[RunResult] = []
    with contextlib.ExitStack() as stack:
        root = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dfl-testbed-")))
        write_fleet(fleet, root / "shards")
        for algorithm in config.algorithms:
            run_dir = root / algorithm
            run_dir.mkdir(parents=True, exist_ok=True)
            with placements(config.nodes, netns) as places:
                nodes = plan_fleet(config, algorithm, root / "shards", run_dir, places, swarm=f"tb-{uuid.uuid4().hex[:8]}",
                                   mode=mode, mdns=mdns, static_peers=static_peers)
                started = time.perf_counter()
                try:
                    for node in nodes:
                        node.start()
                    with Live(console=console, refresh_per_second=2) as live:
                        wait_until(nodes, all_done, timeout, on_poll=lambda s: live.update(fleet_table(s)))
                    result = collect(nodes, config, algorithm, fleet, time.perf_counter() - started)
                except (TimeoutError, RuntimeError) as exc:
                    raise click.ClickException(f"{exc}\nlogs: {run_dir}") from exc
                finally:
                    for node in nodes:
                        node.stop()
            results.append(result)
            if out and out.suffix == ".json":
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(result.model_dump_json(indent=1))
            elif out:
                write_results(result, out)
    console.print(summary_table(results, f"testbed: {config.nodes} daemons, {config.dataset}, {config.partition}, {mode} mode"))
    console.print(node_table(results))
