"""`dfl-node testbed`: provision shards, launch N real daemons, watch them, collect, tear down."""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dfl_node.cli.options import DEMO_DEFAULTS, experiment_config, experiment_options
from dfl_node.cli.simulate import node_table, summary_table
from dfl_node.learning.provision import FleetData, provision, write_fleet
from dfl_node.results import RunResult, write_results
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.testbed.launcher import GRPC_PORT, Placement, collect, done_twice, plan_fleet, stop_all, wait_until

TESTBED_DEFAULTS = {**DEMO_DEFAULTS, "name": "testbed", "nodes": 4, "rounds": 20, "eval_every": 5,
                    "algorithms": ["defkt"]}
TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ROUNDS_MEANING = {"round": "rounds: the round every node reached",
                  "async": "rounds: completed exchanges (fusions, summed over the fleet)"}


class Interrupted(BaseException):
    """SIGINT or SIGTERM: unwinds like KeyboardInterrupt, so every ``finally`` tears the fleet down."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_tear_down() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` while the fleet runs.

    Python's default SIGTERM ends the process on the spot, skipping every ``finally``: the daemons,
    their namespaces and the temp folder would outlive the testbed. The first signal ignores the
    next ones, so a second signal cannot cut the (bounded) teardown short.
    """
    def interrupt(signum: int, frame: FrameType | None) -> None:
        for sig in TEARDOWN_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in TEARDOWN_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def work_folder(workdir: Path | None) -> Iterator[Path]:
    """The run's folder for shards, state and logs: ``workdir``, or a temp folder.

    A temp folder is removed after a run that was interrupted (the user stopped it: nothing to
    examine). After a run that succeeded, its shards (the bulk, made again from the config) go and the
    node logs and state stay, with a line saying where: what the nodes said is worth reading after a
    good run too. After any failure it is all kept and its path added to the error, since the logs in
    it are what tells why.
    """
    root = workdir or Path(tempfile.mkdtemp(prefix="dfl-testbed-"))
    try:
        yield root
    except Interrupted:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
        raise
    except BaseException as exc:
        note = f"work folder kept: {root} (shards, state, logs)"
        if isinstance(exc, click.ClickException):  # the note joins the error's own line, in a new exception
            raise click.ClickException(f"{exc.format_message()}\n{note}") from exc
        click.echo(note, err=True)
        raise
    if workdir is None:
        shutil.rmtree(root / "shards", ignore_errors=True)
        click.echo(f"node logs and state kept in {root}", err=True)


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


class KnownAll:
    """How long after the last node started every node of a fleet of ``count`` knew every other alive: the
    youngest node's uptime at the first poll that saw it (an upper bound, by a poll's period)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.after: float | None = None

    def poll(self, statuses: dict[str, dict | None]) -> None:
        if self.after is None and all(s is not None and sum(p["alive"] for p in s["peers"]) == self.count - 1
                                      for s in statuses.values()):
            self.after = min(s["uptime_s"] for s in statuses.values() if s is not None)


@contextlib.contextmanager
def placements(count: int, netns: bool, sites: int, console: Console, nat: int = 0) -> Iterator[list[Placement]]:
    """Loopback addresses, or one namespace per node that is removed however the run ends: on one bridge, or on
    ``sites`` bridges routed to each other, the last ``nat`` of them behind NAT, each node given one ``--join``
    address it can dial, in the next site or a public one (and, when the run ends, which sources each site's mDNS
    came from: its own nodes only)."""
    if not netns:
        yield [Placement("127.0.0.1") for _ in range(count)]
        return
    from dfl_node.testbed.netns import NetnsTopology
    from dfl_node.testbed.sites import SitesTopology

    if sites < 2:
        with NetnsTopology(count) as lan:
            yield [Placement(h.address, h.name) for h in lan.hosts]
        return
    with SitesTopology(sites, count // sites, nat=nat) as topology, topology.multicast_seen() as seen:
        yield [Placement(h.address, h.name, [topology.join_address(i, GRPC_PORT)])
               for i, h in enumerate(topology.hosts)]
    for site, sources in sorted(seen.items()):
        own = {h.address for h in topology.sites[site]}
        console.print(f"site {site + 1}: mDNS from {len(set(sources) & own)} of its {len(own)} nodes, "
                      f"{len(set(sources) - own - {topology.monitors[site].address})} from elsewhere"
                      f"{' (behind NAT)' if site in topology.nat_routers else ''}", highlight=False)


def run_algorithm(config: ExperimentConfig, algorithm: str, fleet: FleetData, root: Path, *, mode: str, duration: float,
                  netns: bool, sites: int, mdns: bool, static_peers: bool, timeout: float,
                  console: Console, nat_sites: int = 0) -> RunResult:
    """Launch one fleet for ``algorithm``, watch it until every node is done, collect, and always stop it."""
    run_dir = root / algorithm
    run_dir.mkdir(parents=True, exist_ok=True)
    with placements(config.nodes, netns, sites, console, nat_sites) as places:
        nodes = plan_fleet(config, algorithm, root / "shards", run_dir, places, swarm=f"tb-{uuid.uuid4().hex[:8]}",
                           mode=mode, mdns=mdns, static_peers=static_peers,
                           extra={"duration": duration} if mode == "async" else None)
        started = time.time()
        try:
            for node in nodes:
                node.start()
            console.print(f"{algorithm}: work folder {run_dir} (node logs, state); dashboards:", highlight=False)
            for node in nodes:  # open one during the run: the node's page, linking to its peers'
                console.print(f"  {node.id}  {node.url}/", highlight=False, soft_wrap=True)
            known = KnownAll(len(nodes))
            with Live(console=console, refresh_per_second=2) as live:
                def on_poll(statuses: dict[str, dict | None]) -> None:
                    known.poll(statuses)
                    live.update(fleet_table(statuses))

                wait_until(nodes, done_twice(), timeout, on_poll=on_poll)
            if not console.is_terminal:
                console.line()  # rich ends a piped Live's last frame without a newline
            if known.after is not None:
                console.print(f"every node knew every other within {known.after:.1f} s of the last node's start",
                              highlight=False)
            return collect(nodes, config, algorithm, fleet, started)
        except (TimeoutError, RuntimeError) as exc:
            raise click.ClickException(f"{algorithm}: {exc}") from exc
        finally:
            stop_all(nodes)


def save(result: RunResult, out: Path | None) -> None:
    """``--out``: one RESULTS.json, or ``<algorithm>.json/.csv`` in a folder."""
    if out and out.suffix == ".json":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.model_dump_json(indent=1))
    elif out:
        write_results(result, out)


@click.command()
@experiment_options
@click.option("--out", type=click.Path(path_type=Path), help="RESULTS.json (one algorithm) or a folder.")
@click.option("--mode", type=click.Choice(["round", "async"]), default="round", show_default=True,
              help="round: the token's rounds, reproducible (equal to the simulator's, bit for bit); async: every "
                   "node volunteers on its own, for --duration.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              metavar="SECONDS", help="async mode: how long each node volunteers, in seconds, once it sees its peers; "
                                      "rounds reported = completed exchanges (fusions).")
@click.option("--netns", is_flag=True, help="One network namespace per node on a bridge (needs root); the nodes serve "
                                            "it without credentials (--insecure: a private network of this machine).")
@click.option("--sites", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --netns: this many sites (bridges routed to each other, mDNS confined to each), every "
                   "node given one --join address in the next site; --nodes must be a multiple.")
@click.option("--nat-sites", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --netns and --sites: the last this many sites are behind NAT (a masquerading router each: "
                   "their nodes dial out, nobody dials in) and join through a public site; fewer than --sites.")
@click.option("--mdns/--no-mdns", default=True, show_default=True, help="Discover by mDNS.")
@click.option("--static-peers", is_flag=True, help="Also give every node the others' addresses.")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Give up after this many seconds (per algorithm); the work folder is kept.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep shards, state and logs here (default: a temp folder; a run that succeeds keeps its logs and "
                   "state there, one that fails everything).")
def testbed(out: Path | None, mode: str, duration: float, netns: bool, sites: int, nat_sites: int, mdns: bool,
            static_peers: bool, timeout: float, workdir: Path | None, config_path: Path | None, **flags: Any) -> None:
    """Run a fleet of real daemons on this machine and collect results in the simulator's schema.

    SIGINT and SIGTERM stop every daemon (and namespace) before the testbed exits.
    """
    config = experiment_config(config_path, TESTBED_DEFAULTS, **flags)
    if out and out.suffix == ".json" and len(config.algorithms) > 1:
        raise click.UsageError("several algorithms need --out FOLDER")
    if config.simulation.adversaries:
        raise click.UsageError("--adversaries: the simulator plays compromised members (dfl-node simulate); a "
                               "testbed's daemons are all honest")
    if config.simulation.privacy_audit:
        raise click.UsageError("--privacy-audit: the simulator attacks its nodes' models (dfl-node simulate); a "
                               "testbed's models stay in their daemons")
    if sites > 1 and (not netns or config.nodes % sites):
        raise click.UsageError("--sites needs --netns and a --nodes that is a multiple of it")
    if nat_sites and (not netns or nat_sites >= sites):
        raise click.UsageError("--nat-sites needs --netns and a --sites above it (a public site to join through)")
    console = Console()
    fleet = provision(config)
    results: list[RunResult] = []
    with signals_tear_down():
        try:
            with work_folder(workdir) as root:
                write_fleet(fleet, root / "shards")
                for algorithm in config.algorithms:
                    results.append(run_algorithm(config, algorithm, fleet, root, mode=mode, duration=duration,
                                                 netns=netns, sites=sites, mdns=mdns, static_peers=static_peers,
                                                 timeout=timeout, console=console, nat_sites=nat_sites))
                    save(results[-1], out)
        except Interrupted as exc:
            kept = f"work folder kept: {workdir}" if workdir else "work folder removed"
            click.echo(f"testbed stopped by {exc}: every daemon stopped, {kept}", err=True)
            sys.exit(128 + exc.signum)
    console.print(summary_table(results, f"testbed: {config.nodes} daemons, {config.shards.dataset}, "
                                         f"{config.shards.partition}, "
                                         f"{mode} mode\n{ROUNDS_MEANING[mode]}"))
    console.print(node_table(results))
