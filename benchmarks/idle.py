"""What an idle node costs (the target: ≤ 260 MB RSS, < 0.5 % of a core): fleets of 1, 4 and 16 daemons standing by.

Each fleet is :func:`scale.idle_phase`'s (discovered by mDNS, ``min_peers`` out of reach so nobody volunteers,
1 torch thread, nothing polls the REST API while it is measured), here without the run that ``scale.py`` adds
and with what a node's RSS is made of: anonymous memory (heaps, torch's registries, Python objects) against
file-backed pages (shared libraries, which other processes map too), and its thread count. Sizes are measured
one after the other, ``--repeat`` times in turn, so that a before/after comparison on a shared machine sees
the same conditions.

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/idle.py [--sizes 1,4,16] [--seconds 30]'
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _daemon import vm  # benchmarks/_daemon.py: this tree first on sys.path
from scale import IDLE_CPU_TARGET_PERCENT, IDLE_RSS_TARGET_MB, fleet, mb, standing_by

from dfl_node.cli.testbed import TESTBED_DEFAULTS
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.settings.experiment import ExperimentConfig


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def idle_fleet(size: int, root: Path, seconds: float, settle: float, timeout: float) -> dict:
    """One idle fleet of ``size`` nodes: mean per-node VmRSS, RssAnon and CPU over ``seconds``."""
    shards = ExperimentConfig(**{**TESTBED_DEFAULTS, "nodes": max(size, 2), "threads": 1})  # a fleet has 2 or more
    write_fleet(provision(shards), root / "shards")
    config = shards.model_copy(update={"nodes": size})  # size 1: a node alone, on node-0's shard
    with fleet(config, "defkt", root / "shards", root / f"idle-{size}-{time.monotonic_ns()}",
               {"min_peers": size}) as nodes:
        meter = standing_by(nodes, seconds, settle, timeout)
        anon = [vm(meter.pid(n), "RssAnon") for n in nodes]
        count = [threads(meter.pid(n)) for n in nodes]
    rss = [statistics.mean(meter.rss[n.id]) for n in nodes]
    cpu = [meter.cpu_percent(n.id) for n in nodes]
    return {"nodes": size, "seconds": round(meter.seconds, 1),
            "rss_mb": {"mean": mb(statistics.mean(rss)), "max": mb(max(rss))},
            "rss_anon_mb": {"mean": mb(statistics.mean(anon)), "max": mb(max(anon))},
            "cpu_percent": {"mean": round(statistics.mean(cpu), 3), "max": round(max(cpu), 3)},
            "threads": max(count),
            "targets_met": {"rss": mb(max(rss)) <= IDLE_RSS_TARGET_MB, "cpu": max(cpu) < IDLE_CPU_TARGET_PERCENT}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="fleet sizes, measured in this order")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds each idle fleet is measured")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between discovery and measurement")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the sizes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a fleet may take to discover")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="dfl-idle-") as root:
        runs = [idle_fleet(size, Path(root), args.seconds, args.settle, args.timeout)
                for _ in range(args.repeat) for size in sizes]
    print(json.dumps({"benchmark": "idle", "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
