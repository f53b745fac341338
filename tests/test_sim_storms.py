"""Deterministic fault storms: the daemon's own nodes in one process, on the in-memory network and the
virtual clock (:func:`dfl_node.sim.experiment.run_fleet`), through 20 seeded kill -9s and a partition each —
token holders, aggregators mid-fusion, senders, restarts faster than ``peer_timeout`` and slower — then a slow,
lossy link and a slow node, over many seeds. Every invariant is read from what the nodes made durable
(:mod:`dfl_node.sim.ledger`).

A failing seed prints the ``dfl-node simulate`` command that replays it, bit for bit.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dfl_node.results import RunResult
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import load_config
from dfl_node.settings.simulation import FaultSchedule, LinkFault, SlowNodeFault
from dfl_node.sim.experiment import run_fleet

KILLS = 20
SLOWDOWNS = 2  # after the kills: a slow, lossy link, then a slow node
TIMEOUTS = {"heartbeat": 2.0, "peer_timeout": 4.0, "token_timeout": 5.0, "round_timeout": 20.0}
STORM_FILE = Path(__file__).parent.parent / "experiments" / "sim_storm.yaml"  # its comment says why it is so
STORM = load_config(ExperimentConfig, STORM_FILE, {})
DURATION = 1500.0  # async mode: as long as the round-mode storm takes
# Seeds per run: CI plays 6 round-mode storms and 2 async ones (~2 min of one core); DFL_STORM_SEEDS=50 plays
# the full sweep (50 and 10; ~12 min), run by hand before a change to the node's fault paths.
ROUND_SEEDS = int(os.environ.get("DFL_STORM_SEEDS", "6"))
ASYNC_SEEDS = max(2, ROUND_SEEDS // 5)


def replay(seed: int, mode: str) -> str:
    """The command that replays a storm, bit for bit."""
    return (f"dfl-node simulate --config experiments/sim_storm.yaml --mode {mode} --duration {DURATION:g} "
            f"--faults random --kills {KILLS} --slowdowns {SLOWDOWNS} --fault-seed {seed} "
            + " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in TIMEOUTS.items()))


@dataclass
class Storm:
    result: RunResult
    faults: dict[str, Any]  # the results' faults block
    how: str  # the command that replays it, for a failing assertion's message


def storm(seed: int, mode: str, workdir: Path) -> Storm:
    """One storm. Its wall time (~8 s round mode, ~25 s async on this 2-core machine) is printed, not asserted:
    the machine's speed is no invariant of the node's."""
    started = time.perf_counter()
    result = run_fleet(STORM, "defkt", workdir, mode=mode, duration=DURATION if mode == "async" else 0.0,
                       random_kills=KILLS, random_slowdowns=SLOWDOWNS, fault_seed=seed, **TIMEOUTS)
    print(f"{mode} storm, seed {seed}: {time.perf_counter() - started:.1f} s of wall time")
    how = f"replay: {replay(seed, mode)}"
    assert result.faults is not None, how
    return Storm(result, result.faults, how)


@pytest.mark.parametrize("seed", range(ROUND_SEEDS))
def test_a_round_mode_storm_loses_nothing_and_runs_nothing_twice(seed: int, tmp_path: Path) -> None:
    run = storm(seed, "round", tmp_path)
    faults, how = run.faults, run.how
    assert faults["kills"] == KILLS and faults["partitions"] == 1, how
    assert faults["links_degraded"] == 1 and faults["nodes_slowed"] == 1, how
    assert faults["rounds_completed"] == STORM.rounds, how
    assert faults["rounds_lost"] == 0 and faults["rounds_run_twice"] == 0, (faults, how)
    assert faults["accepted_models_lost"] == 0, (faults, how)
    over = [f for f in faults["faults"] if f["stall_s"] > f["bound_s"]]
    assert over == [], (over, how)
    roles = [f["role"] for f in faults["faults"]]
    # the storm hit a fleet at work: token holders, aggregators mid-fusion and senders among its victims
    assert roles.count("holder") >= 3 and "aggregator" in roles and "sender" in roles, (roles, how)
    assert sum(f["kind"] == "kill" and f["back_after_s"] < TIMEOUTS["peer_timeout"]
               for f in faults["faults"]) >= KILLS // 2  # restarts faster than anyone sees them leave


@pytest.mark.parametrize("seed", range(ASYNC_SEEDS))
def test_an_async_storm_loses_no_accepted_model(seed: int, tmp_path: Path) -> None:
    run = storm(seed, "async", tmp_path)
    assert run.faults["kills"] == KILLS and run.faults["links_degraded"] == run.faults["nodes_slowed"] == 1, run.how
    assert run.faults["accepted_models_lost"] == 0 and run.faults["fusions_recorded_twice"] == 0, (run.faults, run.how)
    assert run.result.rounds >= 50, run.how  # it went on learning: fusions across the fleet


def test_a_storm_is_deterministic_for_its_seed(tmp_path: Path) -> None:
    first, again = storm(7, "round", tmp_path / "a").result, storm(7, "round", tmp_path / "b").result
    assert [n.param_sha256 for n in first.nodes] == [n.param_sha256 for n in again.nodes]
    assert first.faults == again.faults and first.wall_time_s == again.wall_time_s


def test_a_node_slowed_past_the_round_timeout_is_waited_for_and_a_lossy_link_only_slows(tmp_path: Path) -> None:
    """A node ten times slower than its device cannot train within ``round_timeout``: its group fails once, and is
    played again with a deadline that follows the node's measured computation (rounds.py), so its work is waited
    for rather than its group given up; a link that loses half its messages only costs retransmissions. Nothing is
    lost or runs twice either way."""
    schedule = FaultSchedule(slow_nodes=[SlowNodeFault(at=60, for_s=150, node="node-1", factor=10)],
                             links=[LinkFault(at=300, for_s=100, loss=0.5)])
    config = STORM.model_copy(update={"rounds": 40, "faults": schedule})
    result = run_fleet(config, "defkt", tmp_path, **TIMEOUTS)
    faults = result.faults
    assert faults is not None and faults["nodes_slowed"] == faults["links_degraded"] == 1
    assert faults["rounds_completed"] == 40 and faults["groups_abandoned"] == 0, faults  # before: 1 given up
    assert faults["rounds_lost"] == 0 and faults["rounds_run_twice"] == 0, faults
    assert faults["accepted_models_lost"] == 0, faults
    slow = next(f for f in faults["faults"] if f["kind"] == "slow")
    assert slow["stall_s"] <= slow["bound_s"], slow
    link = next(f for f in faults["faults"] if f["kind"] == "link")
    assert link["stall_s"] <= link["bound_s"], link
