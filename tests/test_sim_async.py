"""Async mode on the daemon's own nodes, in one process on the virtual clock: no global clock, each
node volunteers, invites (or pulls, or probes and binds), fuses at most one group at a time, and goes on until
its ``duration`` of virtual seconds is over. These were real-daemon tests of one to two minutes of wall time
each; gRPC, mDNS and real processes in async mode stay covered by the real kill -9 storm (tests/test_faults.py).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from dfl_node.sim.clock import run_virtual
from dfl_node.sim.link_profiles import LinkProfile
from tests.helpers.fleet import FLEET, virtual_fleet

STEP_S = 0.01  # virtual seconds per training step: a fusion takes a while, so volunteers meet busy peers


def async_fleet(shards: Path, state: Path, algorithm: str, caplog: pytest.LogCaptureFixture, **settings: Any
                ) -> dict[str, dict[str, Any]]:
    """The test fleet in async mode until every node's duration is over: each node's /status then."""
    caplog.set_level(logging.WARNING)
    async def main() -> dict[str, dict[str, Any]]:
        async with virtual_fleet(FLEET, algorithm, shards, state, links=LinkProfile(0.005, 12.5e6), mode="async",
                                 evaluate=False, **settings) as fleet:
            duration = next(iter(fleet.configs.values())).schedule.duration
            await asyncio.wait_for(fleet.finished(), 10 * duration)
            return {n: node.status().model_dump(mode="json") for n, node in sorted(fleet.nodes.items())}

    statuses = run_virtual(main(), lambda work: work.steps * STEP_S, FLEET.learning.threads)
    problems = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert problems == [], [r.getMessage() for r in problems]
    return statuses


def test_async_defkt_every_node_fuses_and_never_two_at_once(fleet_shards: Path, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    statuses = async_fleet(fleet_shards, tmp_path, "defkt", caplog, duration=60, interval=1.0, participation=0.8)
    for s in statuses.values():
        assert s["fusions"] >= 1 and s["max_concurrent_fusions"] == 1 and s["mode"] == "async", s
    assert sum(s["models_sent"] for s in statuses.values()) == sum(s["fusions"] for s in statuses.values())


def test_async_fedavg_groups_aggregate_several_senders(fleet_shards: Path, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Volunteers invite senders (2 of 4: 50 %), aggregate, send the average back."""
    statuses = async_fleet(fleet_shards, tmp_path, "fedavg", caplog, duration=120, interval=1.0, participation=0.5)
    for s in statuses.values():
        assert s["fusions"] >= 1 and s["models_sent"] >= 1, s  # every node aggregated and sent
        assert s["rejected"] == {} and s["max_concurrent_fusions"] == 1, s
    sent = sum(s["models_sent"] for s in statuses.values())
    received = sum(s["models_received"] for s in statuses.values())
    assert sent == received > sum(s["fusions"] for s in statuses.values())  # groups of more than one sender


@pytest.mark.parametrize(("algorithm", "settings"), [
    ("defkt-select", {"selection_candidates": 2}),  # a volunteer trains, probes 2 free peers, binds the better one
    ("fairavg", {}),  # a volunteer trains, pulls a free peer's model and weights both (002 eqs. 4–5)
], ids=["defkt-select", "fairavg"])
def test_issue_11_algorithms_run_in_async_mode(fleet_shards: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                               algorithm: str, settings: dict) -> None:
    statuses = async_fleet(fleet_shards, tmp_path, algorithm, caplog, duration=20, interval=1.0, participation=0.8,
                           **settings)
    for s in statuses.values():
        assert s["fusions"] >= 1 and s["max_concurrent_fusions"] == 1 and s["mode"] == "async", s
    if algorithm == "defkt-select":
        assert sum(s["probes_answered"] for s in statuses.values()) >= sum(s["fusions"] for s in statuses.values())


def test_a_run_ends_at_its_duration_even_when_the_next_tick_is_later(fleet_shards: Path, tmp_path: Path) -> None:
    """``--interval`` longer than ``--duration``: every node's volunteering sleep wakes at the end of the run
    (it once slept the whole tick, the fleet heartbeating on for ~100,000 virtual seconds)."""
    async def main() -> float:
        async with virtual_fleet(FLEET, "defkt", fleet_shards, tmp_path, mode="async", evaluate=False, duration=5,
                                 interval=100_000, participation=1.0) as fleet:
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(fleet.finished(), 60)
            return asyncio.get_running_loop().time() - started

    assert run_virtual(main(), lambda work: work.steps * STEP_S, FLEET.learning.threads) <= 5 + 1
