"""What a fleet of real daemons costs per round over the simulator: the same config through ``dfl-node simulate``
and then ``dfl-node testbed`` (4 nodes, round mode), in one run.

Both drivers play the same rounds (same seed, plan and data: their final parameters are compared, and must be
bit-identical), so the difference of their times per round is what the daemons add: the token's hand-over and
assignments, transfers over gRPC, evaluations and checkpoints. A round's time is measured between the first and
the last point of the run's accuracy curve (start-up and discovery left out), as
``(wall_time_s[last] - wall_time_s[first]) / (round[last] - round[first])``.

Cases (issue 21's table): digits Def-KT 200 rounds, digits FedAvg 100 rounds, MNIST MLP (784-200-200-10)
Def-KT 30 rounds (needs ``--data-dir``, the folder of the real datasets). Prints one JSON object.

    python benchmarks/overhead.py [--data-dir ../shared/datasets] [--cases digits-defkt,digits-fedavg,mnist-defkt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

CASES: dict[str, list[str]] = {
    "digits-defkt": ["--dataset", "digits", "--algorithm", "defkt", "--rounds", "200"],
    "digits-fedavg": ["--dataset", "digits", "--algorithm", "fedavg", "--rounds", "100"],
    "mnist-defkt": ["--dataset", "mnist", "--model", "mlp", "--hidden", "200", "--hidden", "200",
                    "--algorithm", "defkt", "--rounds", "30", "--eval-every", "10"],
}
COMMON = ["--nodes", "4", "--seed", "0"]


def run(driver: str, flags: list[str], out: Path, env: dict[str, str]) -> dict:
    """One run of ``dfl-node DRIVER``, as a user runs it; its result (``OUT/<algorithm>.json``)."""
    command = [sys.executable, "-m", "dfl_node", driver, *COMMON, *flags, "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    (result,) = out.glob("*.json")
    return json.loads(result.read_text())


def per_round_ms(result: dict) -> float:
    first, last = result["history"][0], result["history"][-1]
    return 1000 * (last["wall_time_s"] - first["wall_time_s"]) / (last["round"] - first["round"])


def measure(name: str, flags: list[str], work: Path, env: dict[str, str]) -> dict:
    simulated = run("simulate", [*flags, "--threads", "1"], work / f"{name}-simulate", env)
    testbed = run("testbed", flags, work / f"{name}-testbed", env)
    sim_ms, bed_ms = per_round_ms(simulated), per_round_ms(testbed)
    params = {driver: {n["id"]: n["param_sha256"] for n in result["nodes"]}
              for driver, result in (("simulate", simulated), ("testbed", testbed))}
    return {"rounds": testbed["rounds"], "simulate_ms_per_round": round(sim_ms, 1),
            "testbed_ms_per_round": round(bed_ms, 1), "fixed_cost_ms_per_round": round(bed_ms - sim_ms, 1),
            "testbed_over_simulate": round(bed_ms / sim_ms, 2),
            "bit_identical": params["simulate"] == params["testbed"],
            "local_accuracy": {"simulate": round(simulated["local_accuracy"], 4),
                               "testbed": round(testbed["local_accuracy"], 4)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("DFL_DATA_DIR", ""),
                        help="the real datasets' folder (for mnist-defkt)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    args = parser.parse_args()
    env = {**os.environ, "DFL_THREADS": "1"}
    if args.data_dir:
        env["DFL_DATA_DIR"] = str(Path(args.data_dir).resolve())
    with tempfile.TemporaryDirectory(prefix="dfl-overhead-") as tmp:
        cases = {name: measure(name, CASES[name], Path(tmp), env) for name in args.cases.split(",")}
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "cases": cases},
                     indent=1))


if __name__ == "__main__":
    main()
