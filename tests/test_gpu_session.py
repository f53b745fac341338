"""The GPU session without a GPU: several runs at once give the bits of one after another, and the prepared device
session (``benchmarks/gpu_session.sh``, which runs ``benchmarks/gpu_speed.py``) goes through every step on the CPU at
tiny sizes — the machine check, the quick sections, the choice, the full run under its limit, the plot and the
archive — so that the one GPU session finds no bug these can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def simulate(out: Path, *flags: str) -> dict[str, dict]:
    command = [sys.executable, "-m", "dfl_node", "simulate", "--nodes", "6", "--rounds", "12", "--eval-every", "4",
               "--hidden", "32", "--hidden", "32", "--out", str(out), *flags]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "defkt: 12/12 rounds (" in done.stderr  # stderr is a pipe: a line per tenth, not a bar
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_algorithms_at_once_end_as_one_after_another(tmp_path: Path) -> None:
    """``simulate --per-device 3`` as pool processes and as threads (``--streams``): every node's parameters, the
    curves and the virtual time are those of the three runs in turn. A piped stderr gets progress lines."""
    alone = simulate(tmp_path / "alone")
    processes = simulate(tmp_path / "processes", "--per-device", "3")
    threads = simulate(tmp_path / "threads", "--per-device", "3", "--streams")
    assert set(alone) == {"defkt", "fullavg", "combo"}
    for runs in (processes, threads):
        assert set(runs) == set(alone)
        for algorithm, run in runs.items():
            before = alone[algorithm]
            assert [n["param_sha256"] for n in run["nodes"]] == [n["param_sha256"] for n in before["nodes"]]
            assert run["history"] == before["history"] and run["wall_time_s"] == before["wall_time_s"]


def test_the_device_session_runs_every_step_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "DFL_GPU_SMOKE": "1", "DFL_GPU_QUICK_ROUNDS": "3",
           "DFL_GPU_WHEELS": str(tmp_path / "no-wheels"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # python3: this one
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["fmnist_cnn_zeta4.png", "gpu.jsonl", "log.txt", "results.tar.gz"]
    records = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines()]
    assert not [r for r in records if "error" in r]
    by = {section: [r for r in records if r["section"] == section] for section in {r["section"] for r in records}}
    assert {"env", "step", "graphs_equal_eager", "overhead", "rounds", "accuracy", "concurrent", "precision",
            "choice", "full"} <= set(by)
    assert {(r["path"], r["precision"]) for r in by["step"]} == {(p, q) for p in ("eager", "graphs")
                                                                 for q in ("fp32", "bf16")}
    assert all(r["local_ms_per_step"] > 0 and r["mkt_ms_per_step"] > 0 for r in by["step"])
    assert by["graphs_equal_eager"][0]["bit_identical"]
    assert [r["model"] for r in by["overhead"]] == ["mlp:8", "cnn, 1-step shards"]
    assert len(by["rounds"]) == 6 and {r["algorithm"] for r in by["accuracy"]} == {"defkt", "fullavg", "combo"}
    assert all(r["within"] and r["bit_identical_nodes"] == "10/10" for r in by["accuracy"])  # the CPU: exact
    assert {r["runs"] for r in by["concurrent"]} == {"processes", "streams"}
    assert all(r["within"] and r["max_delta_vs_alone"] == 0 for r in by["concurrent"])  # at once = alone
    assert {r["precision"] for r in by["precision"]} == {"tf32", "bf16"}
    [end] = [r for r in by["full"] if r["event"] == "end"]
    assert end["completed"] and set(end["results"]) == {"defkt", "fullavg", "combo"}
    assert any(r["event"] == "progress" and "rounds (" in r["line"] for r in by["full"])
    with tarfile.open(out / "results.tar.gz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    assert {f"{a}.{ext}" for a in ("defkt", "fullavg", "combo") for ext in ("json", "csv")} <= names
    log = (out / "log.txt").read_text()
    assert "== the full experiment" in log and "done:" in log
