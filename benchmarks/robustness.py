"""The robustness table: what compromised members cost the honest ones, without and with the defences.

By default the issue's table: six algorithms (Def-KT, FullAvg, Combo, FedAvg, fairness-aware pulls, DFML) on 10
simulated nodes of the embedded digits, ζ = 4 shards, 100 rounds; each attack of ``dfl-node simulate
--adversaries`` at 10, 20 and 30 % of the nodes, once without defences and once with its algorithm family's
(:data:`DEFENCES`), beside the attack-free run of both; one seed; and a smaller study of knowledge transfer's
relative gate (:data:`GATE`). ``--algorithms``, ``--attacks``, ``--fractions`` and ``--rounds`` run a part of it. The
runs go to a process pool as a sweep's do; each run's result file is kept in ``--out``, so a second call runs only
what is missing; then the table is written to ``--docs``: ``robustness.md`` and the ``.json``/``.csv`` it is made
from.

    python benchmarks/robustness.py --out runs/robustness --workers 2     # the issue's table: hours on 2 cores
    python benchmarks/robustness.py --algorithms defkt fullavg --attacks sign-flip false-count --fractions 0.2 \
        --rounds 40 --no-gate --out runs/robustness-small --docs runs/robustness-small   # docs/robustness.md's

Prints one JSON object: runs done, seconds, and per algorithm whether the goal held (20 % sign-flip or false-count
adversaries: honest global accuracy with the defences within 3 points of the attack-free run's), where it ran.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sweep.execute import Outcome
from dfl_node.sweep.grid import RunTask
from dfl_node.sweep.pool import run_pool
from dfl_node.sweep.store import read_result, result_path, write_atomic

BASE: dict[str, Any] = {"name": "robustness", "dataset": "digits", "partition": "shards", "zeta": 4, "nodes": 10,
                        "rounds": 100, "eval_every": 50, "seed": 0, "threads": 1,
                        "pairs": 5,  # pair algorithms: every node in a pair each round, so 100 rounds learn
                        "dfml_epochs": 2}  # 003's K = 10 passes would take 5× DFML's time
ALGORITHMS = ("defkt", "fullavg", "combo", "fedavg", "fairavg", "dfml")
ATTACKS = ("sign-flip", "scale", "noise", "label-flip", "false-count", "free-rider")
FRACTIONS = (0.1, 0.2, 0.3)
# The defences of each family: a model or segment farther from the receiver's own than half its norm is refused;
# with balanced shards no honest count is twice another's, so the cap is 2; FedAvg's groups of 6 lose one value at
# each end of every coordinate. The attack-free runs with them say what they cost where nobody attacks.
BOUND: dict[str, Any] = {"norm_bound": 0.5}
DEFENCES: dict[str, dict[str, Any]] = {
    "defkt": BOUND, "dfml": BOUND, "fairavg": BOUND,  # no sample counts weigh in these
    "fullavg": {**BOUND, "sample_cap": 2.0}, "combo": {**BOUND, "sample_cap": 2.0},
    "fedavg": {**BOUND, "sample_cap": 2.0, "aggregation": "trimmed-mean", "trim_fraction": 0.2},
}
GATE: dict[str, Any] = {"relative_gate": 0.3}  # knowledge transfer's relative gate, studied apart
GATE_ALGORITHMS, GATE_ATTACKS = ("defkt", "dfml"), ("sign-flip", "label-flip")
GOAL_ATTACKS, GOAL_FRACTION, GOAL_POINTS = ("sign-flip", "false-count"), 0.2, 0.03
Key = tuple[str, str, float, str]  # (algorithm, attack, fraction, defences)


@dataclass(frozen=True)
class Plan:
    """Which part of the table to run."""

    algorithms: tuple[str, ...] = ALGORITHMS
    attacks: tuple[str, ...] = ATTACKS
    fractions: tuple[float, ...] = FRACTIONS
    rounds: int = 100
    gate: bool = True

    def scenarios(self) -> list[tuple[str | None, float]]:
        return [(None, 0.0)] + [(attack, fraction) for attack in self.attacks for fraction in self.fractions]

    def gate_runs(self) -> list[tuple[str, str | None]]:
        if not self.gate:
            return []
        return [(a, attack) for a in GATE_ALGORITHMS if a in self.algorithms for attack in (None, *GATE_ATTACKS)]

    def task(self, algorithm: str, attack: str | None, fraction: float, defences: str) -> RunTask:
        settings = {"off": {}, "on": DEFENCES[algorithm], "gate": GATE}[defences]
        adversaries = [f"{attack}:{fraction}"] if attack else []
        config = ExperimentConfig.model_validate({**BASE, "rounds": self.rounds, "eval_every": self.rounds,
                                                  **settings, "algorithms": [algorithm], "adversaries": adversaries})
        point = {"attack": attack or "none", "fraction": fraction, "defences": defences}
        name = f"{algorithm}__{attack or 'none'}_{fraction:g}__{defences}__{self.rounds}r"
        return RunTask(name, point, algorithm, config.learning.seed, config.flat(mode="json"))

    def tasks(self) -> list[RunTask]:
        main = [self.task(a, attack, f, d) for a in self.algorithms for attack, f in self.scenarios()
                for d in ("off", "on")]
        return main + [self.task(a, attack, GOAL_FRACTION if attack else 0.0, "gate") for a, attack in self.gate_runs()]


def run(plan: Plan, out: Path, workers: int) -> int:
    """Every run whose result is not in ``out`` yet, ``workers`` at once; returns how many ran."""
    out.mkdir(parents=True, exist_ok=True)
    todo = [t for t in plan.tasks() if read_result(result_path(out, t)) is None]

    def finished(outcome: Outcome) -> None:
        if outcome.payload is None:
            raise SystemExit(f"{outcome.task.name} failed: {outcome.error}")
        write_atomic(result_path(out, outcome.task), outcome.payload)
        print(f"done {outcome.task.name}: honest global {outcome.payload['honest_global_accuracy']:.4f}", flush=True)

    run_pool(todo, workers, finished)
    return len(todo)


def rows(plan: Plan, out: Path) -> list[dict[str, Any]]:
    """One row per run: its algorithm, attack, share, defences, the honest nodes' final accuracies, refusals."""
    found = []
    for t in plan.tasks():
        payload = read_result(result_path(out, t))
        if payload is None:
            raise SystemExit(f"no result for {t.name} in {out}: run without --table-only first")
        refused: Counter[str] = Counter()
        for node in payload["nodes"]:
            if node["id"] not in payload["adversaries"]:
                refused.update(node.get("rejected", {}))
        found.append({"algorithm": t.algorithm, **t.point, "adversaries": sorted(payload["adversaries"]),
                      "global_by_node": {node["id"]: node["global_accuracy"] for node in payload["nodes"]},
                      "honest_global_accuracy": round(payload["honest_global_accuracy"], 4),
                      "honest_local_accuracy": round(payload["honest_local_accuracy"], 4),
                      "refused_by_honest_nodes": dict(sorted(refused.items())), "run": t.name})
    return found


def cell(table: dict[Key, dict[str, Any]], key: Key) -> str:
    r = table[key]
    return f"{r['honest_global_accuracy']:.3f} / {r['honest_local_accuracy']:.3f}"


def refused(table: dict[Key, dict[str, Any]], key: Key) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in table[key]["refused_by_honest_nodes"].items()) or "-"


def goal(table: dict[Key, dict[str, Any]], algorithm: str) -> dict[str, Any]:
    """Per goal attack that ran: the attack-free figure of the same nodes (those honest under the attack), the
    attacked one without and with the defences, and whether the defended one is within :data:`GOAL_POINTS` of the
    attack-free one."""
    verdict = {}
    for attack in GOAL_ATTACKS:
        if (algorithm, attack, GOAL_FRACTION, "on") not in table:
            continue
        attacked = table[algorithm, attack, GOAL_FRACTION, "off"]
        free_nodes = table[algorithm, "none", 0.0, "off"]["global_by_node"]
        free = round(fmean(a for node, a in free_nodes.items() if node not in attacked["adversaries"]), 4)
        off = attacked["honest_global_accuracy"]
        on = table[algorithm, attack, GOAL_FRACTION, "on"]["honest_global_accuracy"]
        verdict[attack] = {"attack_free": free, "off": off, "on": on, "met": on >= free - GOAL_POINTS}
    return verdict


def markdown(plan: Plan, found: list[dict[str, Any]]) -> str:
    table = {(r["algorithm"], r["attack"], r["fraction"], r["defences"]): r for r in found}
    setting = {**BASE, "rounds": plan.rounds, "eval_every": plan.rounds}
    lines = ["# Robustness: honest nodes' accuracy under attack", "",
             f"Written by `benchmarks/robustness.py` from its runs ({len(found)}); the same figures in "
             "`robustness.json` and `robustness.csv`. Setting: " + ", ".join(f"{k} {v}" for k, v in setting.items()
                                                                                if k not in ("name", "threads")) + ".",
             "Each cell: the honest nodes' mean final **global / local** accuracy; the adversaries are left out.", ""]
    if any(goal(table, a) for a in plan.algorithms):
        lines += ["## The goal: 20 % sign-flip or false-count adversaries, with the defences within 3 points", "",
                  "Attack-free: the same nodes' mean global accuracy in the run without adversaries.", "",
                  "| algorithm | defences | attack-free | attack | off → on | within 3 points |",
                  "|---|---|---|---|---|---|"]
        for algorithm in plan.algorithms:
            shown = " ".join(f"{k}={v}" for k, v in DEFENCES[algorithm].items())
            for attack, v in goal(table, algorithm).items():
                lines.append(f"| {algorithm} | {shown} | {v['attack_free']:.3f} | {attack} | {v['off']:.3f} → "
                             f"{v['on']:.3f} | {'yes' if v['met'] else 'no'} |")
    for algorithm in plan.algorithms:
        free = (algorithm, "none", 0.0)
        lines += ["", f"## {algorithm}", "", f"Defences on: `{json.dumps(DEFENCES[algorithm])}`. Attack-free: "
                  f"{cell(table, (*free, 'off'))} without defences, {cell(table, (*free, 'on'))} with them (refused "
                  f"by honest nodes: {refused(table, (*free, 'on'))}).", "",
                  "| attack | " + " | ".join(f"{f:.0%} off | {f:.0%} on | refused" for f in plan.fractions) + " |",
                  "|---|" + "---|" * (3 * len(plan.fractions))]
        for attack in plan.attacks:
            cells = [text for f in plan.fractions for text in (cell(table, (algorithm, attack, f, "off")),
                                                                cell(table, (algorithm, attack, f, "on")),
                                                                refused(table, (algorithm, attack, f, "on")))]
            lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    if plan.gate_runs():
        lines += ["", "## Knowledge transfer's relative gate", "", f"`{json.dumps(GATE)}` instead of the defences "
                  "above; 20 % adversaries.", "", "| algorithm | attack | no defence | relative gate | refused by "
                  "honest nodes |", "|---|---|---|---|---|"]
        for algorithm, attack in plan.gate_runs():
            key = (algorithm, attack or "none", GOAL_FRACTION if attack else 0.0)
            lines.append(f"| {algorithm} | {key[1]} | {cell(table, (*key, 'off'))} | {cell(table, (*key, 'gate'))} "
                         f"| {refused(table, (*key, 'gate'))} |")
    return "\n".join(lines) + "\n"


def write_table(plan: Plan, found: list[dict[str, Any]], docs: Path) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "robustness.json").write_text(json.dumps({"setting": {**BASE, "rounds": plan.rounds}, "defences": DEFENCES,
                                                      "gate": GATE, "runs": found}, indent=1) + "\n")
    with (docs / "robustness.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["algorithm", "attack", "fraction", "defences", "honest_global_accuracy",
                         "honest_local_accuracy", "refused_by_honest_nodes"])
        for r in found:
            writer.writerow([r["algorithm"], r["attack"], r["fraction"], r["defences"], r["honest_global_accuracy"],
                             r["honest_local_accuracy"], json.dumps(r["refused_by_honest_nodes"])])
    (docs / "robustness.md").write_text(markdown(plan, found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/robustness"), help="the runs' result files")
    parser.add_argument("--docs", type=Path, default=Path("docs/results"), help="where the table goes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--no-gate", action="store_true", help="leave the relative gate's study out")
    parser.add_argument("--table-only", action="store_true", help="write the table from the results in --out")
    args = parser.parse_args()
    plan = Plan(tuple(args.algorithms), tuple(args.attacks), tuple(args.fractions), args.rounds, not args.no_gate)
    started = time.monotonic()
    ran = 0 if args.table_only else run(plan, args.out, args.workers)
    found = rows(plan, args.out)
    write_table(plan, found, args.docs)
    table = {(r["algorithm"], r["attack"], r["fraction"], r["defences"]): r for r in found}
    print(json.dumps({"runs": len(found), "ran_now": ran, "seconds": round(time.monotonic() - started, 1),
                      "goal": {a: {k: v["met"] for k, v in goal(table, a).items()} for a in plan.algorithms}}))


if __name__ == "__main__":
    main()
