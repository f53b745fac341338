"""`dfl-node sweep`: grid expansion, a real sweep on the process pool and on a local Ray instance,
re-runs that skip finished runs, and Ctrl-C that leaves only whole result files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfl_node.cli import cli
from dfl_node.settings.loading import ConfigError
from dfl_node.sweep import expand, run_sweep
from dfl_node.sweep.driver import PLOTS_DIR, SUMMARY_FILE

ROOT = Path(__file__).resolve().parents[1]

# 2 grid points × 2 seeds × 2 algorithms = 8 short runs on the embedded digits data.
SMALL_GRID = """
settings:
  nodes: 4
  rounds: {rounds}
  eval_every: 5
  batch_size: 20
  mkt_batch_size: 20
  hidden: [32, 32]
  algorithms: [defkt, fullavg]
grid:
  lr: [0.05, 0.1]
seeds: [0, 1]
"""


def write_grid(folder: Path, rounds: int = 10) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "grid.yaml"
    path.write_text(SMALL_GRID.format(rounds=rounds))
    return path


def result_files(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def test_grid_expansion_product_seeds_algorithms_and_stable_names(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "base.yaml").write_text("nodes: 6\nrounds: 50\nlr: 0.3\nalgorithms: [defkt, fullavg, combo]\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: exp/base.yaml\nsettings: {rounds: 7, data_dir: data, algorithms: [defkt, combo]}\n"
                    "grid: {partition: [iid, shards], lr: [0.01, 0.05, 0.1]}\nseeds: [3, 4]\n")
    tasks = expand(grid)
    assert len(tasks) == 2 * 3 * 2 * 2  # partitions × lrs × seeds × algorithms
    names = [t.name for t in tasks]
    assert len(set(names)) == len(names)
    assert "lr=0.05,partition=shards__combo__seed4" in names
    one = next(t for t in tasks if t.name == "lr=0.05,partition=shards__combo__seed4")
    config = one.experiment()
    learning, shards = config.learning, config.shards
    assert (config.nodes, config.rounds, learning.lr, shards.partition, learning.seed) == (6, 7, 0.05, "shards", 4)
    assert config.algorithms == ["combo"] and learning.threads == 1
    assert shards.data_dir == tmp_path / "data"  # relative to the grid file's folder

    grid.write_text("seeds: [3, 4]\ngrid: {lr: [0.01, 0.05, 0.1], partition: [iid, shards]}\n"
                    "settings: {rounds: 7, data_dir: data, algorithms: [defkt, combo]}\nbase: exp/base.yaml\n")
    assert sorted(t.name for t in expand(grid)) == sorted(names)  # the file's key order does not matter


def test_grid_without_grid_or_seeds_is_one_point(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("settings: {seed: 5, algorithms: [fullavg]}\n")
    assert [t.name for t in expand(grid)] == ["base__fullavg__seed5"]


@pytest.mark.parametrize(("text", "problem"), [
    ("grid: {lr: [0.1, -1]}\n", "lr = -1 (in {path} grid): must be > 0"),
    ("grid: {lr: 0.1}\n", "grid: lr (in {path}): must be a list (got 0.1)"),
    ("grid: {algorithms: [[defkt]]}\n", "put algorithms in settings"),
    ("seeds: [1]\nsettings: {seed: 2}\n", "not both"),
    ("sweeps: {lr: [0.1]}\n", "sweeps (in {path}): unknown setting"),
    ("settings: {rounds: 0}\n", "rounds (in {path} settings): must be ≥ 1"),
])
def test_grid_errors_name_the_key_as_written(tmp_path: Path, text: str, problem: str) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    with pytest.raises(ConfigError) as caught:
        expand(grid)
    assert problem.format(path=grid) in str(caught.value)


@pytest.fixture(scope="module")
def pool_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small grid, run once on the process pool; tests below read its output."""
    folder = tmp_path_factory.mktemp("pool")
    outcome = run_sweep(write_grid(folder), folder / "out", workers=2, echo=lambda line: None)
    assert not outcome.interrupted and not outcome.failed
    assert len(outcome.ran) == 8 and not outcome.skipped
    return folder


def test_pool_sweep_writes_results_summary_and_plots(pool_sweep: Path) -> None:
    out = pool_sweep / "out"
    results = result_files(out)
    expected = {f"lr={lr}__{a}__seed{s}" for lr in (0.05, 0.1) for a in ("defkt", "fullavg") for s in (0, 1)}
    assert set(results) == expected
    run = results["lr=0.1__defkt__seed1"]
    assert run["config"]["lr"] == 0.1 and run["config"]["seed"] == 1 and run["algorithm"] == "defkt"
    assert [h["round"] for h in run["history"]] == [0, 5, 10]
    assert run["sweep"] == {"name": "lr=0.1__defkt__seed1", "point": {"lr": 0.1}, "algorithm": "defkt", "seed": 1}
    rows = (out / SUMMARY_FILE).read_text().splitlines()
    assert rows[0].startswith("lr,algorithm,seeds,rounds,global_accuracy_mean,global_accuracy_std")
    assert len(rows) == 1 + 4 and all(",2,10," in row for row in rows[1:])  # 2 points × 2 algorithms, 2 seeds each
    mean = next(r for r in rows if r.startswith("0.1,defkt")).split(",")[4]
    seeds = [results[f"lr=0.1__defkt__seed{s}"]["global_accuracy"] for s in (0, 1)]
    assert float(mean) == pytest.approx(sum(seeds) / 2, abs=1e-6)
    plots = sorted(p.name for p in (out / PLOTS_DIR).glob("*.png"))
    assert plots == ["lr=0.05.png", "lr=0.1.png"]
    assert all((out / PLOTS_DIR / p).stat().st_size > 10_000 for p in plots)


def test_rerun_skips_every_finished_run(pool_sweep: Path) -> None:
    out = pool_sweep / "out"
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    outcome = run_sweep(pool_sweep / "grid.yaml", out, workers=2, echo=lambda line: None)
    assert outcome.ran == [] and len(outcome.skipped) == 8
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")} == before  # nothing rewritten
    assert len(outcome.rows) == 4


def _sweep_command(grid: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "dfl_node", "sweep", str(grid), "--out", str(out), "--workers", "1"]


def test_ctrl_c_keeps_finished_runs_whole_and_a_rerun_finishes_the_rest(tmp_path: Path) -> None:
    grid, out = write_grid(tmp_path), tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Ctrl-C as at a terminal: SIGINT at its default, whatever this process inherited (a shell's background job,
    # or `sh -c … &`, starts with SIGINT ignored, and Python then leaves it ignored: the sweep would run on)
    proc = subprocess.Popen(_sweep_command(grid, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()  # blocks until the first run has been written
        assert first.startswith("[1/8] done"), first + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command again" in err
    done = result_files(out)  # every file left parses: nothing half-written
    assert 1 <= len(done) < 8
    assert all(r["rounds"] == 10 and len(r["nodes"]) == 4 for r in done.values())
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left

    rerun = subprocess.run(_sweep_command(grid, out), capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
                           check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(done)} of 8 runs already done" in rerun.stdout
    assert rerun.stdout.count(" done lr=") == 8 - len(done)  # only the missing runs ran
    assert len(result_files(out)) == 8 and (out / SUMMARY_FILE).is_file()
    assert all(result_files(out)[name] == run for name, run in done.items())  # finished runs untouched


def test_ray_sweep_equals_the_pool(pool_sweep: Path, tmp_path: Path) -> None:
    """A private local Ray instance (loopback only, 2 CPUs, no dashboard) runs the same grid; the
    simulator is deterministic per seed, so every run ends with the pool's accuracies and models."""
    ray = pytest.importorskip("ray")
    outcome = run_sweep(pool_sweep / "grid.yaml", tmp_path / "ray", workers=2, ray="local", echo=lambda line: None)
    assert not ray.is_initialized()  # the instance the sweep started is gone
    assert len(outcome.ran) == 8 and not outcome.failed
    pool, on_ray = result_files(pool_sweep / "out"), result_files(tmp_path / "ray")
    assert set(on_ray) == set(pool)
    for name, run in on_ray.items():
        assert run["global_accuracy"] == pool[name]["global_accuracy"], name
        assert run["local_accuracy"] == pool[name]["local_accuracy"], name
        assert [n["param_sha256"] for n in run["nodes"]] == [n["param_sha256"] for n in pool[name]["nodes"]], name


def test_streams_sweep_equals_the_pool(pool_sweep: Path, tmp_path: Path) -> None:
    """``--per-device 3 --streams``: the runs as three threads of this process (on the CPU, no streams) end bit for
    bit as the pool's, virtual time and curves included: each thread is charged only its own work, and builds its
    models from its own seed while the others build theirs."""
    result = CliRunner().invoke(cli, ["sweep", str(pool_sweep / "grid.yaml"), "--out", str(tmp_path / "threads"),
                                      "--per-device", "3", "--streams"])
    assert result.exit_code == 0, result.output
    pool, threads = result_files(pool_sweep / "out"), result_files(tmp_path / "threads")
    assert set(threads) == set(pool)
    for name, run in threads.items():
        assert [n["param_sha256"] for n in run["nodes"]] == [n["param_sha256"] for n in pool[name]["nodes"]], name
        assert run["history"] == pool[name]["history"] and run["wall_time_s"] == pool[name]["wall_time_s"], name


def test_streams_and_ray_are_one_choice(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["sweep", str(write_grid(tmp_path)), "--streams", "--ray", "local"])
    assert result.exit_code == 2 and "choose one" in result.output


def test_a_failing_run_is_reported_and_not_taken_for_done(tmp_path: Path) -> None:
    """A run that fails in its worker (here: no MNIST files where the grid says) writes no result file,
    is named with its error, and is tried again by the next sweep."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("settings: {dataset: mnist, data_dir: nowhere, algorithms: [fullavg]}\nseeds: [0, 1]\n")
    outcome = run_sweep(grid, tmp_path / "out", workers=2, echo=lambda line: None)
    assert sorted(outcome.failed) == ["base__fullavg__seed0", "base__fullavg__seed1"]
    assert all("DatasetNotFoundError" in error for error in outcome.failed.values())
    assert outcome.ran == [] and outcome.skipped == [] and outcome.rows == []
    assert result_files(tmp_path / "out") == {}
    again = CliRunner().invoke(cli, ["sweep", str(grid), "--out", str(tmp_path / "out"), "--workers", "2"])
    assert again.exit_code == 1
    assert again.output.count("FAILED base__fullavg__seed") == 2  # both tried again
    assert "error: 2 runs failed: base__fullavg__seed0, base__fullavg__seed1" in again.output


def test_ray_missing_is_one_line_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    grid = write_grid(tmp_path)
    result = CliRunner().invoke(cli, ["sweep", str(grid), "--out", str(tmp_path / "out"), "--ray", "auto"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: --ray needs Ray, which is not installed: pip install -e '.[ray]'"
    assert not (tmp_path / "out").exists()  # checked before anything ran


def test_bad_grid_is_a_usage_error(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid: {nodes: [1]}\n")
    result = CliRunner().invoke(cli, ["sweep", str(grid), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and f"nodes = 1 (in {grid} grid): must be ≥ 2" in result.output
