"""Sweep speed: 12 short simulator runs one after another in this process, on the process pool, and
on a private local Ray instance, all in one run (so the ratios survive a noisy machine).

Prints one JSON object. Target: on 2 cores the pool takes ≤ 0.6× the sequential time.
Each runner runs the grid ``--repeat`` times, interleaved with the others; the best time counts.
Ray gets a fresh local instance per pass, whose start is timed on its own (``ray_init_s``); its
run time still includes starting its worker processes (each imports torch). Every runner must
reach the same final accuracies (the simulator is deterministic per seed): ``same_results``.

    python benchmarks/sweep_speed.py [--workers 2] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from dfl_node.sweep import expand
from dfl_node.sweep.execute import Outcome, execute
from dfl_node.sweep.pool import run_pool
from dfl_node.sweep.ray_runner import init_ray, run_ray

try:
    import ray
except ImportError:
    raise SystemExit("sweep_speed needs Ray: pip install -e '.[ray]'") from None

# 2 grid points × 3 seeds × 2 algorithms = 12 runs of ~1 s on the embedded digits data.
GRID = """
settings: {{nodes: 10, rounds: {rounds}, eval_every: 10, partition: shards, zeta: 4, batch_size: 20,
            mkt_batch_size: 20, algorithms: [defkt, combo]}}
grid: {{lr: [0.05, 0.1]}}
seeds: [0, 1, 2]
"""


def timed_runner(run: callable) -> tuple[float, dict[str, float]]:
    finals: dict[str, float] = {}

    def keep(outcome: Outcome) -> None:
        assert outcome.payload is not None, outcome.error
        finals[outcome.task.name] = outcome.payload["global_accuracy"]

    start = time.perf_counter()
    run(keep)
    return time.perf_counter() - start, finals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2, help="times each runner runs the grid; the best counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        grid = Path(folder) / "grid.yaml"
        grid.write_text(GRID.format(rounds=args.rounds))
        tasks = expand(grid)
    torch.set_num_threads(1)

    def sequential(keep: callable) -> None:
        for task in tasks:
            keep(Outcome(task, payload=execute(task)))

    def on_ray(keep: callable) -> None:
        """A fresh local instance per pass (started and stopped outside the timing): the pool forks,
        and a process that forks should not hold a live Ray driver."""
        run_ray(tasks, "local", keep)

    runners = {"sequential": sequential, "pool": lambda keep: run_pool(tasks, args.workers, keep), "ray": on_ray}
    times: dict[str, list[float]] = {name: [] for name in runners}
    init_times: list[float] = []
    finals: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):  # interleaved, so a burst of load elsewhere hits every runner alike
        for name, run in runners.items():
            if name == "ray":
                start = time.perf_counter()
                init_ray("local", num_cpus=args.workers)
                init_times.append(round(time.perf_counter() - start, 2))
            elapsed, finals[name] = timed_runner(run)
            times[name].append(round(elapsed, 2))
            if name == "ray":
                ray.shutdown()
    ray_init_s = min(init_times)
    sequential_s, pool_s, ray_s = (min(times[name]) for name in runners)
    report = {
        "benchmark": "sweep_speed", "runs": len(tasks), "rounds": args.rounds, "workers": args.workers,
        "cpus": os.cpu_count(), "sequential_s": round(sequential_s, 2), "pool_s": round(pool_s, 2),
        "pool_over_sequential": round(pool_s / sequential_s, 3), "target_pool_over_sequential": 0.6,
        "ray_init_s": round(ray_init_s, 2), "ray_s": round(ray_s, 2),
        "ray_over_sequential": round(ray_s / sequential_s, 3),
        "ray_with_init_over_sequential": round((ray_s + ray_init_s) / sequential_s, 3),
        "same_results": finals["sequential"] == finals["pool"] == finals["ray"],
        "repeats": args.repeat, "all_times_s": times,
        "torch": torch.__version__, "ray": ray.__version__, "machine": platform.machine(), "threads_per_run": 1,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
