"""The membership's cost and quality as a simulated fleet grows (issue 33): ``dfl-node simulate`` of an idle async
fleet (``--participation 0.001``) at each ``--nodes`` given, each a child process; prints one JSON object with, per
fleet size, the results' ``membership`` block (messages and bytes per node and second, suspicions, detection and
join times), the child's wall time and its peak RSS, and ``messages_ratio``: the largest fleet's messages per node
and second over the smallest's.

    python benchmarks/membership.py --nodes 10 100 1000 [--duration 120] [--dataset mnist --data-dir DIR] [-- ARGS]

More than ~1,400 nodes need more samples than the embedded digits has (``--dataset mnist``); anything after ``--``
goes to ``dfl-node simulate`` as is (``--faults FILE``, ``--interval 60``…).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(nodes: int, duration: float, dataset: str, data_dir: str | None, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="dfl-membership-") as out:
        command = [sys.executable, "-m", "dfl_node", "simulate", "--mode", "async", "--nodes", str(nodes),
                   "--duration", str(duration), "--participation", "0.001", "--algorithm", "defkt",
                   "--dataset", dataset, "--test-samples", "200", "--out", out, *extra]
        env = {**os.environ, **({"DFL_DATA_DIR": data_dir} if data_dir else {})}
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        if status != 0:
            raise SystemExit(f"error: {' '.join(command)} failed:\n{child.stderr.read() if child.stderr else ''}")
        membership = json.loads((Path(out) / "defkt.json").read_text())["membership"]
    return {**membership, "wall_s": round(wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--data-dir", default=os.environ.get("DFL_DATA_DIR"))
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    runs = {n: one(n, args.duration, args.dataset, args.data_dir, extra) for n in args.nodes}
    rates = [runs[n]["messages_per_node_s"] for n in sorted(runs)]
    print(json.dumps({"runs": runs, "messages_ratio": round(max(rates) / min(rates), 3)}, indent=1))


if __name__ == "__main__":
    main()
