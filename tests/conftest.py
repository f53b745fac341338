"""Shared fixtures: a small provisioned fleet on the embedded digits data, and node configs for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dfl_node.config import ExperimentConfig
from dfl_node.learning.fleet import provision, write_fleet

# The fleet every daemon test uses: 4 nodes on digits, quick to train, and what the simulator runs too.
FLEET = ExperimentConfig(nodes=4, partition="iid", seed=3, rounds=10, eval_every=5, batch_size=20,
                         mkt_batch_size=20, lr=0.05, hidden=[32, 32])


@pytest.fixture(scope="session")
def fleet_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_fleet(provision(FLEET), out)
    return out



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
