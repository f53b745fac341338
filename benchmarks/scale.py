"""Density: N real daemons on one machine in async mode, with the RSS and CPU of each.

Two fleets of ``--nodes`` ``dfl-node start`` processes (default 16) on loopback, planned and watched by the
testbed's own helpers (:mod:`dfl_node.testbed.launcher`) on the shards ``dfl-node testbed`` writes (the embedded
digits data, its preset), 1 torch thread per node:

* **Idle** (``--idle`` seconds, default 10): ``min_peers`` is one more than the fleet has, so no node ever
  volunteers. Once every node sees the N - 1 others and ``--settle`` seconds have passed (start-up work,
  the first evaluation), each daemon's VmRSS is read once a second and its CPU time at both ends, and
  nobody polls the REST API meanwhile (a poll would cost the daemons the CPU being measured). This is
  what a node costs when a swarm of N stands by: heartbeats to N - 1 peers, mDNS. The issue's targets:
  idle RSS ≤ 260 MB and idle CPU < 0.5 % of one core, per node.
* **Run** (``--duration`` seconds, default 300): a fresh fleet in async mode, every node volunteering for
  ``--duration`` once it sees its N - 1 peers, as ``dfl-node testbed --mode async`` runs it. From the moment
  every node answers ``/status`` until all are done (twice in a row, :func:`done_twice`), each node's
  ``/status`` and VmRSS are read every ``--every`` seconds; its peak is the larger of those samples and
  the kernel's VmHWM (reset at the run's start where allowed, i.e. as root; otherwise it includes start-up).
  CPU is ``/proc/PID/stat`` utime + stime over that window, as a percentage of one core.

A separate idle fleet rather than an idle spell of the run's own: a node of the run starts volunteering the
moment it sees its peers, so its idle time before then is start-up, not standing by.

Checks (exit code 1 if one fails): every node saw N - 1 peers alive at some poll (``all_discovered``), every
node fused at least once (``every_node_fused``), and no node log (both fleets) holds a line with ``ERROR`` or
``Traceback`` (``errors``: their count and the first few). Prints one JSON object.

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/scale.py [--nodes 16] [--duration 300]'

Linux only (``/proc``). Run it in a network namespace of its own, as above: the nodes find each other by
mDNS, and nothing should reach, or come from, another machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _daemon import REPO, cpu_seconds, reset_peak, vm  # benchmarks/_daemon.py: this tree first on sys.path
from aggregator import machine

from dfl_node.cli.testbed import TESTBED_DEFAULTS
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.testbed.launcher import NodeProcess, Placement, done_twice, plan_fleet, poll_status, stop_all, wait_until

IDLE_RSS_TARGET_MB = 260.0
IDLE_CPU_TARGET_PERCENT = 0.5
ERROR_MARKERS = ("ERROR", "Traceback")
FIRST_ERRORS = 5  # error lines quoted in the report; all are counted
MB = 1e6

Statuses = dict[str, dict | None]


@dataclass
class Meter:
    """A fleet's /proc figures: VmRSS samples per node and CPU seconds at the window's two ends.

    Read from /proc, not from the daemons: it costs them nothing, so it can run while they are idle.
    """

    nodes: list[NodeProcess]
    rss: dict[str, list[int]] = field(default_factory=dict)
    cpu_start: dict[str, float] = field(default_factory=dict)
    cpu_end: dict[str, float] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0

    def pid(self, node: NodeProcess) -> int:
        assert node.process is not None, f"{node.id} was never started"
        return node.process.pid

    def start(self) -> None:
        self.started = time.monotonic()
        self.cpu_start = {n.id: cpu_seconds(self.pid(n)) for n in self.nodes}
        self.rss = {n.id: [] for n in self.nodes}
        self.sample()

    def sample(self) -> None:
        for node in self.nodes:
            self.rss[node.id].append(vm(self.pid(node), "VmRSS"))

    def stop(self) -> None:
        self.sample()
        self.cpu_end = {n.id: cpu_seconds(self.pid(n)) for n in self.nodes}
        self.ended = time.monotonic()

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def cpu_percent(self, node_id: str) -> float:
        """CPU time over the window, as a percentage of one core."""
        return 100.0 * (self.cpu_end[node_id] - self.cpu_start[node_id]) / self.seconds


@contextlib.contextmanager
def fleet(config: ExperimentConfig, algorithm: str, shards: Path, workdir: Path, extra: dict[str, object]
          ) -> Iterator[list[NodeProcess]]:
    """``config.nodes`` daemons on 127.0.0.1 in a swarm of their own, planned as ``dfl-node testbed`` plans them
    (``extra``: settings over the plan's), started, and always stopped (SIGTERM, then SIGKILL after one grace)."""
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = plan_fleet(config, algorithm, shards, workdir, [Placement("127.0.0.1")] * config.nodes,
                       swarm=f"scale-{uuid.uuid4().hex[:8]}", mode="async", extra=extra)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    try:
        for node in nodes:
            node.env["PYTHONPATH"] = path  # the daemons run this tree, as the benchmark does
            node.start()
        yield nodes
    finally:
        stop_all(nodes)


def alive_peers(status: dict | None) -> int:
    return 0 if status is None else sum(p["alive"] for p in status["peers"])


def all_see_each_other(statuses: Statuses) -> bool:
    """A :func:`wait_until` predicate: every node answers and sees all the others alive."""
    return all(alive_peers(s) == len(statuses) - 1 for s in statuses.values())


def all_answer(statuses: Statuses) -> bool:
    return all(s is not None for s in statuses.values())


def mb(value: float) -> float:
    return round(value / MB, 1)


def standing_by(nodes: list[NodeProcess], seconds: float, settle: float, timeout: float) -> Meter:
    """Once every node sees every other and ``settle`` seconds more have passed, ``nodes`` metered for
    ``seconds`` (RSS sampled every second), nothing polling them meanwhile."""
    wait_until(nodes, all_see_each_other, timeout, every=1.0)
    time.sleep(settle)
    meter = Meter(nodes)
    meter.start()
    while time.monotonic() - meter.started < seconds:
        time.sleep(1.0)
        meter.sample()
    meter.stop()
    return meter


def idle_phase(config: ExperimentConfig, algorithm: str, shards: Path, workdir: Path, seconds: float, settle: float,
               timeout: float) -> tuple[dict, list[NodeProcess]]:
    """The fleet standing by: discovered, nothing to do (no node's ``min_peers`` can be met)."""
    with fleet(config, algorithm, shards, workdir, {"min_peers": config.nodes}) as nodes:
        launched = time.monotonic()
        meter = standing_by(nodes, seconds, settle, timeout)
        discovered_s = meter.started - settle - launched
        after = poll_status(nodes)  # only now: a poll costs the daemons CPU
    per_node = {
        n.id: {"rss_mb": mb(statistics.mean(meter.rss[n.id])), "cpu_percent": round(meter.cpu_percent(n.id), 3),
               "peers_alive": alive_peers(after[n.id]),
               "fusions": None if after[n.id] is None else after[n.id]["fusions"]}
        for n in nodes
    }
    rss = [v["rss_mb"] for v in per_node.values()]
    cpu = [v["cpu_percent"] for v in per_node.values()]
    report = {
        "seconds": round(meter.seconds, 1), "settle_s": settle, "all_discovered_after_s": round(discovered_s, 1),
        "rss_mb": {"mean": round(statistics.mean(rss), 1), "max": max(rss), "total": round(sum(rss), 1)},
        "cpu_percent": {"mean": round(statistics.mean(cpu), 3), "max": max(cpu), "total": round(sum(cpu), 3)},
        "targets": {"rss_mb_per_node": IDLE_RSS_TARGET_MB, "cpu_percent_per_node": IDLE_CPU_TARGET_PERCENT,
                    "rss_met": max(rss) <= IDLE_RSS_TARGET_MB, "cpu_met": max(cpu) < IDLE_CPU_TARGET_PERCENT},
        "stayed_idle": all(v["fusions"] == 0 for v in per_node.values()),
        "per_node": per_node,
    }
    return report, nodes


def run_phase(config: ExperimentConfig, algorithm: str, shards: Path, workdir: Path, duration: float, every: float,
              timeout: float) -> tuple[dict, list[NodeProcess]]:
    """The fleet at work in async mode for ``duration``, sampled every ``every`` seconds until all are done."""
    with fleet(config, algorithm, shards, workdir, {"duration": duration}) as nodes:
        launched = time.monotonic()
        first = wait_until(nodes, all_answer, timeout, every=every)
        up_s = time.monotonic() - launched
        peaks_reset = all([reset_peak(n.process.pid) for n in nodes if n.process is not None])
        meter = Meter(nodes)
        meter.start()
        seen = {node_id: alive_peers(s) for node_id, s in first.items()}

        def record(statuses: Statuses) -> None:
            meter.sample()
            for node_id, status in statuses.items():
                seen[node_id] = max(seen[node_id], alive_peers(status))

        final = wait_until(nodes, done_twice(), timeout + duration, on_poll=record, every=every)
        meter.stop()
        hwm = {n.id: vm(meter.pid(n), "VmHWM") for n in nodes}
    per_node = {}
    for n in nodes:
        status, samples = final[n.id], meter.rss[n.id]
        assert status is not None  # done_twice held: every node answered
        per_node[n.id] = {
            "peers_seen": seen[n.id], "fusions": status["fusions"], "models_sent": status["models_sent"],
            "models_received": status["models_received"], "rejected": sum(status["rejected"].values()),
            "rejected_by_reason": status["rejected"], "global_accuracy": status["global_accuracy"],
            "rss_mb": {"start": mb(samples[0]), "mean": mb(statistics.mean(samples)),
                       "peak": mb(max(max(samples), hwm[n.id])), "end": mb(samples[-1])},
            "cpu_percent": round(meter.cpu_percent(n.id), 1),
        }
    report = {
        "all_answered_after_s": round(up_s, 1), "measured_s": round(meter.seconds, 1),
        "samples_per_node": len(meter.rss[nodes[0].id]),
        "peak_rss_includes_start_up": not peaks_reset,
        "totals": {
            "fusions": sum(v["fusions"] for v in per_node.values()),
            "models_sent": sum(v["models_sent"] for v in per_node.values()),
            "rejected": sum(v["rejected"] for v in per_node.values()),
            "rss_mb_end": mb(sum(meter.rss[n.id][-1] for n in nodes)),
            # the largest fleet-wide sum of one sampling instant, and the sum of each node's own peak (an upper bound)
            "rss_mb_peak": mb(max(sum(s) for s in zip(*meter.rss.values()))),
            "rss_mb_sum_of_node_peaks": round(sum(v["rss_mb"]["peak"] for v in per_node.values()), 1),
            "cpu_percent": round(sum(v["cpu_percent"] for v in per_node.values()), 1),
            "cpu_seconds": round(sum(meter.cpu_end[i] - meter.cpu_start[i] for i in per_node), 1),
        },
        "per_node": per_node,
    }
    return report, nodes


def log_errors(nodes: list[NodeProcess]) -> dict:
    """Lines of the node logs that say ERROR or hold a traceback: their count and the first few, node-tagged."""
    found = [f"{n.id}: {line.strip()}" for n in nodes if n.log_path.exists()
             for line in n.log_path.read_text(errors="replace").splitlines()
             if any(marker in line for marker in ERROR_MARKERS)]
    return {"count": len(found), "first": found[:FIRST_ERRORS]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16, help="daemons in each fleet")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds each node volunteers (async mode)")
    parser.add_argument("--algorithm", default="defkt", help="the fleet's algorithm (the testbed's default)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the idle fleet is measured "
                                                               "(0: no idle fleet)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the idle fleet's discovery and "
                                                                  "its measurement (start-up work ends)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples of the run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a fleet may take to start and discover")
    parser.add_argument("--workdir", type=Path, help="keep shards, state and logs here (default: a temp folder, "
                                                     "removed unless a check fails)")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes: at least 2 (a node alone has nobody to fuse with)")
    config = ExperimentConfig(**{**TESTBED_DEFAULTS, "nodes": args.nodes, "threads": 1})
    root = args.workdir or Path(tempfile.mkdtemp(prefix="dfl-scale-"))
    write_fleet(provision(config), root / "shards")
    started = time.monotonic()
    try:
        idle, idle_nodes = ({}, []) if args.idle <= 0 else idle_phase(
            config, args.algorithm, root / "shards", root / "idle", args.idle, args.settle, args.timeout)
        run, run_nodes = run_phase(config, args.algorithm, root / "shards", root / "run", args.duration, args.every,
                                   args.timeout)
    except (TimeoutError, RuntimeError) as exc:  # a node died, or the fleet never got there: wait_until says which
        sys.exit(f"scale: {exc}\nshards, state and logs kept in {root}")
    per_node = run["per_node"].values()
    errors = log_errors(idle_nodes + run_nodes)
    checks = {"all_discovered": all(v["peers_seen"] == args.nodes - 1 for v in per_node),
              "every_node_fused": all(v["fusions"] > 0 for v in per_node),
              "no_errors": errors["count"] == 0}
    keep = args.workdir is not None or not all(checks.values())
    report = {
        "benchmark": "scale", "machine": machine(), "nodes": args.nodes, "mode": "async", "algorithm": args.algorithm,
        "dataset": config.shards.dataset, "partition": config.shards.partition,
        "threads_per_node": config.learning.threads,
        "duration_s": args.duration, "wall_s": round(time.monotonic() - started, 1),
        "checks": {**checks, "errors": errors, "passed": all(checks.values())},
        "idle": idle, "run": run, "workdir": str(root) if keep else None,
    }
    print(json.dumps(report, indent=1))
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    if not all(checks.values()):
        sys.exit(f"scale: a check failed; shards, state and logs kept in {root}")


if __name__ == "__main__":
    main()
