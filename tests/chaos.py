"""The fault-injection harness of tests/test_faults.py (the real kill -9 storms), whose timeouts and stall bound
tests/test_sim_fault_cases.py shares: a fleet of real ``dfl-node start`` daemons on loopback that
can be killed with SIGKILL and restarted (:class:`Chaos`), and the fleet's durable record (:class:`Ledger`).

Every invariant is read from what the nodes made *durable* — each one's final checkpoint and the history
stored with it — never from what a node said over REST before it died:

* every final checkpoint loads, holds the fleet's model (its fingerprint) and only finite weights;
* round mode: every round up to the fleet's last completed one was fused exactly once (Def-KT, Q = 1:
  one group a round), and no node fused or sent twice for a round;
* no accepted model is lost: each transfer a sender counts as done ("send" in its history) was fused
  by its aggregator, durably ("fusion" there, naming the sender);
* round mode: after each kill the fleet fuses again within a bound set by the configured timeouts — the
  tighter one of ``dfl_node.node.schedule.liveness`` when the victim was back within ``peer_timeout``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfl_node.learning.datasets import load_shard
from dfl_node.learning.models import ModelSpec, fingerprint
from dfl_node.learning.provision import TRAIN_FILE
from dfl_node.node.membership.swim_bounds import detection_bound, notice_bound
from dfl_node.node.schedule.liveness import liveness_bound
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import MembershipSettings
from dfl_node.sim import ledger
from dfl_node.testbed.launcher import NodeProcess, wait_until
from tests.helpers.fleet import FLEET, loopback_fleet

SEED = 13
# Kills per fleet-wide run: CI plays 8 a fleet (~2 min on 2 cores); DFL_FAULT_KILLS=20 (or more) is the run
# to make by hand before a change to the node's fault paths.
KILLS = int(os.environ.get("DFL_FAULT_KILLS", "8"))
TIMEOUTS = {"heartbeat": 0.2, "peer_timeout": 1.0, "token_timeout": 2.0, "round_timeout": 15.0, "stream_timeout": 5.0}
# After a kill the fleet fuses again within: the membership's detection bound (the crash is known everywhere:
# dfl_node.node.membership.swim_bounds.detection_bound), token_timeout (a lost token is
# regenerated), round_timeout (the holder, or the regenerating node, waits that long at most for a crashed
# member to come back, as it may hold the only record of the newest round), then one round of its own
# (training, transfer, fusion, checkpoints: a freshly restarted process's first round took up to 6 s on a
# loaded 2-core machine).
ROUND_MARGIN = 10.0
MEMBERSHIP = MembershipSettings(heartbeat=TIMEOUTS["heartbeat"], peer_timeout=TIMEOUTS["peer_timeout"])
STALL_BOUND = (detection_bound(MEMBERSHIP, FLEET.nodes) + TIMEOUTS["token_timeout"] + TIMEOUTS["round_timeout"]
               + ROUND_MARGIN)


def storm_timeouts(start_s: float) -> dict[str, float]:
    """The round-mode storm's timeouts on a machine where a daemon takes ``start_s`` seconds from its start to its
    first answer: a peer_timeout longer than a restart in the storm (so most victims are back before anyone saw
    them leave), however slow the machine — 8 s, or four starts where one takes longer than 2 s (a restart in the
    storm shares the cores with two fleets) — and a round_timeout far above the bound such a restart must meet."""
    return {**TIMEOUTS, "peer_timeout": max(8.0, 4 * start_s), "round_timeout": 60.0}


def daemon_start_s(shards: Path, workdir: Path) -> float:
    """Seconds a daemon of these fleets takes here from its start to its first REST answer."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with loopback_fleet(shards, workdir, "defkt", FLEET.model_copy(update={"nodes": 1}), mdns=False,
                        extra={**TIMEOUTS, "evaluate": False, "min_peers": 1}, swarm="start") as (node,):
        wait_until([node], lambda s: s[node.id] is not None, timeout=120, every=0.05)
        return time.monotonic() - started


def stall_bound(timeouts: dict[str, float], back_within_peer_timeout: bool) -> float:
    """:func:`dfl_node.node.schedule.liveness.liveness_bound` for one crash, plus one round's own work
    (ROUND_MARGIN)."""
    membership = MembershipSettings(heartbeat=timeouts["heartbeat"], peer_timeout=timeouts["peer_timeout"])
    detection = (notice_bound if back_within_peer_timeout else detection_bound)(membership, FLEET.nodes)
    return liveness_bound(detection=detection, token_timeout=timeouts["token_timeout"],
                          heartbeat=timeouts["heartbeat"], round_timeout=timeouts["round_timeout"],
                          quick=back_within_peer_timeout) + ROUND_MARGIN
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
    train = load_shard(shards / "node-0" / TRAIN_FILE)
    learning = config.learning
    spec = ModelSpec(learning.model, tuple(learning.hidden) if learning.hidden else None)
    return fingerprint(learning.model,
                       spec.build(train.input_shape, train.num_classes, seed=learning.seed).state_dict())


def durable_states(nodes: list[NodeProcess], fingerprint_: str) -> dict[str, dict[str, Any]]:
    """Each stopped node's checkpoint, checked (:func:`dfl_node.sim.ledger.durable_states`)."""
    return ledger.durable_states([(n.id, n.state_dir, fingerprint_) for n in nodes], HISTORY_LIMIT)
