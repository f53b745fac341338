"""README's "Your data and your model", run as written: the plugin installed, the simulator on the smart meters,
four daemons on their CSV files until they are done, a prediction, the export, the application that reads it
without dfl-node, and the same meters forecasting. Only ``pip install`` is pointed at a throwaway folder, so that
the test installs nothing into the environment that runs it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Your data and your model"

pytestmark = pytest.mark.slow


def readme_blocks(section: str, language: str) -> list[str]:
    """The ``language`` code blocks of README's ``section`` (up to the next ``## `` heading), in order."""
    text = (ROOT / "README.md").read_text()
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", body, re.S)


def run(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``bash -e`` on ``script`` in a process group of its own, killed whole afterwards (daemons left running by
    a failed step included)."""
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, "")


def test_your_data_and_your_model_runs_as_written(tmp_path: Path) -> None:
    shell, python = readme_blocks(SECTION, "bash"), readme_blocks(SECTION, "python")
    assert len(shell) == 3 and len(python) == 1, "README's section changed shape: update this test"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    site = tmp_path / "site"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(site),
           "COLUMNS": "120", "PYTHONUNBUFFERED": "1"}
    # `pip install X` as written, into a folder on PYTHONPATH (an installation importlib.metadata reads), offline
    pip = (f'pip() {{ if [ "$1" = install ]; then shift; "{sys.executable}" -m pip install --quiet --no-deps '
           f'--no-build-isolation --no-index --target "{site}" "$@"; else "{sys.executable}" -m pip "$@"; fi; }}\n')

    first = run(pip + shell[0], tmp_path, env, timeout=240)
    assert first.returncode == 0, first.stdout
    assert re.search(r"meter-cnn\s+meter_models:meter_cnn", first.stdout), first.stdout  # dfl-node plugins
    accuracies = [float(a) for a in re.findall(r"│ (?:defkt|fullavg|combo)\s+│ simulate │\s+40 │\s+([0-9.]+) │",
                                               first.stdout)]
    assert len(accuracies) == 3 and max(accuracies) > 0.8, first.stdout  # chance is 0.5

    fleet = run(shell[1], tmp_path, env, timeout=300)
    assert fleet.returncode == 0, fleet.stdout + "".join(p.read_text() for p in tmp_path.glob("meter-*.log"))
    assert fleet.stdout.count(" done ") >= 4, fleet.stdout  # status --all --wait-done: every meter done
    predictions = (tmp_path / "predictions.txt").read_text().split("\n")[:-1]
    assert len(predictions) == 196 and all(re.fullmatch(r"[01] [01]\.\d{4}", p) for p in predictions)
    assert (tmp_path / "meter.onnx").stat().st_size > 0

    app = subprocess.run([sys.executable, "-c", python[0]], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=False)
    assert app.returncode == 0, app.stderr
    accuracy = float(app.stdout.split()[-1])
    assert accuracy > 0.8, app.stdout

    forecast = run(shell[2], tmp_path, env, timeout=240)
    assert forecast.returncode == 0 and "global rmse" in forecast.stdout.replace("\n", " "), forecast.stdout
    rmse = [float(r) for r in re.findall(r"│ (?:defkt|fullavg)\s+│ simulate │\s+300 │\s+([0-9.]+) │", forecast.stdout)]
    assert len(rmse) == 2 and max(rmse) < 0.25, forecast.stdout  # the days' last hours vary by ~1 (standardised)
