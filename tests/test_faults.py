"""Fault injection: real ``dfl-node start`` daemons on loopback, killed with SIGKILL at seeded
random moments and restarted, in round mode and in async mode, a fleet for each (under -n, side by side). Each run
prints its figures (``pytest -s`` shows them); the invariants are :mod:`tests.chaos`'s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim.ledger import Ledger, completed_rounds
from dfl_node.testbed.launcher import poll_status
from tests.chaos import (
    KILLS,
    SEED,
    Chaos,
    all_alive,
    chaos_fleet,
    daemon_start_s,
    durable_states,
    expected_fingerprint,
    highest_round,
    stall_bound,
    storm_timeouts,
)
from tests.helpers.fleet import FLEET

pytestmark = pytest.mark.slow


def figures(mode: str, chaos: Chaos, ledger: Ledger, runtime: float, **extra: object) -> str:
    kills = chaos.kills
    line = (f"fault injection ({mode} mode, seed {SEED}): {len(kills)} kill -9s survived — "
            f"{sum(k.holding for k in kills)} of token holders, "
            f"{sum(k.role in ('sender', 'aggregator') for k in kills)} during a transfer role, "
            f"{sum(k.fusing for k in kills)} during a fusion; {len(ledger.fusions)} fusions; "
            + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in extra.items()) + f"; {runtime:.0f} s")
    print(line)
    return line


# ----------------------------------------------------------------------------- the fleet-wide runs


def storm_round_mode(chaos: Chaos, rng: random.Random) -> None:
    """One failure at a time: a victim is killed at a random moment and restarted at once — every fourth
    kill the token holder, two in four a sender (not holding: while it trains, its aggregator waits for it),
    the others any node; the next kill comes once the victim is back and the fleet fused again, so each
    kill's stall is its own."""
    chaos.wait(lambda s: highest_round(s) >= 3)
    for i in range(KILLS):
        time.sleep(rng.uniform(0.1, 1.0))  # a random moment of whatever the fleet is doing
        if i % 4 == 3:
            victim, statuses = chaos.wait_for_status(lambda s: s["holding"])
        elif i % 4 in (1, 2):
            victim, statuses = chaos.wait_for_status(lambda s: s["role"] == "sender" and not s["holding"])
        else:
            statuses = poll_status(chaos.nodes, timeout=1.0)
            victim = rng.choice(chaos.nodes)
        kill = chaos.kill(victim, statuses)
        chaos.restart(victim, kill)
        chaos.wait(lambda s, k=kill: all_alive(s) and highest_round(s) > k.round)
    # and one round more after the last kill: the round that completed right after it may have fused before it,
    # and without a fusion after it the last kill's stall would be unmeasured (the run ended)
    chaos.wait(lambda s, k=chaos.kills[-1]: highest_round(s) > k.round + 1)


def storm_async_mode(chaos: Chaos, rng: random.Random) -> None:
    """No global clock, so no waiting for progress: a random serving node is killed every 0.3–1.5 s and
    restarted at once, while the others go on volunteering (two of four may be down at once)."""
    chaos.wait(lambda s: sum(v["fusions"] for v in s.values() if v) >= 4)
    while len(chaos.kills) < KILLS:
        time.sleep(rng.uniform(0.3, 1.5))
        statuses = chaos.wait(lambda s: sum(v is not None for v in s.values()) >= 3)
        victim = rng.choice([n for n in chaos.nodes if statuses[n.id] is not None])
        chaos.kill(victim, statuses)
        victim.start()  # at once, and no waiting for it: two of four may be down together
    chaos.wait(all_alive)
    fused = sum(v["fusions"] for v in poll_status(chaos.nodes).values() if v)
    chaos.wait(lambda s: sum(v["fusions"] for v in s.values() if v) >= fused + 4)  # it goes on learning


def played(shards: Path, workdir: Path, mode: str, storm: Callable[[Chaos, random.Random], None], seed: int,
           config: ExperimentConfig = FLEET, **settings: object) -> tuple[Chaos, float]:
    """A fleet that lives as long as its storm (then stops, gracefully): the fleet and the storm's wall time. A fleet
    whose storm is over no longer takes the cores from the other one."""
    started = time.monotonic()
    with chaos_fleet(shards, workdir, mode, config, **settings) as chaos:
        storm(chaos, random.Random(seed))
    return chaos, time.monotonic() - started


@pytest.mark.timeout(900)  # one of the suite's longest tests; the storm's own waits bound each step
def test_kill_9_storm_in_round_mode(fleet_shards: Path, tmp_path: Path) -> None:
    """A round-mode fleet through KILLS kill -9s (a test of its own beside the async storm's: under ``-n`` the two
    run side by side on two workers, and the time goes into the victims' restarts, not into the CPU)."""
    timeouts = storm_timeouts(daemon_start_s(fleet_shards, tmp_path / "start"))  # sized to this machine's restarts
    # The senders train for a while (local_epochs), so a sender's kill mostly lands before its transfer, while its
    # aggregator waits for it.
    config = FLEET.model_copy(update={"rounds": 0, "local_epochs": 10})
    rounds, runtime = played(fleet_shards, tmp_path / "round", "round", storm_round_mode, SEED, config, **timeouts)

    states = durable_states(rounds.nodes, expected_fingerprint(fleet_shards))
    ledger, completed = Ledger.of(states), completed_rounds(states)
    quick = [k for k in rounds.kills if k.back_after < timeouts["peer_timeout"]]
    stalls = {id(k): ledger.stall_after(k.at) for k in rounds.kills}
    quick_senders = [k for k in quick if k.role == "sender" and not k.holding]
    over = [(k.node, k.role, round(k.back_after, 1), round(stalls[id(k)], 1)) for k in rounds.kills
            if stalls[id(k)] > stall_bound(timeouts, k in quick)]
    longest_quick = max((stalls[id(k)] for k in quick), default=0.0)
    figures("round", rounds, ledger, runtime, rounds_completed=completed,
            rounds_lost=len(ledger.lost_rounds(completed)), rounds_run_twice=len(ledger.repeated_rounds()),
            senders_killed=sum(k.role == "sender" and not k.holding for k in rounds.kills),
            back_within_peer_timeout=f"{len(quick)} (senders: {len(quick_senders)}; back after "
                                     f"{min(k.back_after for k in rounds.kills):.1f}–"
                                     f"{max(k.back_after for k in rounds.kills):.1f} s)",
            longest_stall_after_a_quick_restart=f"{longest_quick:.1f} s "
                                                f"(bound {stall_bound(timeouts, True):.1f} s)",
            longest_stall_after_a_kill=f"{max(stalls.values()):.1f} s "
                                       f"(bound {stall_bound(timeouts, False):.1f} s)",
            accepted_models_lost=len(ledger.lost_models()), checkpoints_verified=len(states))
    assert sum(k.holding for k in rounds.kills) >= KILLS // 4
    assert len(quick_senders) >= 3  # the issue: several, back in time
    assert ledger.lost_rounds(completed) == [] and ledger.repeated_rounds() == []
    assert ledger.lost_models() == []
    assert over == [], over


@pytest.mark.timeout(900)
def test_kill_9_storm_in_async_mode(fleet_shards: Path, tmp_path: Path) -> None:
    """An async fleet through KILLS kill -9s, a random serving node every 0.3–1.5 s (two may be down at once)."""
    async_, runtime = played(fleet_shards, tmp_path / "async", "async", storm_async_mode, SEED + 1,
                             interval=0.3, participation=0.8, duration=0, round_timeout=5.0)
    states = durable_states(async_.nodes, expected_fingerprint(fleet_shards))
    ledger = Ledger.of(states)
    figures("async", async_, ledger, runtime, accepted_models_lost=len(ledger.lost_models()),
            fusions_recorded_twice=len(ledger.repeated_fusions()), checkpoints_verified=len(states))
    assert ledger.lost_models() == [] and ledger.repeated_fusions() == []


# ----------------------------------------------------------------------------- one failure each, pinned

