"""What a fleet of real daemons costs per round over the simulator: the same config through ``dfl-node simulate``
and then ``dfl-node testbed`` (4 nodes, round mode), for this tree and for an older tree, in one run.

Both drivers play the same rounds (same seed, plan, data and settings: their final parameters are compared,
and must be bit-identical), so the difference of their times per round is what the daemons add over the same
nodes in one process: transfers over gRPC and real time. A testbed round's time is measured between the first
and the last point after round 0 of the run's accuracy curve (start-up and discovery left out), as
``(wall_time_s[last] - wall_time_s[first]) / (round[last] - round[first])``. The simulator's curve is in virtual
seconds (it runs the same nodes on a virtual clock), so its round is timed by the clock around the
command instead: a run of the case's rounds less a run of half as many, start-up included in both.

Cases (the table's): digits Def-KT 200 rounds, digits FedAvg 100 rounds, MNIST MLP (784-200-200-10)
Def-KT 30 rounds (needs ``--data-dir``, the folder of the real datasets); every learning setting is given, so
both trees run the same config. ``--before`` (a commit; default: ``main`` where the table was first measured)
is checked out in a temporary ``git worktree`` and run through ``PYTHONPATH`` from outside the repository
(so that neither the working directory nor the editable install answers for ``dfl_node``); the trees take
turns case by case, so a noisy machine slows both alike. Prints one JSON object.

    python benchmarks/overhead.py [--data-dir ../shared/datasets] [--cases digits-defkt,…] [--before COMMIT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUE_21_MAIN = "d8998e2"  # where the table was first measured
DIGITS = ["--dataset", "digits", "--batch-size", "20", "--mkt-batch-size", "20", "--lr", "0.05", "--eval-every", "10"]
CASES: dict[str, list[str]] = {
    "digits-defkt": [*DIGITS, "--algorithm", "defkt", "--rounds", "200"],
    "digits-fedavg": [*DIGITS, "--algorithm", "fedavg", "--rounds", "100"],
    "mnist-defkt": ["--dataset", "mnist", "--model", "mlp", "--hidden", "200", "--hidden", "200",
                    "--batch-size", "200", "--mkt-batch-size", "200", "--lr", "0.01",
                    "--algorithm", "defkt", "--rounds", "30", "--eval-every", "10"],
}
COMMON = ["--nodes", "4", "--seed", "0"]


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary git worktree, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="dfl-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), commit], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def run(tree: Path, driver: str, flags: list[str], out: Path, env: dict[str, str]) -> tuple[dict, float]:
    """One run of ``dfl-node DRIVER`` of ``tree``, as a user runs it: its result (``OUT/<algorithm>.json``) and the
    seconds it took. It runs in ``out``'s parent, so that ``python -m`` finds ``dfl_node`` on ``PYTHONPATH`` only
    (its daemons too)."""
    command = [sys.executable, "-m", "dfl_node", driver, *COMMON, *flags, "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, env={**env, "PYTHONPATH": str(tree)}, cwd=out.parent, capture_output=True,
                          text=True, timeout=3600)
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} ({tree}) failed ({done.returncode}):\n{done.stderr[-2000:]}")
    (result,) = out.glob("*.json")
    return json.loads(result.read_text()), elapsed


def with_rounds(flags: list[str], rounds: int) -> list[str]:
    at = flags.index("--rounds") + 1
    return [*flags[:at], str(rounds), *flags[at + 1:]]


def per_round_ms(result: dict) -> float:
    """Between the curve's first point after round 0 (a fleet's round-0 point is its nodes' ``w0``, before
    discovery) and its last."""
    first = next(h for h in result["history"] if h["round"] > 0)
    last = result["history"][-1]
    return 1000 * (last["wall_time_s"] - first["wall_time_s"]) / (last["round"] - first["round"])


def measure(tree: Path, name: str, work: Path, env: dict[str, str]) -> dict:
    flags = CASES[name]
    rounds = int(flags[flags.index("--rounds") + 1])
    simulated, elapsed = run(tree, "simulate", [*flags, "--threads", "1"], work / f"{name}-simulate", env)
    _, elapsed_half = run(tree, "simulate", [*with_rounds(flags, rounds // 2), "--threads", "1"],
                          work / f"{name}-simulate-half", env)
    testbed, _ = run(tree, "testbed", flags, work / f"{name}-testbed", env)
    sim_ms, bed_ms = 1000 * (elapsed - elapsed_half) / (rounds - rounds // 2), per_round_ms(testbed)
    params = {driver: {n["id"]: n["param_sha256"] for n in result["nodes"]}
              for driver, result in (("simulate", simulated), ("testbed", testbed))}
    return {"rounds": testbed["rounds"], "simulate_ms_per_round": round(sim_ms, 1),
            "testbed_ms_per_round": round(bed_ms, 1), "fixed_cost_ms_per_round": round(bed_ms - sim_ms, 1),
            "testbed_over_simulate": round(bed_ms / sim_ms, 2),
            "bit_identical": params["simulate"] == params["testbed"],
            "local_accuracy": round(testbed["local_accuracy"], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("DFL_DATA_DIR", ""),
                        help="the real datasets' folder (for mnist-defkt)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--before", default=ISSUE_21_MAIN, help="the commit to compare with ('' : none)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    env["DFL_THREADS"] = "1"
    if args.data_dir:
        env["DFL_DATA_DIR"] = str(Path(args.data_dir).resolve())
    report: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        trees = {"after": ROOT}
        if args.before:
            trees["before"] = stack.enter_context(worktree(args.before))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dfl-overhead-")))
        for name in args.cases.split(","):
            for label, tree in trees.items():
                (work / label).mkdir(exist_ok=True)
                report.setdefault(name, {})[label] = measure(tree, name, work / label, env)
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                      "before": args.before or None, "cases": report}, indent=1))


if __name__ == "__main__":
    main()
