"""Fault injection (issue 13): real ``dfl-node start`` daemons on loopback, killed with SIGKILL at seeded
random moments and restarted, in round mode and in async mode.

Every invariant is read from what the nodes made *durable* — each one's final checkpoint and the history
stored with it — never from what a node said over REST before it died:

* every final checkpoint loads, holds the fleet's model (its fingerprint) and only finite weights;
* round mode: every round up to the fleet's last completed one was fused exactly once (Def-KT, Q = 1:
  one group a round), and no node fused or sent twice for a round;
* no accepted model is lost: each transfer a sender counts as done ("send" in its history) was fused
  by its aggregator, durably ("fusion" there, naming the sender);
* round mode: after each kill the fleet fuses again within a bound set by the configured timeouts — the
  tighter one of ``dfl_node.node.rounds`` ("Liveness") when the victim was back within ``peer_timeout``.

The two fleet-wide runs print their figures (``pytest -s`` shows them). The other tests each pin one
failure of issue 13 with a deterministic fault: a slow step makes the moment of the kill certain.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from dfl_node.config import ExperimentConfig
from dfl_node.learning.fleet import read_node_data
from dfl_node.learning.models import ModelSpec, fingerprint
from dfl_node.node.persistence import Checkpoint
from dfl_node.testbed.launcher import (
    NodeProcess,
    poll_status,
    wait_until,
)
from tests.conftest import FLEET, loopback_fleet

pytestmark = pytest.mark.slow

SEED = 13
KILLS = 20  # per fleet-wide run (the issue asks for at least 20)
TIMEOUTS = {"heartbeat": 0.2, "peer_timeout": 1.0, "token_timeout": 2.0, "round_timeout": 15.0, "stream_timeout": 5.0}
# After a kill the fleet fuses again within: peer_timeout (the crash is seen), token_timeout (a lost token is
# regenerated), round_timeout (the holder, or the regenerating node, waits that long at most for a crashed
# member to come back, as it may hold the only record of the newest round), then one round of its own
# (training, transfer, fusion, checkpoints: a freshly restarted process's first round took up to 6 s on a
# loaded 2-core machine).
ROUND_MARGIN = 10.0
STALL_BOUND = TIMEOUTS["peer_timeout"] + TIMEOUTS["token_timeout"] + TIMEOUTS["round_timeout"] + ROUND_MARGIN
# The round-mode storm's fleet: a peer_timeout longer than a restart (so most victims are back before anyone saw
# them leave: the 130 s stall of issue 18), and a round_timeout far above the bound such a restart must meet.
STORM_TIMEOUTS = {**TIMEOUTS, "peer_timeout": 8.0, "round_timeout": 60.0}  # a restart takes 2-5 s here


def stall_bound(timeouts: dict[str, float], back_within_peer_timeout: bool) -> float:
    """``dfl_node.node.rounds``' liveness bound for one crash, plus one round's own work (ROUND_MARGIN)."""
    quick = (timeouts["peer_timeout"] + timeouts["token_timeout"] + 2 * timeouts["heartbeat"]
             + min(1.0, timeouts["token_timeout"] / 4) + ROUND_MARGIN)
    return quick if back_within_peer_timeout else quick + timeouts["round_timeout"]
HISTORY_LIMIT = 50_000  # no node of these runs comes near it: its whole history is in its checkpoint
Statuses = dict[str, dict | None]


# ----------------------------------------------------------------------------- the fleet and its faults


@dataclass
class Kill:
    node: str
    at: float  # unix time
    role: str  # its role then: "holder", "sender", "aggregator", "idle", …
    holding: bool
    fusing: bool
    round: int  # the fleet's highest round then
    back_after: float = float("inf")  # seconds from the kill until the restarted victim answered again


@dataclass
class Chaos:
    """A running fleet: kills (SIGKILL) and restarts its daemons, and remembers every kill."""

    nodes: list[NodeProcess]
    kills: list[Kill] = field(default_factory=list)

    def by_id(self, node_id: str) -> NodeProcess:
        return next(n for n in self.nodes if n.id == node_id)

    def kill(self, victim: NodeProcess, statuses: Statuses) -> Kill:
        """SIGKILL ``victim`` (no checkpoint, no goodbye), noting what it was doing by ``statuses``."""
        status = statuses.get(victim.id) or {}
        assert victim.process is not None
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        kill = Kill(victim.id, time.time(), status.get("role", "?"), bool(status.get("holding")),
                    bool(status.get("fusing")), highest_round(statuses))
        self.kills.append(kill)
        return kill

    def restart(self, victim: NodeProcess, kill: Kill) -> None:
        """Start ``victim`` again at once; note when it answers (its REST status) again."""
        victim.start()
        wait_until([victim], lambda s: s[victim.id] is not None, timeout=60, every=0.05)
        kill.back_after = time.time() - kill.at

    def wait(self, predicate: Callable[[Statuses], bool], timeout: float = 90.0) -> Statuses:
        return wait_until(self.nodes, predicate, timeout=timeout, every=0.1)

    def wait_for_status(self, predicate: Callable[[dict], bool], timeout: float = 90.0) -> tuple[NodeProcess, Statuses]:
        """Until some node's /status satisfies ``predicate``: that node, and every node's status then."""
        found: list[str] = []

        def check(statuses: Statuses) -> bool:
            found[:] = [i for i, s in statuses.items() if s is not None and predicate(s)]
            return bool(found)

        statuses = self.wait(check, timeout)
        return self.by_id(found[0]), statuses


def highest_round(statuses: Statuses) -> int:
    return max((s["round"] for s in statuses.values() if s is not None), default=0)


def all_alive(statuses: Statuses) -> bool:
    """Every node answers and sees every other one alive."""
    return all(s is not None and sum(p["alive"] for p in s["peers"]) == len(statuses) - 1 for s in statuses.values())


@contextlib.contextmanager
def chaos_fleet(shards: Path, workdir: Path, mode: str, config: ExperimentConfig = FLEET, **settings: object
                ) -> Iterator[Chaos]:
    """Four Def-KT daemons on loopback with static peers and the short timeouts of these tests, started
    and (gracefully) stopped; their logs' tails are printed for a failing test."""
    workdir.mkdir(parents=True, exist_ok=True)
    with loopback_fleet(shards, workdir, "defkt", config, mode=mode, mdns=False, static_peers=True,
                        extra={**TIMEOUTS, "evaluate": False, "history_limit": HISTORY_LIMIT, **settings},
                        swarm="f", stop_grace=20.0, log_lines=12) as nodes:
        chaos = Chaos(nodes)
        chaos.wait(all_alive)
        yield chaos


# ----------------------------------------------------------------------------- what the nodes made durable


def expected_fingerprint(shards: Path, config: ExperimentConfig = FLEET) -> str:
    train, _ = read_node_data(shards / "node-0")
    spec = ModelSpec(config.model, tuple(config.hidden) if config.hidden else None)
    return fingerprint(config.model, spec.build(train.input_shape, train.num_classes, seed=config.seed).state_dict())


def durable_states(nodes: list[NodeProcess], fingerprint_: str) -> dict[str, dict[str, Any]]:
    """Each stopped node's checkpoint: it must load (Checkpoint.load checks the fingerprint) and be finite;
    returns each node's durable state (history included)."""
    states = {}
    for node in nodes:
        saved = Checkpoint(node.state_dir).load(fingerprint_)
        assert saved is not None, f"{node.id}: no checkpoint"
        model, state = saved
        bad = [k for k, v in model.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        assert not bad, f"{node.id}: non-finite {bad}"
        assert len(state["history"]) < HISTORY_LIMIT, f"{node.id}: history truncated"
        states[node.id] = state
    return states


@dataclass
class Ledger:
    """The fleet's durable record of exchanges, from every node's history."""

    fusions: list[tuple[str, int, set[str], float]]  # (aggregator, round fused, its senders, unix time)
    sends: list[tuple[str, int, str]]  # (sender, round, aggregator): transfers their senders count as done

    @classmethod
    def of(cls, states: dict[str, dict[str, Any]]) -> Ledger:
        fusions, sends = [], []
        for node_id, state in states.items():
            for h in state["history"]:  # an entry's round is the round after the exchange
                if h["event"] == "fusion":
                    fusions.append((node_id, h["round"] - 1, set(h["peer"].split(",")), h["time"]))
                elif h["event"] == "send":
                    sends.append((node_id, h["round"] - 1, h["peer"]))
        return cls(fusions, sends)

    def lost_models(self) -> list[tuple[str, int, str]]:
        """Sends whose aggregator holds no durable fusion of them: accepted, counted, and gone."""
        fused = {(a, r, s) for a, r, senders, _ in self.fusions for s in senders}
        return [(s, r, a) for s, r, a in self.sends if (a, r, s) not in fused]

    def per_round(self) -> Counter[int]:
        return Counter(r for _, r, _, _ in self.fusions)

    def lost_rounds(self, completed: int) -> list[int]:
        """Round mode: rounds before ``completed`` that nobody fused."""
        fused = self.per_round()
        return [r for r in range(completed) if fused[r] == 0]

    def repeated_rounds(self) -> list[int]:
        """Round mode: rounds fused more than once (Q = 1), or in which a node sent twice."""
        twice = {r for r, n in self.per_round().items() if n > 1}
        return sorted(twice | {r for (_, r, _), n in Counter(self.sends).items() if n > 1})

    def repeated_fusions(self) -> list[tuple[str, int]]:
        """Async mode: an aggregator that recorded two fusions for one of its exchange counts."""
        return [k for k, n in Counter((a, r) for a, r, _, _ in self.fusions).items() if n > 1]

    def stall_after(self, kill: Kill) -> float:
        """Seconds from ``kill`` to the next fusion anywhere in the fleet (inf: none)."""
        return min((t for _, _, _, t in self.fusions if t > kill.at), default=float("inf")) - kill.at


def completed_rounds(states: dict[str, dict[str, Any]]) -> int:
    """Rounds the fleet completed: a node's round passes t only once round t fused, or was announced after."""
    return max(state["round"] for state in states.values())


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
    kill the token holder, every fourth but one a sender (not holding: while it trains, its aggregator waits
    for it), the others any node; the next kill comes once the victim is back and the fleet fused again, so
    each kill's stall is its own."""
    chaos.wait(lambda s: highest_round(s) >= 3)
    for i in range(KILLS):
        time.sleep(rng.uniform(0.1, 1.0))  # a random moment of whatever the fleet is doing
        if i % 4 == 3:
            victim, statuses = chaos.wait_for_status(lambda s: s["holding"])
        elif i % 4 == 1:
            victim, statuses = chaos.wait_for_status(lambda s: s["role"] == "sender" and not s["holding"])
        else:
            statuses = poll_status(chaos.nodes, timeout=1.0)
            victim = rng.choice(chaos.nodes)
        kill = chaos.kill(victim, statuses)
        chaos.restart(victim, kill)
        chaos.wait(lambda s, k=kill: all_alive(s) and highest_round(s) > k.round)


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


def test_kill_9_storms_in_round_and_async_mode(fleet_shards: Path, tmp_path: Path) -> None:
    """Two fleets at once, one per mode, each through KILLS random kill -9s (their storms run side by side:
    the time goes into the victims' restarts, not into the CPU)."""
    started = time.monotonic()
    # The round fleet's senders train for a while (local_epochs), so a sender's kill mostly lands before its
    # transfer, while its aggregator waits for it.
    round_config = FLEET.model_copy(update={"rounds": 0, "local_epochs": 10})
    with (chaos_fleet(fleet_shards, tmp_path / "round", "round", round_config, **STORM_TIMEOUTS) as rounds,
          chaos_fleet(fleet_shards, tmp_path / "async", "async", interval=0.3, participation=0.8, duration=0,
                      round_timeout=5.0) as async_,
          ThreadPoolExecutor(2) as pool):
        storms = [pool.submit(storm_round_mode, rounds, random.Random(SEED)),
                  pool.submit(storm_async_mode, async_, random.Random(SEED + 1))]
        for storm in storms:
            storm.result()
    runtime = time.monotonic() - started
    fingerprint_ = expected_fingerprint(fleet_shards)

    states = durable_states(rounds.nodes, fingerprint_)
    ledger, completed = Ledger.of(states), completed_rounds(states)
    quick = [k for k in rounds.kills if k.back_after < STORM_TIMEOUTS["peer_timeout"]]
    stalls = {id(k): ledger.stall_after(k) for k in rounds.kills}
    quick_senders = [k for k in quick if k.role == "sender" and not k.holding]
    over = [(k.node, k.role, round(k.back_after, 1), round(stalls[id(k)], 1)) for k in rounds.kills
            if stalls[id(k)] > stall_bound(STORM_TIMEOUTS, k in quick)]
    longest_quick = max((stalls[id(k)] for k in quick), default=0.0)
    figures("round", rounds, ledger, runtime, rounds_completed=completed,
            rounds_lost=len(ledger.lost_rounds(completed)), rounds_run_twice=len(ledger.repeated_rounds()),
            senders_killed=sum(k.role == "sender" and not k.holding for k in rounds.kills),
            back_within_peer_timeout=f"{len(quick)} (senders: {len(quick_senders)}; back after "
                                     f"{min(k.back_after for k in rounds.kills):.1f}–"
                                     f"{max(k.back_after for k in rounds.kills):.1f} s)",
            longest_stall_after_a_quick_restart=f"{longest_quick:.1f} s "
                                                f"(bound {stall_bound(STORM_TIMEOUTS, True):.1f} s)",
            longest_stall_after_a_kill=f"{max(stalls.values()):.1f} s "
                                       f"(bound {stall_bound(STORM_TIMEOUTS, False):.1f} s)",
            accepted_models_lost=len(ledger.lost_models()), checkpoints_verified=len(states))
    assert sum(k.holding for k in rounds.kills) >= KILLS // 4
    assert len(quick_senders) >= 3  # the issue: several, back in time
    assert ledger.lost_rounds(completed) == [] and ledger.repeated_rounds() == []
    assert ledger.lost_models() == []
    assert over == [], over

    states = durable_states(async_.nodes, fingerprint_)
    ledger = Ledger.of(states)
    figures("async", async_, ledger, runtime, accepted_models_lost=len(ledger.lost_models()),
            fusions_recorded_twice=len(ledger.repeated_fusions()), checkpoints_verified=len(states))
    assert ledger.lost_models() == [] and ledger.repeated_fusions() == []


# ----------------------------------------------------------------------------- one failure of issue 13 each


def test_a_round_whose_sender_died_before_its_transfer_is_played_again(fleet_shards: Path, tmp_path: Path) -> None:
    """Issue 13: "pairing … did not complete" and the holder moved on, so the round had no fusion at all.
    The sender (not the holder: the token would die with it) trains slowly here, so it is surely killed
    before it transfers."""
    config = FLEET.model_copy(update={"rounds": 4, "local_epochs": 400})
    with chaos_fleet(fleet_shards, tmp_path, "round", config) as chaos:
        victim, statuses = chaos.wait_for_status(lambda s: s["role"] == "sender" and not s["holding"])
        chaos.kill(victim, statuses)
        victim.start()
        chaos.wait(lambda s: all(v is not None and v["done"] for v in s.values()), timeout=120)
    states = durable_states(chaos.nodes, expected_fingerprint(fleet_shards))
    ledger = Ledger.of(states)
    assert completed_rounds(states) == 4
    assert ledger.lost_rounds(4) == [] and ledger.repeated_rounds() == []


@pytest.mark.parametrize("mode", ["round", "async"])
def test_an_aggregator_killed_after_accepting_loses_no_model(fleet_shards: Path, tmp_path: Path, mode: str) -> None:
    """Issue 13: a receiver answered "accepted" and died before its fusion was durable; its sender (and in
    round mode the holder) counted the exchange as done. Fusion is slow here, so the kill lands in it."""
    config = FLEET.model_copy(update={"rounds": 4 if mode == "round" else 0, "mkt_epochs": 60})
    settings = {"interval": 0.3, "participation": 0.5} if mode == "async" else {}
    with chaos_fleet(fleet_shards, tmp_path, mode, config, **settings) as chaos:
        victim, statuses = chaos.wait_for_status(lambda s: s["fusing"])
        chaos.kill(victim, statuses)
        victim.start()
        if mode == "round":
            chaos.wait(lambda s: all(v is not None and v["done"] for v in s.values()), timeout=120)
        else:  # its senders learnt of the kill when their streams broke; the victim is back
            chaos.wait(all_alive)
    states = durable_states(chaos.nodes, expected_fingerprint(fleet_shards))
    ledger = Ledger.of(states)
    assert ledger.lost_models() == []
    if mode == "round":
        assert ledger.lost_rounds(4) == [] and ledger.repeated_rounds() == []


def test_a_restarted_lowest_node_regenerates_from_the_fleets_round(fleet_shards: Path, tmp_path: Path) -> None:
    """Issue 13: a restarted node resumed one round behind the others and regenerated the token from there,
    so rounds ran twice. node-0 (the lowest id, so the one that regenerates) and the holder are killed
    together, when node-0's checkpoint is behind the fleet; token_timeout is longer than a restart, so
    node-0 is back before anyone else would act."""
    config = FLEET.model_copy(update={"rounds": 14})
    with chaos_fleet(fleet_shards, tmp_path, "round", config, token_timeout=8.0) as chaos:
        node0 = chaos.by_id("node-0")
        holder, statuses = chaos.wait_for_status(
            lambda s: s["holding"] and s["id"] != "node-0" and s["round"] >= 4)
        kill = chaos.kill(holder, statuses)
        chaos.kill(node0, statuses)
        node0.start()
        holder.start()
        final = chaos.wait(lambda s: all(v is not None and v["done"] for v in s.values()), timeout=150)
    states = durable_states(chaos.nodes, expected_fingerprint(fleet_shards))
    ledger = Ledger.of(states)
    assert all(s["round"] == 14 for s in final.values())
    assert ledger.lost_rounds(14) == [] and ledger.repeated_rounds() == []
    assert ledger.stall_after(kill) <= 8.0 + STALL_BOUND


def test_members_killed_in_turn_neither_stall_the_token_nor_repeat_a_round(fleet_shards: Path,
                                                                          tmp_path: Path) -> None:
    """Issue 13: after a crash the fleet stalled (67 s) with nobody regenerating the token, and for a moment
    three nodes showed "holder". A holder's announcement of the next round waits on a crashed member (seconds);
    meanwhile the token can go round the live nodes and come back to it, still "holding", so it ignored the
    token — and as everyone knew it alive, nobody regenerated. A member that is neither the holder nor next
    in turn (as far as a poll can tell) is killed at a random moment here and restarted, three times."""
    rng = random.Random(SEED)
    config = FLEET.model_copy(update={"rounds": 0})
    with chaos_fleet(fleet_shards, tmp_path, "round", config) as chaos:
        chaos.wait(lambda s: highest_round(s) >= 3)
        for _ in range(3):
            time.sleep(rng.uniform(0.1, 1.0))
            statuses = chaos.wait(all_alive)
            ids = [n.id for n in chaos.nodes]
            holder = next((i for i in ids if statuses[i]["holding"]), ids[0])
            bystanders = [i for i in ids if i not in (holder, ids[(ids.index(holder) + 1) % len(ids)])]
            victim = chaos.by_id(rng.choice(bystanders))
            kill = chaos.kill(victim, statuses)
            victim.start()
            chaos.wait(lambda s, k=kill: all_alive(s) and highest_round(s) > k.round + 3, timeout=60)
    states = durable_states(chaos.nodes, expected_fingerprint(fleet_shards))
    ledger = Ledger.of(states)
    assert ledger.lost_rounds(completed_rounds(states)) == [] and ledger.repeated_rounds() == []
    assert max(ledger.stall_after(k) for k in chaos.kills) <= STALL_BOUND
