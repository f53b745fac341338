"""What differential privacy costs and what it protects, measured: for each dataset × algorithm × budget ε, a
``dfl-node simulate --privacy-audit`` child process (one torch thread; ``--jobs`` of them at once), and from its
results the fleet's final global / local accuracy, the largest ε a node spent, and the membership-inference attack's
mean / max AUC, mean TPR at 1 % FPR and mean advantage (docs/privacy.md). Prints one JSON object; ``--markdown
FILE`` also writes the table.

    python benchmarks/privacy_table.py --markdown runs/privacy_table.md   # the whole table (~30 min)
    python benchmarks/privacy_table.py --datasets digits --algorithms defkt --epsilons 3 inf --rounds 10
    python benchmarks/privacy_table.py --markdown runs/privacy_table.md --resume LOG   # cells of an earlier run reused

Each cell, once done, is also a JSON line on stderr; ``--resume LOG`` takes the cells of such a log (an interrupted
run's) whose dataset, algorithm, ε, rounds, ``--dp-epochs`` and algorithm flags are this run's, and runs the rest.

The settings (``inf``: no differential privacy):

* **mnist**: ``experiments/mnist_mlp_zeta4.yaml`` (000's MNIST MLP, K = 10, ζ = 4 shards, 4800 training samples a
  node) at ``--mnist-rounds`` rounds (100; 000 runs 2500, far beyond a 2-core CPU shared with other work for 24 runs).
* **digits**: the embedded default (``dfl-node simulate`` with no config: digits, K = 10, ζ = 4 shards, 112 training
  samples a node) at ``--digits-rounds`` rounds (200, the demo's).
* **dfml** runs with ``--dfml-epochs 1 --senders 0.1`` (a random aggregator and 1 sender a round, K = 1 pass of
  mutual learning, about Def-KT's CPU): 003's K = 10 with half the fleet as senders is ~15× the CPU, more than this
  machine had; every node has the same architecture here (no heterogeneous models).

**σ is planned from the run's own schedule.** The nodes choose σ themselves (``--dp-epsilon`` without
``--dp-noise``) as the smallest that keeps ``--dp-epochs`` passes of local training within ε; this script sets
``--dp-epochs`` so that the run's busiest node spends its budget exactly by the last round, and no node stops
early. The rule: the planners are pure functions of (seed, round) — ``sample_pairs`` (defkt, fullavg) and
``sample_gather`` (dfml) — so the script replays them for the run's rounds and writes down each node's
DP-SGD history as the node will account it, in terms of σ: a sender's local training (defkt, fullavg) and every
dfml participant's, ``local_epochs`` × ⌈N/B⌉ steps at (σ, B/N); a defkt receiver's MKT, ``mkt_epochs`` × ⌈N/B₂⌉
steps at (σ/√2, B₂/N) (two models trained on each batch); a dfml aggregator's mutual learning, ``dfml_epochs`` ×
⌈N/B₂⌉ steps at (σ/√k, B₂/N), k the group; a fullavg receiver trains nothing. ``--dp-epochs`` is then the fewest
(to 0.01 of a pass) for which the σ the nodes will plan (``planned_noise``, as they do) keeps every node's history
within ε (``epsilon_of``, the nodes' accountant). Counting a k-model step as k passes would not do: at σ/√k near 1
the subsampled Gaussian's cost grows much faster than 1/σ², and the busiest receivers would stop halfway.

Every cell reports ``noise_multiplier`` (the σ the nodes planned, computed here as they compute it), ``dp_epochs``,
``max_epsilon`` over the nodes (null without DP), the rounds, and the child's wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _child import run_timed  # benchmarks/_child.py: this tree first on sys.path

DATASETS = ("mnist", "digits")
ALGORITHMS = ("defkt", "fullavg", "dfml")
EPSILONS = (1.0, 3.0, 8.0, math.inf)
CONFIGS = {"mnist": Path(__file__).resolve().parent.parent / "experiments" / "mnist_mlp_zeta4.yaml", "digits": None}
ALGORITHM_FLAGS = {"dfml": ["--dfml-epochs", "1", "--senders", "0.1"]}
DFML_EPOCHS, DFML_SENDERS = 1, 0.1
# Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016): centralised DP-SGD, MNIST with PCA, δ = 1e-5
ABADI = {0.5: 0.90, 2.0: 0.95, 8.0: 0.97}


def fleet(dataset: str, rounds: int) -> tuple[Any, list[int]]:
    """The experiment ``dfl-node simulate`` will run for ``dataset`` (its settings) and each node's training samples."""
    from dfl_node.cli.options import DEMO_DEFAULTS  # noqa: PLC0415 - torch, only where a run is planned
    from dfl_node.learning.provision import provision  # noqa: PLC0415
    from dfl_node.settings.experiment import ExperimentConfig  # noqa: PLC0415
    from dfl_node.settings.loading import load_config  # noqa: PLC0415

    config = load_config(ExperimentConfig, CONFIGS[dataset], {"rounds": rounds},
                         preset=DEMO_DEFAULTS if CONFIGS[dataset] is None else None)
    return config, [len(client.train) for client in provision(config).clients]


def histories(algorithm: str, config: Any, samples: list[int], rounds: int) -> list[list[tuple[float, float, int]]]:
    """Each node's DP-SGD over the run as its account will hold it: (noise multiplier as a multiple of σ, rate,
    steps), from the algorithm's planner replayed round by round."""
    from dfl_node.algorithms.base import sample_gather, sample_pairs  # noqa: PLC0415
    from dfl_node.learning.provision import fleet_ids  # noqa: PLC0415

    learning = config.learning
    ids = fleet_ids(len(samples))
    spent: list[dict[tuple[float, float], int]] = [{} for _ in ids]

    def train(node: int, models: int, batch: int, epochs: int) -> None:
        n = samples[node]
        key = (1 / math.sqrt(models), min(1.0, batch / n))
        spent[node][key] = spent[node].get(key, 0) + epochs * math.ceil(n / batch)

    local = (learning.batch_size, learning.local_epochs)
    for round_ in range(1, rounds + 1):
        if algorithm == "dfml":
            group = sample_gather(learning.seed, round_, ids, DFML_SENDERS)
            members = [ids.index(group.aggregator), *(ids.index(s) for s in group.senders)]
            for node in members:
                train(node, 1, *local)
            train(members[0], len(members), learning.mkt_batch_size, DFML_EPOCHS)
        else:
            for group in sample_pairs(learning.seed, round_, ids, learning.pairs):
                train(ids.index(group.senders[0]), 1, *local)
                if algorithm == "defkt":
                    train(ids.index(group.aggregator), 2, learning.mkt_batch_size, learning.mkt_epochs)
    return [[(factor, rate, steps) for (factor, rate), steps in node.items()] for node in spent]


def plan(algorithm: str, config: Any, samples: list[int], rounds: int, epsilon: float) -> dict[str, Any]:
    """The fewest ``--dp-epochs`` (to 0.01) whose planned σ keeps every node within ``epsilon`` over the run; the σ
    (of the node with the most samples: the nodes' σ differ only where their samples do) and the largest ε planned."""
    from dfl_node.learning.privacy import epsilon_of, planned_noise  # noqa: PLC0415

    learning = config.learning
    delta, batch = learning.dp_delta, learning.batch_size
    runs = histories(algorithm, config, samples, rounds)

    def sigma(epochs: float, n: int) -> float:
        return planned_noise(epsilon, delta, min(1.0, batch / n), math.ceil(epochs * math.ceil(n / batch)))

    def worst(epochs: float) -> float:
        noise = {n: sigma(epochs, n) for n in set(samples)}
        return max(epsilon_of([(f * noise[n], q, s) for f, q, s in run], delta) for n, run in zip(samples, runs))

    low, high = 0.01, 1.0  # worst(high) within the budget, worst(low) not
    while worst(high) > epsilon:
        low, high = high, high * 2
    while high - low > 0.01:
        middle = (low + high) / 2
        low, high = (low, middle) if worst(middle) <= epsilon else (middle, high)
    epochs = math.ceil(high * 100) / 100
    return {"dp_epochs": epochs, "noise_multiplier": round(sigma(epochs, max(samples)), 4),
            "planned_max_epsilon": round(worst(epochs), 4)}


def run_cell(dataset: str, algorithm: str, epsilon: float, rounds: int, eval_every: int,
             planned: dict[str, Any]) -> dict[str, Any]:
    """One ``dfl-node simulate --privacy-audit`` child: the cell's figures."""
    with tempfile.TemporaryDirectory(prefix="dfl-privacy-table-") as out:
        command = [sys.executable, "-m", "dfl_node", "simulate", "--algorithm", algorithm, "--rounds", str(rounds),
                   "--eval-every", str(eval_every), "--threads", "1", "--privacy-audit", "--quiet", "--out", out,
                   *(["--config", str(CONFIGS[dataset])] if CONFIGS[dataset] else []),
                   *ALGORITHM_FLAGS.get(algorithm, []),
                   *([] if math.isinf(epsilon) else ["--dp-epsilon", f"{epsilon:g}",
                                                     "--dp-epochs", f"{planned['dp_epochs']:g}"])]
        timed = run_timed(command, {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        result = json.loads((Path(out) / f"{algorithm}.json").read_text())
    spent = [n["epsilon"] for n in result["nodes"] if n.get("epsilon") is not None]
    attack = result["membership_inference"]
    return {"dataset": dataset, "algorithm": algorithm, "epsilon": None if math.isinf(epsilon) else epsilon,
            "flags": ALGORITHM_FLAGS.get(algorithm, []),
            **({} if math.isinf(epsilon) else planned),
            "max_epsilon": round(max(spent), 4) if spent else None,
            "min_epsilon": round(min(spent), 4) if spent else None,
            "global_accuracy": round(result["global_accuracy"], 4),
            "local_accuracy": round(result["local_accuracy"], 4),
            "mean_auc": round(attack["mean_auc"], 4), "max_auc": round(attack["max_auc"], 4),
            "mean_tpr_at_1pct_fpr": round(attack["mean_tpr_at_1pct_fpr"], 4),
            "mean_advantage": round(attack["mean_advantage"], 4), "audit_samples": _samples(result),
            "rounds": result["rounds"], "wall_s": timed.wall_s, "cpu_s": timed.cpu_s}


def earlier(log: Path) -> list[dict[str, Any]]:
    """The cells an earlier run logged (its stderr's JSON lines)."""
    lines = (line for line in log.read_text().splitlines() if line.startswith('{"dataset": '))
    return [json.loads(line) for line in lines]


def cell(dataset: str, algorithm: str, epsilon: float, rounds: int, eval_every: int, planned: dict[str, Any],
         done: list[dict[str, Any]]) -> dict[str, Any]:
    """The cell from ``done`` where one there ran with these settings; otherwise :func:`run_cell`."""
    budget = None if math.isinf(epsilon) else epsilon
    for c in done:
        if ((c["dataset"], c["algorithm"], c["epsilon"], c["rounds"], c.get("dp_epochs"), c.get("flags", []))
                == (dataset, algorithm, budget, rounds, planned.get("dp_epochs"), ALGORITHM_FLAGS.get(algorithm, []))):
            return {**c, "flags": ALGORITHM_FLAGS.get(algorithm, []), "resumed": True}
    return run_cell(dataset, algorithm, epsilon, rounds, eval_every, planned)


def _samples(result: dict[str, Any]) -> int:
    """Members compared per node by the attack (as many non-members)."""
    return min(n["membership_inference"]["samples"] for n in result["nodes"])


def markdown(cells: list[dict[str, Any]]) -> str:
    """The table: one row per dataset × algorithm × ε, and Abadi et al.'s centralised figures beside it."""
    lines = ["| dataset | algorithm | ε budget | σ | max ε spent | global acc | local acc | mean AUC | max AUC "
             "| TPR @ 1 % FPR | advantage |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        budget = "∞ (no DP)" if c["epsilon"] is None else f"{c['epsilon']:g}"
        sigma = "–" if c["epsilon"] is None else f"{c['noise_multiplier']:.2f}"
        spent = "–" if c["max_epsilon"] is None else f"{c['max_epsilon']:.2f}"
        lines.append(f"| {c['dataset']} ({c['rounds']} rounds) | {c['algorithm']} | {budget} | {sigma} | {spent} "
                     f"| {100 * c['global_accuracy']:.1f} % | {100 * c['local_accuracy']:.1f} % | {c['mean_auc']:.3f} "
                     f"| {c['max_auc']:.3f} | {c['mean_tpr_at_1pct_fpr']:.3f} | {c['mean_advantage']:+.3f} |")
    lines += ["", "Abadi et al. (CCS 2016), centralised DP-SGD on MNIST (PCA, 60,000 samples), δ = 1e-5:", "",
              "| ε | " + " | ".join(f"{e:g}" for e in ABADI) + " |", "|---|" + "---|" * len(ABADI),
              "| accuracy | " + " | ".join(f"{100 * a:.0f} %" for a in ABADI.values()) + " |"]
    return "\n".join(lines) + "\n"


def epsilon_arg(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("ε must be > 0 (inf: no differential privacy)")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--epsilons", nargs="+", type=epsilon_arg, default=list(EPSILONS), help="inf: no DP")
    parser.add_argument("--rounds", type=int, help="every dataset's rounds (default: --mnist-rounds, --digits-rounds)")
    parser.add_argument("--mnist-rounds", type=int, default=100)
    parser.add_argument("--digits-rounds", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2, help="children at once (each one torch thread)")
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    parser.add_argument("--resume", type=Path, help="reuse the matching cells of this log (an earlier run's stderr)")
    args = parser.parse_args()
    done = earlier(args.resume) if args.resume else []
    rounds = {d: args.rounds or getattr(args, f"{d}_rounds") for d in args.datasets}
    eval_every = {"mnist": 25, "digits": 20}
    cells: list[tuple[tuple[int, int, int], Callable[[], dict[str, Any]]]] = []
    for i, dataset in enumerate(args.datasets):
        config, samples = fleet(dataset, rounds[dataset])
        for j, algorithm in enumerate(args.algorithms):
            for k, epsilon in enumerate(args.epsilons):
                every = min(eval_every[dataset], rounds[dataset])
                cells.append(((i, j, k), lambda d=dataset, a=algorithm, e=epsilon, c=config, s=samples, v=every:
                              cell(d, a, e, rounds[d], v, {} if math.isinf(e) else plan(a, c, s, rounds[d], e), done)))
    # mnist first (the longest runs), defkt first among them; reported in table order, each also as a line on stderr
    order = sorted(cells, key=lambda c: DATASETS.index(args.datasets[c[0][0]]))

    def logged(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        cell = work()
        print(json.dumps(cell), file=sys.stderr, flush=True)
        return cell

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {key: pool.submit(logged, work) for key, work in order}
        results = [futures[key].result() for key, _ in cells]
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(results))
    print(json.dumps({"cells": results, "abadi_centralised_mnist": {f"{e:g}": a for e, a in ABADI.items()},
                      "delta": 1e-5}, indent=1))


if __name__ == "__main__":
    main()
