"""Simulator speed before and after a change, in one run: rounds per second of each algorithm on 000's MNIST
MLP setting (ζ=4, K=10, Q=1), 1 torch thread.

The default ``--before`` is the last tree whose simulator had a round loop of its own (``Simulation``, before
``dfl-node simulate`` became K of the daemon's nodes on a virtual clock); ``--after`` is this tree.
The before tree is checked out in a temporary ``git worktree``; each measurement is a child process importing
``dfl_node`` from one tree or the other, and the passes alternate (before, after, before, after…) so that a
noisy machine slows both alike. Both trees are timed the same way, whole runs from the provisioned data to
the result, evaluated at the start and the end only: a run of ``--rounds`` more rounds less a run of
``--rounds``/2, so that neither start-up (the fleet writes shards, builds its nodes) nor evaluation counts — a
round's marginal cost, by the clock (``rounds_per_s``) and by the process's CPU time (``cpu_rounds_per_s``: on
a machine shared with other work the clock also counts the time others held the core; one thread's CPU time
does not). The shorter run is not 1 round: a node evaluates its final model only if it changed, so after
one round only two nodes would, and the longer run's other eight evaluations would count as rounds.
``eval_s`` is the shorter run's whole time. Prints one JSON object; ``ratio`` and ``cpu_ratio`` are
after/before.

    python benchmarks/sim_speed.py [--rounds 40] [--repeat 3] [--before COMMIT] [--config FILE] [--data-dir DIR]
    python benchmarks/sim_speed.py --rounds 40 --repeat 5    # README's figures
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRE_ISSUE = "63a0fcb7279047eee601fa1fc37b0c54e269de7d"  # the last tree with the simulator's own round loop


class _TreeOnly(importlib.abc.MetaPathFinder):
    """Finds ``dfl_node`` and its submodules in one tree only, ahead of every other finder.

    ``PYTHONPATH`` alone does not isolate a tree: an editable install (setuptools' ``__editable__``
    finder on ``sys.meta_path``) still answers for a submodule the tree lacks, so the old tree's
    ``import dfl_node.settings.loading`` used to load the *installed* tree's module on top of the old
    ``dfl_node.settings.experiment`` (and failed on ``unusable_here``). A module the tree lacks is missing here.
    """

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != "dfl_node" and not name.startswith("dfl_node."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [str(self.tree)] if name == "dfl_node" else path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} in {self.tree}", name=name)
        return spec


def measure(tree: Path, config_path: Path, rounds: int, data_dir: str | None) -> dict:
    """In a child: time each algorithm of the config in ``tree`` (the same calls in both trees)."""
    sys.meta_path.insert(0, _TreeOnly(tree))
    import torch  # noqa: PLC0415 - in the child only

    import dfl_node  # noqa: PLC0415
    from dfl_node import sim  # noqa: PLC0415

    # Where the trees this times keep the settings and provisioning: dfl_node.settings and learning.provision now;
    # dfl_node.config, config_loader and learning.fleet before; load_config in dfl_node.config earlier
    if (tree / "dfl_node" / "settings").is_dir():
        from dfl_node.learning.provision import provision  # noqa: PLC0415
        from dfl_node.settings.experiment import ExperimentConfig  # noqa: PLC0415
        from dfl_node.settings.loading import load_config  # noqa: PLC0415
    else:
        from dfl_node.config import ExperimentConfig  # type: ignore[no-redef]  # noqa: PLC0415
        from dfl_node.learning.fleet import provision  # type: ignore[no-redef]  # noqa: PLC0415
        if (tree / "dfl_node" / "config_loader.py").is_file():
            from dfl_node.config_loader import load_config  # type: ignore[no-redef]  # noqa: PLC0415
        else:
            from dfl_node.config import load_config  # type: ignore[no-redef]  # noqa: PLC0415

    config = load_config(ExperimentConfig, config_path, {"data_dir": data_dir})  # its data_dir is read from its folder
    torch.set_num_threads(1)
    fleet = provision(config)
    report: dict = {"tree": str(Path(dfl_node.__file__).parents[1])}

    def run(algorithm: str, rounds: int) -> tuple[float, float]:
        """A whole run of ``rounds`` rounds, evaluated at its start and end: (wall, CPU) seconds."""
        short = config.model_copy(update={"rounds": rounds, "eval_every": rounds})
        start, cpu = time.perf_counter(), time.process_time()
        if hasattr(sim, "Simulation"):  # the simulator's own round loop (older trees)
            sim.Simulation(short, algorithm, fleet).run()
        else:  # K real nodes on the virtual clock
            sim.run_fleet(short, algorithm, data=fleet)
        return time.perf_counter() - start, time.process_time() - cpu

    base = max(1, rounds // 2)  # long enough that every node's model changed: both runs evaluate every node at the end
    for algorithm in config.algorithms:
        run(algorithm, 1)  # warm-up
        short, short_cpu = run(algorithm, base)
        long, long_cpu = run(algorithm, base + rounds)
        report[algorithm] = {"rounds_per_s": rounds / (long - short),
                             "cpu_rounds_per_s": rounds / (long_cpu - short_cpu),
                             "eval_s": short}
    strays = sorted(name for name, module in list(sys.modules.items()) if name.split(".")[0] == "dfl_node"
                    and getattr(module, "__file__", None) and not Path(module.__file__).resolve().is_relative_to(tree))
    if strays:
        raise RuntimeError(f"modules of dfl_node loaded from outside {tree}: {', '.join(strays)}")
    return report


def child(tree: Path, args: argparse.Namespace) -> dict:
    """One pass in a fresh process importing ``dfl_node`` from ``tree`` only (see :class:`_TreeOnly`)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--child", str(tree), "--rounds", str(args.rounds),
               "--config", str(args.config)]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode:  # the child's traceback, else a bare CalledProcessError hides why
        raise RuntimeError(f"the pass in {tree} exited {done.returncode}:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout)
    if Path(report["tree"]).resolve() != tree.resolve():
        raise RuntimeError(f"the child imported dfl_node from {report['tree']}, not {tree}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "experiments" / "mnist_mlp_zeta4.yaml")
    parser.add_argument("--data-dir", default=None, help="dataset folder (else the config's data_dir)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3, help="passes per tree, alternating")
    parser.add_argument("--before", default=PRE_ISSUE, help="commit to compare against")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)  # the tree to import
    args = parser.parse_args()
    args.config = args.config.resolve()
    if args.child:
        print(json.dumps(measure(args.child.resolve(), args.config, args.rounds, args.data_dir)))
        return
    with tempfile.TemporaryDirectory(prefix="sim-speed-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(before), args.before],
                       check=True)
        try:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for _ in range(args.repeat):
                for name, tree in (("before", before), ("after", ROOT)):
                    runs[name].append(child(tree, args))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=True)
    algorithms = [k for k in runs["after"][0] if k != "tree"]
    report: dict = {
        "benchmark": "sim_speed", "config": args.config.name, "rounds": args.rounds, "repeat": args.repeat,
        "threads": 1, "before": args.before, "after": _head(), "machine": platform.machine(), "cpus": os.cpu_count(),
    }
    for algorithm in algorithms:
        entry = {}
        for name in ("before", "after"):
            rates = [run[algorithm]["rounds_per_s"] for run in runs[name]]
            cpu_rates = [run[algorithm]["cpu_rounds_per_s"] for run in runs[name]]
            entry[name] = {"rounds_per_s": round(statistics.median(rates), 2),
                           "s_per_round": round(1 / statistics.median(rates), 4),
                           "all_rounds_per_s": [round(r, 2) for r in rates],
                           "cpu_rounds_per_s": round(statistics.median(cpu_rates), 2),
                           "all_cpu_rounds_per_s": [round(r, 2) for r in cpu_rates],
                           "eval_s": round(statistics.median(run[algorithm]["eval_s"] for run in runs[name]), 2)}
        entry["ratio"] = round(entry["after"]["rounds_per_s"] / entry["before"]["rounds_per_s"], 2)
        entry["cpu_ratio"] = round(entry["after"]["cpu_rounds_per_s"] / entry["before"]["cpu_rounds_per_s"], 2)
        report[algorithm] = entry
    print(json.dumps(report, indent=1))


def _head() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "dfl_node"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+working tree" if dirty else "")


if __name__ == "__main__":
    main()
