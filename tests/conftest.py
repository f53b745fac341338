"""Fixtures every test file may ask for, and the suite's hooks. Helpers that test files import live in
:mod:`tests.helpers` (no test file imports another).

Fixtures: ``fleet_shards`` (:data:`~tests.helpers.fleet.FLEET` provisioned once), ``clean_env`` (no ``DFL_*``
variable of the caller's shell), ``restore_logging`` (automatic), ``pki`` (a swarm CA and fleet certificates),
``target`` (a real node for hostile input), and ``node`` / ``client`` (a fake daemon's REST app and a client of it).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import torch

from dfl_node.cli.logs import QUIET_LIBRARIES
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.net.certs import init_ca, issue_node
from tests.helpers.fleet import FLEET
from tests.helpers.hostile import Target, targeted
from tests.helpers.rest import FakeRestNode, make_status

# One torch thread in each test process, as in each node process: CI runs three workers on two cores, where a
# second thread of a worker's training only spins, waiting for a core another worker holds.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def fleet_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_fleet(provision(FLEET), out)
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The swarm CA and a certificate per fleet node (loopback: 127.0.0.1 is a name of each), plus an
    intruder: a certificate for node-2 from a CA of its own."""
    root = tmp_path_factory.mktemp("pki")
    init_ca(root / "ca")
    for node_id in [f"node-{i}" for i in range(FLEET.nodes)]:
        issue_node(root / "ca", node_id, root / node_id, ips=("127.0.0.1",))
    init_ca(root / "other-ca")
    issue_node(root / "other-ca", "node-2", root / "intruder", ips=("127.0.0.1",))
    return root


@pytest.fixture
async def target(fleet_shards: Path, tmp_path: Path) -> AsyncIterator[Target]:
    """A real node on gRPC and REST (:func:`~tests.helpers.hostile.targeted` with no settings changed)."""
    async with targeted(fleet_shards, tmp_path) as found:
        yield found


@pytest.fixture
def node() -> FakeRestNode:
    """A fake daemon with a busy node's status, for the REST app."""
    return FakeRestNode(make_status())


@pytest.fixture
async def client(node: FakeRestNode) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``node``'s REST app, in process."""
    app = node.app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
        yield c


# ----------------------------------------------------------------------------- each test's logging and environment


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
