"""Fleets of the tasks besides classes, on the real meters of ``examples/smart-meters`` recorded as they
were (``--partition as-recorded``): daemons learn bit for bit what the simulator's nodes learn, for forecasting and
for anomaly detection; and an anomaly fleet flags injected anomalies better than each meter alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dfl_node.learning.alone import trained_alone
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.learning.tasks import task_of
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.testbed.launcher import all_done, wait_until
from tests.helpers.fleet import loopback_fleet, simulated

METERS = Path(__file__).resolve().parents[1] / "examples" / "smart-meters" / "data"
HOURS = [f"h{h:02d}" for h in range(24)]


def seasonal_meters_with_incidents(out: Path) -> Path:
    """The four meters, as if two were installed in winter and two in summer (each keeps its days of one season:
    a device alone knows half of what normal is), a column ``anomaly`` (0: every day it recorded is normal), and a
    held-out stream (``test.csv``): the test days of both seasons, normal, and 60 of them made anomalous — a spike in
    one hour, the meter stuck from some hour on, or the day's profile shifted by eight hours (seeded)."""
    out.mkdir(parents=True, exist_ok=True)
    header = ",".join([*HOURS, "anomaly"])

    def days(name: str) -> np.ndarray:
        return np.loadtxt(METERS / name, delimiter=",", skiprows=1, dtype=np.float32)  # h00…h23, label (season)

    def write(name: str, hours: np.ndarray, flags: np.ndarray) -> None:
        np.savetxt(out / name, np.c_[hours, flags], delimiter=",", header=header, comments="", fmt="%.6g")

    for i in range(4):
        recorded = days(f"meter-{i}.csv")
        season = recorded[recorded[:, 24] == i // 2, :24]
        write(f"meter-{i}.csv", season, np.zeros(len(season)))
    stream = days("test.csv")[:, :24]
    rng = np.random.default_rng(0)
    odd = stream[:60].copy()
    for day, kind in zip(odd, rng.integers(0, 3, len(odd)), strict=True):
        if kind == 0:
            day[rng.integers(0, 24)] += 3.0
        elif kind == 1:
            day[rng.integers(0, 12):] = day[0]
        else:
            day[:] = np.roll(day, 8)
    write("test.csv", np.r_[stream, odd], np.r_[np.zeros(len(stream)), np.ones(len(odd))])
    return out


def forecasting(rounds: int) -> ExperimentConfig:
    """README's forecasting fleet: the day's last four hours from its first twenty (and its season)."""
    return ExperimentConfig.model_validate({
        "dataset": str(METERS), "partition": "as-recorded", "task": "regression", "target_column": HOURS[20:],
        "rounds": rounds, "eval_every": rounds, "hidden": [16], "seed": 3})


def anomaly_detection(data: Path, rounds: int) -> ExperimentConfig:
    return ExperimentConfig.model_validate({
        "dataset": str(data), "partition": "as-recorded", "task": "anomaly", "label_column": "anomaly",
        "rounds": rounds, "eval_every": rounds, "hidden": [4], "seed": 3})


@pytest.mark.parametrize("task", ["regression", "anomaly"])
def test_testbed_equals_simulator_for_tasks_without_classes(tmp_path: Path, task: str) -> None:
    config = (forecasting(10) if task == "regression"
              else anomaly_detection(seasonal_meters_with_incidents(tmp_path / "data"), 10))
    shards, work = tmp_path / "shards", tmp_path / "fleet"
    write_fleet(provision(config), shards)
    work.mkdir()
    with loopback_fleet(shards, work, "defkt", config=config, mdns=False, static_peers=True) as nodes:
        statuses = wait_until(nodes, all_done, timeout=180)
    result, models = simulated(config, "defkt", tmp_path / "sim")
    expected, metric = {n.id: n for n in result.nodes}, task_of(config.learning).metric
    assert result.metric == metric
    for node in nodes:
        mine, theirs = load_file(str(node.state_dir / "model.safetensors")), models[node.id]
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), node.id
        status = statuses[node.id]
        assert (status["task"], status["metric"]) == (task, metric)
        for field in ("global_accuracy", "local_accuracy", "models_sent"):
            assert status[field] == getattr(expected[node.id], field), (node.id, field)
    assert sum(s["models_sent"] for s in statuses.values()) == 10  # Def-KT: one model a round


def test_a_fleet_flags_injected_anomalies_better_than_each_meter_alone(tmp_path: Path) -> None:
    """The held-out stream's ROC AUC, each meter's model: in the Def-KT fleet (100 rounds) 0.978–0.980; alone
    (its own season's days, 100 passes: as many as a fleet's node made) 0.952–0.964."""
    config = anomaly_detection(seasonal_meters_with_incidents(tmp_path / "data"), 100)
    result, _ = simulated(config, "defkt", tmp_path / "sim")
    data = provision(config)
    task = task_of(config.learning)
    fleet = {n.id: n.global_accuracy for n in result.nodes}
    alone = {c.node_id: task.evaluate(trained_alone(config.learning, c.train, 100), data.test).score
             for c in data.clients}
    assert min(fleet.values()) > max(alone.values()), (fleet, alone)  # every meter's fleet model beats all alone
    assert min(fleet.values()) > 0.97, fleet
    assert result.nodes[0].local_accuracy == 0.5  # a meter's own days hold no incident: nothing to rank there


@pytest.mark.parametrize("algorithm", ["dfml", "fairavg"])
def test_mutual_learning_and_fair_weights_carry_over_to_a_forecast(tmp_path: Path, algorithm: str) -> None:
    """003's weighted mutual learning distils with the task's distance (MSE) in place of KL, and 002's weights
    read the task's performance (1 / (1 + MSE)) in place of accuracy: both fleets forecast far better than w0."""
    result, _ = simulated(forecasting(30), algorithm, tmp_path / "sim")
    start, end = result.history[0], result.history[-1]
    assert (start.round, end.round) == (0, 30) and result.metric == "rmse"
    assert end.global_accuracy < start.global_accuracy / 3, (start.global_accuracy, end.global_accuracy)
