"""Shared fixtures and helpers: a small provisioned fleet on the embedded digits data, real daemons
running it (:func:`running_daemons`, :func:`loopback_fleet`), and the CLI helpers (``clean_env``,
:func:`invoke`, :func:`error_lines`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import load_file

from dfl_node.cli import cli
from dfl_node.cli.logs import QUIET_LIBRARIES
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.node.orders import Order
from dfl_node.peering.messages import Assignment
from dfl_node.peering.port import PeerHandler
from dfl_node.results import RunResult
from dfl_node.service.wiring import Daemon
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.sim import run_fleet
from dfl_node.sim.fleet import VirtualFleet, plan_nodes
from dfl_node.sim.links import LinkProfile
from dfl_node.testbed.launcher import NodeProcess, Placement, plan_fleet, stop_all

T = TypeVar("T")

# One torch thread in each test process, as in each node process: CI runs three workers on two cores, where a
# second thread of a worker's training only spins, waiting for a core another worker holds.
torch.set_num_threads(1)

# The fleet every daemon test uses: 4 nodes on digits, quick to train, and what the simulator runs too.
FLEET = ExperimentConfig(nodes=4, partition="iid", seed=3, rounds=10, eval_every=5, batch_size=20,
                         mkt_batch_size=20, lr=0.05, hidden=[32, 32])


def node_config(**settings: object) -> NodeConfig:
    """A node of :data:`FLEET`'s fleet (its learning settings), with ``settings`` (flat keys, as flags name them)."""
    return NodeConfig.for_experiment(FLEET, **settings)


def daemon(**settings: object) -> Daemon:
    """What ``dfl-node start`` runs for :func:`node_config` of ``settings``: a node on gRPC (not started)."""
    return Daemon.build(node_config(**settings))


@contextlib.asynccontextmanager
async def virtual_fleet(config: ExperimentConfig, algorithm: str, shards: Path, state: Path, *,
                        links: LinkProfile | None = None, others: Mapping[str, PeerHandler] | None = None,
                        **settings: Any) -> AsyncIterator[VirtualFleet]:
    """``config``'s fleet as K of the daemon's own nodes on the simulator's fabric, each link costing ``links``,
    started on the running loop (run it in :func:`~dfl_node.sim.clock.run_virtual` for virtual time). ``others``:
    handlers served beside them at their addresses (a fake peer), which every node also has as a static peer;
    ``settings`` (flat keys) override every node's. On exit every node still up is killed."""
    configs = plan_nodes(config, algorithm, shards, state, **settings)
    if others:
        configs = [c.model_copy(update={"peers": [*c.membership.peers, *others]}) for c in configs]
    fleet = VirtualFleet(configs, None if links is None else lambda src, dst: links)
    try:
        for address, handler in (others or {}).items():
            fleet.fabric.serve(address, handler)
        fleet.start_all()
        yield fleet
    finally:
        await fleet.close()


async def until(condition: Callable[[], T], timeout: float = 20.0, what: str = "the condition") -> T:
    """Poll ``condition`` until it returns something truthy (returned), on the running loop's clock — virtual time
    in the simulator — failing the test with ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := condition()):
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)
    return value


def wait_for(condition: Callable[[], T], timeout: float, what: str = "the condition") -> T:
    """:func:`until` for a test that waits outside an event loop (on processes: daemons, a verb), by the clock."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)
    return value


def order(**assignment: Any) -> Order:
    """The order an Assign of these fields gives a node (one it can play)."""
    given = Order.of(Assignment(**assignment))
    assert given is not None, assignment
    return given


@pytest.fixture(scope="session")
def fleet_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_fleet(provision(FLEET), out)
    return out


def simulated(config: ExperimentConfig, algorithm: str, workdir: Path) -> tuple[RunResult, dict[str, dict]]:
    """``dfl-node simulate``'s run of ``algorithm`` (K real nodes on the virtual clock), and each node's final
    checkpoint — its model with the algorithm's extra models (DFML's peak, FML's meme) and scalars."""
    result = run_fleet(config, algorithm, workdir)
    return result, {n.id: load_file(str(workdir / algorithm / n.id / "model.safetensors")) for n in result.nodes}


# ----------------------------------------------------------------------------- real daemons


@contextlib.contextmanager
def running_daemons(nodes: list[NodeProcess], *, per_node: Callable[[str], dict[str, object]] | None = None,
                    stop_grace: float | None = None, log_lines: int = 15) -> Iterator[list[NodeProcess]]:
    """Start ``nodes`` (with ``per_node(id)``'s settings as ``DFL_*`` variables, if given); on exit stop them
    and print each one's log tail, which pytest shows for a failing test.

    ``stop_grace`` None: each daemon in turn gets SIGTERM and 10 s before SIGKILL; a number: all are
    signalled at once and reaped against one deadline that far away (:func:`stop_all`)."""
    try:
        for node in nodes:
            if per_node is not None:
                node.env.update({f"DFL_{k.upper()}": str(v) for k, v in per_node(node.id).items()})
            node.start()
        yield nodes
    finally:
        if stop_grace is None:
            for node in nodes:
                node.stop()
        else:
            stop_all(nodes, grace=stop_grace)
        for node in nodes:
            print(f"--- {node.id} log tail ---\n" + "\n".join(node.log_path.read_text().splitlines()[-log_lines:]))


@contextlib.contextmanager
def loopback_fleet(shards: Path, workdir: Path, algorithm: str, config: ExperimentConfig = FLEET, *,
                   mode: str = "round", mdns: bool = True, static_peers: bool = False, extra: dict | None = None,
                   swarm: str = "t", per_node: Callable[[str], dict[str, object]] | None = None,
                   stop_grace: float | None = None, log_lines: int = 15) -> Iterator[list[NodeProcess]]:
    """``config.nodes`` daemons of ``algorithm`` on 127.0.0.1 in a swarm of their own (``swarm``-random),
    planned by :func:`plan_fleet` (``mode``, ``mdns``, ``static_peers``, ``extra``: its own) and run by
    :func:`running_daemons`."""
    nodes = plan_fleet(config, algorithm, shards, workdir, [Placement("127.0.0.1")] * config.nodes,
                       swarm=f"{swarm}-{uuid.uuid4().hex[:8]}", mode=mode, mdns=mdns, static_peers=static_peers,
                       extra=extra)
    with running_daemons(nodes, per_node=per_node, stop_grace=stop_grace, log_lines=log_lines):
        yield nodes


# ----------------------------------------------------------------------------- the CLI


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """A verb run in-process sets logging up for the whole process (``dfl_node.cli.logs``): put the levels and
    handlers back after each test, so one test's ``--log-level`` never decides what another one captures."""
    names = ["", "dfl_node", *QUIET_LIBRARIES]
    levels = {name: logging.getLogger(name).level for name in names}
    handlers = list(logging.getLogger().handlers)
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    logging.getLogger().handlers[:] = handlers


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DFL_* variable of the developer's shell (DFL_DATA_DIR…) may decide a test's outcome."""
    for key in [k for k in os.environ if k.startswith("DFL_")]:
        monkeypatch.delenv(key)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """``dfl-node ARGS`` in-process; an exception of ours propagates (a traceback is a bug, not an error line)."""
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def verb_command(name: str) -> click.Command:
    """The click command of ``dfl-node NAME`` (the group imports each verb on first use)."""
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def error_lines(result: Result) -> list[str]:
    """The lines that report the problem: click's ``Error: …`` and ours ``error: …``, nothing else."""
    assert "Traceback" not in result.output
    return [line for line in result.output.splitlines() if line.lower().startswith("error: ")]


# ----------------------------------------------------------------------------- parallel runs (pytest-xdist)

ISOLATED_PYTHON = Path(__file__).with_name("isolated-python")


def pytest_configure(config: pytest.Config) -> None:
    """With ``-n N``, every worker runs in a network namespace of its own (``tests/isolated-python``): loopback
    only, so two workers' daemons never share a port or an mDNS swarm, and none can reach the real network.
    Needs root (as the README's ``unshare -n`` does); elsewhere workers share the caller's network."""
    if hasattr(config, "workerinput") or os.geteuid() != 0:
        return
    tx = getattr(config.option, "tx", None) or []
    config.option.tx = [f"popen//python={ISOLATED_PYTHON} {sys.executable}" if spec == "popen" else spec
                        for spec in tx]


# Modules whose tests share what one process holds — a fuzz run's figures across its tests, a sweep or a fleet
# run once for the module (a module fixture), models built once — stay on one worker: spread over several, each
# worker would build the module's fixtures again (the CSV fleet's 24 s, twice).
ONE_WORKER_MODULES = {"test_fuzz_codec", "test_fuzz_grpc", "test_metrics", "test_sweep", "test_data_fleet",
                      "test_data_start_errors", "test_export", "test_defences", "test_datasets"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """For ``-n`` (``--dist loadgroup``, set in pyproject.toml): tests of the host's shared state — named network
    namespaces, the Docker engine — run one at a time on one worker (a worker's own namespace does not contain
    them), and the modules of ``ONE_WORKER_MODULES`` each on one worker. Slow tests go first, so that the quick
    ones fill both workers at the end instead of one long test running alone."""
    for item in items:
        if item.get_closest_marker("netns") or item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.xdist_group("host"))
        elif item.module is not None and item.module.__name__.rpartition(".")[2] in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    """In CI (``CI=true``) nothing may be skipped: a skip there would hide a missing tool or privilege.

    Locally, tests that need root (network namespaces) or optional system tools skip with a reason.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run everything: {report.longrepr}"
