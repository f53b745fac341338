"""Simulator speed: rounds per second of each algorithm on 000's MNIST MLP setting (ζ=4, K=10, Q=1).

Prints one JSON object. Ratios between algorithms come from the same run, so they survive a noisy
machine; absolute figures do not. Evaluation is excluded (it is a separate cost: ``eval_s``).

    python benchmarks/sim_speed.py [--rounds 50] [--config experiments/mnist_mlp_zeta4.yaml]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from dfl_node.config import ExperimentConfig, load_config
from dfl_node.learning.fleet import provision
from dfl_node.sim import Simulation

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "experiments" / "mnist_mlp_zeta4.yaml")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    config = load_config(ExperimentConfig, args.config)  # its relative data_dir is read from its folder
    torch.set_num_threads(config.threads)
    fleet = provision(config)
    report: dict = {"benchmark": "sim_speed", "config": args.config.name, "rounds": args.rounds,
                    "threads": config.threads, "torch": torch.__version__, "machine": platform.machine()}
    for algorithm in config.algorithms:
        sim = Simulation(config, algorithm, fleet)
        sim.run_round(0)  # warm-up
        start = time.perf_counter()
        for t in range(1, args.rounds + 1):
            sim.run_round(t)
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        sim.evaluate(args.rounds, start)
        report[algorithm] = {"rounds_per_s": round(args.rounds / elapsed, 2), "s_per_round": round(elapsed / args.rounds, 4),
                             "eval_s": round(time.perf_counter() - start, 2)}
    base = report[config.algorithms[0]]["rounds_per_s"]
    report["speed_relative_to_" + config.algorithms[0]] = {a: round(report[a]["rounds_per_s"] / base, 2) for a in config.algorithms}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
