"""The membership's cost and quality as a simulated fleet grows: ``dfl-node simulate --mode async`` at
each ``--nodes`` given, each run a child process; prints one JSON object with, per fleet size, the results'
``membership`` block (messages and bytes per node and second, suspicions, detection and join times), the fusions the
fleet ran (``rounds``), the child's wall time, CPU time and peak RSS, and ``messages_ratio``: the largest fleet's
messages per node and second over the smallest's.

    python benchmarks/membership.py --nodes 10 100 1000 [--duration 120] [--dataset mnist --data-dir DIR] [-- ARGS]

The two target cases (1,000 nodes, 600 virtual seconds; two runs each, their results
compared byte for byte: ``identical``):

    python benchmarks/membership.py --nodes 1000 --duration 600 --repeat 2                    # idle
    python benchmarks/membership.py --nodes 1000 --duration 600 --repeat 2 --interval 60 --participation 1  # working

Idle is ``--participation 0.001`` (the default here): a node volunteers at one tick in a thousand. Working: every
node volunteers once a minute (``--interval 60``, jittered ±50 %) and leads a Def-KT exchange. More than ~350 nodes
need more samples than the embedded digits has (``--dataset mnist``, the default here); anything after ``--`` goes
to ``dfl-node simulate`` as is (``--faults FILE``, ``--config experiments/sim_nat_1000.yaml``: 70 % behind NAT, whose
``relays`` block the run's figures then carry).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from _child import run_timed  # benchmarks/_child.py: this tree first on sys.path


def one(nodes: int, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """One run of ``nodes`` nodes: its membership figures, fusions, wall and CPU time, peak RSS, results' sha256."""
    with tempfile.TemporaryDirectory(prefix="dfl-membership-") as out:
        command = [sys.executable, "-m", "dfl_node", "simulate", "--mode", "async", "--nodes", str(nodes),
                   "--duration", str(args.duration), "--participation", str(args.participation),
                   "--algorithm", args.algorithm, "--dataset", args.dataset, "--test-samples", str(args.test_samples),
                   "--out", out, *(["--interval", str(args.interval)] if args.interval else []), *extra]
        timed = run_timed(command, {**os.environ, **({"DFL_DATA_DIR": args.data_dir} if args.data_dir else {})})
        text = (Path(out) / f"{args.algorithm}.json").read_bytes()
    result = json.loads(text)
    return {**result["membership"], **({"relays": result["relays"]} if result.get("relays") else {}),
            "rounds": result["rounds"], "wall_s": timed.wall_s, "cpu_s": timed.cpu_s, "peak_rss_mb": timed.peak_rss_mb,
            "results_sha256": hashlib.sha256(text).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--interval", type=float, help="async --interval (default: dfl-node's)")
    parser.add_argument("--participation", type=float, default=0.001)
    parser.add_argument("--algorithm", default="defkt")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--test-samples", type=int, default=200)
    parser.add_argument("--data-dir", default=os.environ.get("DFL_DATA_DIR"))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each size; >1: say whether results match")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    runs: dict[int, Any] = {}
    for n in args.nodes:
        tries = [one(n, args, extra) for _ in range(args.repeat)]
        runs[n] = {**tries[0], "wall_s": [t["wall_s"] for t in tries], "cpu_s": [t["cpu_s"] for t in tries],
                   "peak_rss_mb": [t["peak_rss_mb"] for t in tries],
                   **({"identical": len({t["results_sha256"] for t in tries}) == 1} if args.repeat > 1 else {})}
    rates = [runs[n]["messages_per_node_s"] for n in sorted(runs)]
    print(json.dumps({"runs": runs, "messages_ratio": round(max(rates) / min(rates), 3)}, indent=1))


if __name__ == "__main__":
    main()
