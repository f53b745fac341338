"""Forecasting with a fleet of meters: the last hours of each day from its first, a Def-KT fleet beside
each meter alone and all meters' data in one place.

The four meters of ``examples/smart-meters/data`` (real demand, ItalyPowerDemand: see its README), each a node
(``--partition as-recorded``), learn ``--task regression`` with the targets ``h20``–``h23`` (the day's last four
hours, standardised) from its first twenty hours and its season. Three ways, the same model (an MLP), seed, batch
size and learning rate, and the same SGD passes for each device:

* **fleet**: ``dfl-node simulate`` (the daemon's own nodes) running Def-KT for ``--rounds`` rounds;
* **alone**: each meter trains on its own days only, ``--rounds`` passes (a node takes part in about half the
  rounds as a sender, which trains, and half as a receiver, whose MKT trains both models: a pass each);
* **centralised**: the four meters' training days pooled, ``--rounds / 4`` passes (as many SGD steps as each device
  alone).

Each is judged on each meter's own held-out days (its validation split: 20 % of its days, held back by the node's
own rule) by RMSE. Prints one JSON object; ``targets`` checks the goal (the fleet below every meter alone,
within ``--margin`` of centralised).

    python benchmarks/forecast.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from dfl_node.learning.alone import trained_alone
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.provision import provision
from dfl_node.learning.tasks import task_of
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim.experiment import run_fleet

DATA = Path(__file__).resolve().parents[1] / "examples" / "smart-meters" / "data"
TARGETS = ["h20", "h21", "h22", "h23"]


def config(rounds: int, hidden: list[int]) -> ExperimentConfig:
    """The example's fleet, as README's command gives it."""
    return ExperimentConfig.model_validate({
        "dataset": str(DATA), "partition": "as-recorded", "task": "regression", "target_column": TARGETS,
        "rounds": rounds, "eval_every": rounds, "hidden": hidden, "lr": 0.05})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--hidden", default="32", help="the MLP's widths, comma-separated")
    parser.add_argument("--margin", type=float, default=0.05, help="the fleet's RMSE over centralised's, at most")
    args = parser.parse_args()
    torch.set_num_threads(1)
    experiment = config(args.rounds, [int(w) for w in args.hidden.split(",")])
    with tempfile.TemporaryDirectory(prefix="dfl-forecast-") as work:
        result = run_fleet(experiment, "defkt", Path(work))
    fleet = {n.id: n.local_accuracy for n in result.nodes}  # a node's "local" figure: its task's, on its own days
    data, task = provision(experiment), task_of(experiment.learning)
    pooled = ArrayDataset(torch.cat([c.train.x for c in data.clients]), torch.cat([c.train.y for c in data.clients]),
                          len(TARGETS))
    central = trained_alone(experiment.learning, pooled, max(args.rounds // len(data.clients), 1))
    meters = {}
    for client in data.clients:
        alone = trained_alone(experiment.learning, client.train, args.rounds)
        meters[client.node_id] = {"train_days": len(client.train), "held_out_days": len(client.val),
                                  "fleet_rmse": round(fleet[client.node_id], 4),
                                  "alone_rmse": round(task.evaluate(alone, client.val).score, 4),
                                  "centralised_rmse": round(task.evaluate(central, client.val).score, 4)}
    gaps = [m["fleet_rmse"] / m["centralised_rmse"] - 1 for m in meters.values()]
    report = {"benchmark": "forecast", "rounds": args.rounds, "model": f"mlp:{args.hidden}",
              "batch_size": experiment.learning.batch_size, "lr": experiment.learning.lr, "meters": meters,
              "fleet_over_centralised_max": round(max(gaps), 4),
              "targets": {"fleet below alone on every meter": all(m["fleet_rmse"] < m["alone_rmse"]
                                                                  for m in meters.values()),
                          f"fleet within {args.margin:.0%} of centralised": max(gaps) <= args.margin}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
