"""benchmarks/privacy_table.py's tiny version: digits, FullAvg, ε ∈ {3, ∞}, 4 rounds. The figures themselves are not
asserted (4 rounds learn nothing); what is: every cell has the table's fields, the DP run's busiest node spent its
budget and no more (σ is planned from the run's own schedule: docs/privacy.md), the run without DP reports no ε,
and the markdown table renders both rows beside Abadi et al.'s figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # two `dfl-node simulate` children

FIELDS = {"dataset", "algorithm", "epsilon", "flags", "max_epsilon", "min_epsilon", "global_accuracy", "local_accuracy",
          "mean_auc", "max_auc", "mean_tpr_at_1pct_fpr", "mean_advantage", "audit_samples", "rounds", "wall_s",
          "cpu_s"}
PLANNED = {"dp_epochs", "noise_multiplier", "planned_max_epsilon"}


def test_the_tiny_table(tmp_path: Path) -> None:
    table = tmp_path / "table.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "privacy_table.py"), "--datasets", "digits",
                          "--algorithms", "fullavg", "--epsilons", "3", "inf", "--rounds", "4", "--markdown",
                          str(table)], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    private, plain = report["cells"]
    assert set(private) == FIELDS | PLANNED and set(plain) == FIELDS
    assert (private["epsilon"], plain["epsilon"]) == (3.0, None)
    for cell in (private, plain):
        assert (cell["dataset"], cell["algorithm"], cell["rounds"]) == ("digits", "fullavg", 4)
        assert 0 <= cell["global_accuracy"] <= 1 and 0 <= cell["local_accuracy"] <= 1
        assert 0 <= cell["mean_auc"] <= cell["max_auc"] <= 1 and 0 <= cell["mean_tpr_at_1pct_fpr"] <= 1
        assert cell["audit_samples"] > 0 and cell["cpu_s"] > 0
    # the budget is kept, and the plan spends it: the busiest node ends at the ε planned for it, within the budget
    assert 0 <= private["min_epsilon"] <= private["max_epsilon"] <= 3.0 + 1e-9
    assert private["max_epsilon"] == pytest.approx(private["planned_max_epsilon"], abs=1e-3)
    assert private["max_epsilon"] > 2.9  # the plan is to the 0.01 of a pass: the budget is (nearly) all spent
    assert private["noise_multiplier"] > 0 and private["dp_epochs"] > 0
    assert plain["max_epsilon"] is None and plain["min_epsilon"] is None
    assert report["abadi_centralised_mnist"] == {"0.5": 0.9, "2": 0.95, "8": 0.97}

    rows = table.read_text().splitlines()
    assert rows[0].startswith("| dataset | algorithm | ε budget | σ | max ε spent | global acc")
    assert rows[2].startswith("| digits (4 rounds) | fullavg | 3 | ") and f"| {private['max_epsilon']:.2f} |" in rows[2]
    assert rows[3].startswith("| digits (4 rounds) | fullavg | ∞ (no DP) | – | – | ")
    assert "| accuracy | 90 % | 95 % | 97 % |" in rows
