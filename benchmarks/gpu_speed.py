"""The simulator on a GPU: 000's Fashion-MNIST CNN experiment (``experiments/fmnist_cnn_zeta4.yaml``:
K = 10, Q = 1, M = 10, B = 200, 1000 rounds), eager against the fast path (each epoch a CUDA graph's replay), one
run against three at once. Prints JSON lines, each also appended to ``--out`` as it comes (a crash loses nothing
measured before it). Sections, in this order (``--sections``, all by default):

* ``env``: torch, CUDA, the card, the math modes PyTorch starts with.
* ``step``: ms per training step of the CNN at B = 200 on a 4,800-sample shard, local SGD and MKT (a step of
  two models): eager and CUDA graphs × ``cudnn_benchmark`` off/on × precision fp32/tf32/bf16, the median of
  ``--repeats`` updates after a warm-up; and whether the graphs give the eager bits (deterministic cuDNN).
* ``overhead``: what the simulator adds to a round at 10 nodes, training aside: a run of more rounds less a
  run of fewer, for a tiny model (mlp:8) and for the CNN on one-step shards (its digests, checkpoints, copies).
* ``rounds``: rounds/s of each algorithm over ``--rounds`` rounds, eager and fast, and their accuracies: fast
  must stay within ``TOLERANCE`` of eager (averaged global and local accuracy).
* ``concurrent``: the three algorithms at once, as pool processes and as threads on CUDA streams, against
  one after another (the ``rounds`` section's fast runs).
* ``precision``: Def-KT, fast, in tf32 and bf16: rounds/s and accuracy against its fp32 run.

``choice`` then says which configuration is fastest among those that worked, from every record in ``--out``;
``--full auto`` runs the whole experiment with it (``--full streams|processes|sequential`` with that), through
``dfl-node simulate`` as a user would, results into ``--results`` (``dfl-node plot`` and ``docs/results/`` read
them), under a hard ``--deadline``. Its progress lines are recorded as they come.

    python benchmarks/gpu_speed.py --data-dir ../shared/datasets --out gpu.jsonl
    python benchmarks/gpu_speed.py --sections none --full auto --results runs/fmnist_gpu --out gpu.jsonl
    python benchmarks/gpu_speed.py --device cpu --smoke          # every branch, tiny sizes, seconds (the tests')

Times are taken by the clock around synchronised work; the card and torch are in the ``env`` record.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "fmnist_cnn_zeta4.yaml"
TOLERANCE = 0.02  # fast vs eager: |Δ averaged accuracy| after a short run (CUDA's atomics differ run to run)
SECTIONS = ("env", "step", "overhead", "rounds", "concurrent", "precision")
SMOKE = {"name": "gpu-smoke", "dataset": "digits", "partition": "shards", "zeta": 4, "nodes": 10, "model": "cnn",
         "hidden": [4, 8, 16], "local_epochs": 1, "batch_size": 20, "mkt_batch_size": 20, "eval_every": 2}


class Records:
    """Every record: printed, appended to ``path`` at once, kept for the choice."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.all = path, []
        if path is not None and path.exists():
            self.all = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def __call__(self, section: str, **fields: Any) -> dict[str, Any]:
        record = {"section": section, **fields}
        line = json.dumps(record)
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")
        self.all.append(record)
        return record

    def of(self, section: str) -> list[dict[str, Any]]:
        return [r for r in self.all if r.get("section") == section and "error" not in r]


def sync(device: Any) -> None:
    import torch  # noqa: PLC0415

    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: Any, repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up call (which captures a graph)."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ----------------------------------------------------------------------------------------------- sections

def env(log: Records, args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415

    cuda = torch.cuda.is_available()
    log("env", torch=torch.__version__, cuda_build=torch.version.cuda, cuda=cuda,
        card=torch.cuda.get_device_name() if cuda else None, cudnn=torch.backends.cudnn.version(),
        cudnn_allow_tf32=torch.backends.cudnn.allow_tf32, matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        python=sys.version.split()[0], device=args.device, smoke=args.smoke)


def step(log: Records, args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415

    from dfl_node.learning.cuda_graphs import EagerRecorder  # noqa: PLC0415
    from dfl_node.learning.datasets import ArrayDataset  # noqa: PLC0415
    from dfl_node.learning.devices import use_backends  # noqa: PLC0415
    from dfl_node.learning.fusion import graphed_mkt, mutual_knowledge_transfer  # noqa: PLC0415
    from dfl_node.learning.models import build_model  # noqa: PLC0415
    from dfl_node.learning.training import SgdParams, batches_per_epoch, graphed_local_sgd, local_sgd  # noqa: PLC0415

    device = torch.device(args.device)
    shape, hidden, samples, batch = ((1, 8, 8), [4, 8, 16], 64, 16) if args.smoke else ((1, 28, 28), None, 4800, 200)
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(samples, *shape, generator=g), torch.randint(0, 10, (samples,), generator=g),
                        10).to(device)
    models = [build_model("cnn", shape, 10, hidden=hidden, seed=seed).to(device) for seed in (0, 1)]
    eager_here = device.type != "cuda"  # no CUDA: the graphs' code runs with the eager stand-in

    def local(params: SgdParams) -> float | None:
        if params.cuda_graphs and eager_here:
            return graphed_local_sgd(models[0], data, params, g, recorder=EagerRecorder)
        return local_sgd(models[0], data, params, g)

    def mkt(params: SgdParams) -> None:
        if params.cuda_graphs and eager_here:
            assert graphed_mkt(*models, data, params, params, g, recorder=EagerRecorder)
        else:
            mutual_knowledge_transfer(*models, data, params, params, g)

    steps = batches_per_epoch(samples, batch) * args.epochs
    for benchmark in (False,) if args.smoke else (False, True):  # smoke: each branch once, not every combination
        for precision in ("fp32", "bf16") if args.smoke else ("fp32", "tf32", "bf16"):
            for graphs in (False, True):
                use_backends(precision, benchmark)
                params = SgdParams(lr=0.005, momentum=0.5, batch_size=batch, epochs=args.epochs, cuda_graphs=graphs,
                                   bf16=precision == "bf16")
                local_s = timed(lambda p=params: local(p), device, args.repeats)
                mkt_s = timed(lambda p=params: mkt(p), device, args.repeats)
                log("step", path="graphs" if graphs else "eager", precision=precision, cudnn_benchmark=benchmark,
                    batch=batch, steps=steps, local_ms_per_step=round(1e3 * local_s / steps, 4),
                    mkt_ms_per_step=round(1e3 * mkt_s / steps, 4))
    use_backends("fp32", False)
    torch.backends.cudnn.deterministic = True
    try:  # the graphs against the eager loop, bit for bit, where cuDNN is told to be deterministic
        start = [copy.deepcopy(m) for m in models]
        finals = []
        for graphs in (False, True):
            models[:] = [copy.deepcopy(m) for m in start]
            params = SgdParams(lr=0.005, momentum=0.5, batch_size=batch, epochs=1, cuda_graphs=graphs)
            for update in range(3):
                g.manual_seed(update)
                local(params)
                mkt(params)
            finals.append([t for m in models for t in m.state_dict().values()])
        equal = [torch.equal(a, b) for a, b in zip(*finals)]
        log("graphs_equal_eager", updates=3, tensors=len(equal), equal=sum(equal), bit_identical=all(equal))
    finally:
        torch.backends.cudnn.deterministic = False


def overhead(log: Records, args: argparse.Namespace) -> None:
    from dfl_node.learning.provision import provision  # noqa: PLC0415
    from dfl_node.sim.experiment import run_fleet  # noqa: PLC0415

    short, long = (2, 4) if args.smoke else (20, 60)
    cases: list[tuple[str, dict[str, Any]]] = [("mlp:8", {"model": "mlp", "hidden": [8]}), ("cnn, 1-step shards", {})]
    if args.device == "cpu" and not args.smoke:
        cases = cases[:1]  # a CPU would spend the CNN case evaluating it (10 × 11,200 images every 10 rounds)
    for label, settings in cases:
        config = experiment(args, train_samples=250, local_epochs=1, batch_size=200, mkt_batch_size=200, **settings)
        data = provision(config)
        walls = {}
        for rounds in (short, long):
            run = config.model_copy(update={"rounds": rounds})
            start = time.perf_counter()
            run_fleet(run, "defkt", data=data)
            walls[rounds] = time.perf_counter() - start
            gc.collect()
        log("overhead", model=label, nodes=config.nodes, rounds=[short, long], eval_every=config.eval_every,
            ms_per_round=round(1e3 * (walls[long] - walls[short]) / (long - short), 2))


class RoundRate:
    """Rounds per second between rounds the progress reports saw: from the first (start-up left out), or from the
    middle of the run (``late``: most nodes have then recorded their graphs, one per node and kind of epoch)."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, int]] = []

    def __call__(self, rounds: int, virtual_s: float) -> None:
        if rounds and (not self.seen or rounds > self.seen[-1][1]):
            self.seen.append((time.perf_counter(), rounds))

    def per_s(self, late: bool = False) -> float | None:
        if not self.seen:
            return None
        last = self.seen[-1]
        first = next(s for s in self.seen if s[1] >= last[1] // 2) if late else self.seen[0]
        return round((last[1] - first[1]) / (last[0] - first[0]), 3) if last[0] > first[0] else None


def one_run(log: Records, section: str, config: Any, algorithm: str, data: Any, **settings: Any) -> Any:
    """One run in this process; ``graphs``: how many CUDA graphs it recorded and declined (the path it timed)."""
    from dfl_node.learning.cuda_graphs import COUNTS  # noqa: PLC0415
    from dfl_node.sim.experiment import run_fleet  # noqa: PLC0415

    rate, start, before = RoundRate(), time.perf_counter(), dict(COUNTS)
    result = run_fleet(config, algorithm, data=data, progress=rate, **settings)
    log(section, algorithm=algorithm, **settings, rounds=result.rounds, wall_s=round(time.perf_counter() - start, 2),
        rounds_per_s=rate.per_s(), late_rounds_per_s=rate.per_s(late=True),
        graphs={k: COUNTS[k] - before[k] for k in COUNTS},
        global_accuracy=round(result.global_accuracy, 4), local_accuracy=round(result.local_accuracy, 4))
    gc.collect()  # the run's nodes, and with them their graphs' GPU memory, go now
    return result


def rounds(log: Records, args: argparse.Namespace) -> None:
    from dfl_node.learning.provision import provision  # noqa: PLC0415

    config = experiment(args, rounds=args.rounds)
    data = provision(config)
    for algorithm in config.algorithms:
        eager = one_run(log, "rounds", config, algorithm, data, cuda_graphs=False)
        fast = one_run(log, "rounds", config, algorithm, data, cuda_graphs=True)
        deltas = [abs(eager.global_accuracy - fast.global_accuracy), abs(eager.local_accuracy - fast.local_accuracy)]
        same = sum(a.param_sha256 == b.param_sha256 for a, b in zip(eager.nodes, fast.nodes))
        log("accuracy", algorithm=algorithm, rounds=config.rounds, delta_global=round(deltas[0], 4),
            delta_local=round(deltas[1], 4), tolerance=TOLERANCE, within=max(deltas) <= TOLERANCE,
            bit_identical_nodes=f"{same}/{len(eager.nodes)}")


def concurrent(log: Records, args: argparse.Namespace) -> None:
    from dfl_node.sweep.grid import RunTask  # noqa: PLC0415
    from dfl_node.sweep.pool import run_pool  # noqa: PLC0415
    from dfl_node.sweep.threads import run_threads  # noqa: PLC0415

    config = experiment(args, rounds=args.rounds)
    tasks = [RunTask(a, {}, a, config.learning.seed, config.model_copy(update={"algorithms": [a]}).flat(mode="json"))
             for a in config.algorithms]
    alone = {r["algorithm"]: r for r in log.of("rounds") if r.get("cuda_graphs") and r["rounds"] == args.rounds}
    sequential = sum(r["wall_s"] for r in alone.values())
    for runs, runner in (("processes", run_pool), ("streams", run_threads)):
        outcomes: list[Any] = []
        start = time.perf_counter()
        runner(tasks, len(tasks), outcomes.append)
        wall = time.perf_counter() - start
        errors = [o.error[:300] for o in outcomes if o.error]
        # each run's accuracies against the same run alone (the rounds section): the same within the tolerance
        deltas = [abs(o.payload[k] - alone[o.task.algorithm][k]) for o in outcomes if o.payload
                  and o.task.algorithm in alone for k in ("global_accuracy", "local_accuracy")]
        log("concurrent", runs=runs, at_once=len(tasks), rounds=config.rounds, wall_s=round(wall, 2),
            one_after_another_s=round(sequential, 2) or None,
            speedup=round(sequential / wall, 3) if sequential else None,
            max_delta_vs_alone=round(max(deltas), 4) if deltas else None,
            within=max(deltas) <= TOLERANCE if deltas else None,
            **({"error": "; ".join(errors)} if errors else {}))


def precision(log: Records, args: argparse.Namespace) -> None:
    from dfl_node.learning.provision import provision  # noqa: PLC0415

    config = experiment(args, rounds=args.rounds)
    data = provision(config)
    for kind in ("tf32", "bf16"):
        one_run(log, "precision", config, "defkt", data, cuda_graphs=True, precision=kind)


# ----------------------------------------------------------------------------------------------- the choice, the run

def choose(log: Records) -> dict[str, Any]:
    """The fastest configuration among those that worked: graphs if they ran and stayed within tolerance, cuDNN's
    benchmark if it made the graphed fp32 step faster, and the way of running three at once that took least time."""
    steps = {(r["path"], r["cudnn_benchmark"]): r["local_ms_per_step"]
             for r in log.of("step") if r["precision"] == "fp32"}
    accurate = [r["within"] for r in log.of("accuracy")]
    graphs = bool(accurate) and all(accurate) and ("graphs", False) in steps
    path = "graphs" if graphs else "eager"
    benchmark = (path, True) in steps and (path, False) in steps and steps[path, True] < 0.97 * steps[path, False]
    walls = {r["runs"]: r["wall_s"] for r in log.of("concurrent") if r.get("within") is not False}
    sequential = next((r["one_after_another_s"] for r in log.of("concurrent") if r.get("one_after_another_s")), None)
    if sequential:
        walls["sequential"] = sequential
    runs = min(walls, key=walls.__getitem__) if walls else "processes"
    return log("choice", cuda_graphs=graphs, cudnn_benchmark=benchmark, runs=runs, precision="fp32",
               measured={"step_ms": {f"{p}/benchmark={b}": v for (p, b), v in steps.items()}, "walls_s": walls})


def full(log: Records, args: argparse.Namespace) -> None:
    """The whole experiment through ``dfl-node simulate``, under ``--deadline`` seconds."""
    choice = choose(log) if args.full == "auto" else {"cuda_graphs": True, "cudnn_benchmark": False, "runs": args.full}
    results = Path(args.results)
    command = [sys.executable, "-m", "dfl_node", "simulate", "--config", str(experiment_file(args)),
               "--device", args.device, "--out", str(results), "--precision", "fp32",
               "--cuda-graphs" if choice["cuda_graphs"] else "--no-cuda-graphs",
               "--cudnn-benchmark" if choice["cudnn_benchmark"] else "--no-cudnn-benchmark",
               *(["--per-device", "3"] if choice["runs"] != "sequential" else []),
               *(["--streams"] if choice["runs"] == "streams" else []),
               *(["--data-dir", args.data_dir] if args.data_dir else []),
               *(["--rounds", str(args.full_rounds)] if args.full_rounds else [])]
    for stale in [*results.glob("*.json"), *results.glob("*.csv")]:  # a rerun reports its own results only
        stale.unlink()
    log("full", event="start", command=command[1:], deadline_s=args.deadline)
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    def kill() -> None:  # the run and its pool processes, if any
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)

    watchdog = threading.Timer(args.deadline, kill)  # the hard limit, whether the child talks or not
    watchdog.start()
    assert child.stdout is not None
    try:
        for line in child.stdout:  # progress lines, the JSON line per algorithm, then the tables
            if ("/" in line and " rounds (" in line) or line.startswith('{"algorithm"') or "rror" in line:
                log("full", event="progress", line=line.strip()[:500], elapsed_s=round(time.perf_counter() - start, 1))
        child.wait()
    finally:
        watchdog.cancel()
        kill()
        child.wait()
    wall = time.perf_counter() - start
    finals = {p.stem: {k: round(v, 4) for k, v in json.loads(p.read_text()).items() if k.endswith("_accuracy")}
              for p in sorted(results.glob("*.json"))}
    log("full", event="end", completed=child.returncode == 0, returncode=child.returncode, wall_s=round(wall, 1),
        minutes=round(wall / 60, 2), choice={k: choice[k] for k in ("cuda_graphs", "cudnn_benchmark", "runs")},
        results=finals)


def experiment(args: argparse.Namespace, **settings: Any) -> Any:
    from dfl_node.settings.experiment import ExperimentConfig  # noqa: PLC0415
    from dfl_node.settings.loading import load_config  # noqa: PLC0415

    flags = {"device": args.device, **({"data_dir": args.data_dir} if args.data_dir else {})}
    return load_config(ExperimentConfig, experiment_file(args), {**flags, **settings})


def experiment_file(args: argparse.Namespace) -> Path:
    if not args.smoke:
        return Path(args.config)
    path = Path(tempfile.gettempdir()) / f"gpu-smoke-{os.getpid()}.json"
    path.write_text(json.dumps({**SMOKE, "rounds": args.full_rounds or 3}))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on digits (how the tests run it)")
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--data-dir", default=os.environ.get("DFL_DATA_DIR"))
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated of {', '.join(SECTIONS)}")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the rounds/concurrent/precision runs")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per timed update in the step section")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--full", choices=["auto", "streams", "processes", "sequential"], default=None)
    parser.add_argument("--full-rounds", type=int, default=None, help="override the experiment's rounds")
    parser.add_argument("--results", default=str(ROOT / "runs" / "fmnist_cnn_zeta4_gpu"))
    parser.add_argument("--deadline", type=float, default=420.0, help="seconds the full run may take")
    parser.add_argument("--out", type=Path, default=None, help="append every JSON line here too")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.epochs, args.repeats = min(args.rounds, 3), 1, 2
    log = Records(args.out)
    sections = {"env": env, "step": step, "overhead": overhead, "rounds": rounds, "concurrent": concurrent,
                "precision": precision}
    failed = False
    for name in [s for s in args.sections.split(",") if s and s != "none"]:
        try:
            sections[name](log, args)
        except Exception as exc:  # noqa: BLE001 - a section that fails is recorded; the next still runs
            failed = True
            log(name, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])
    if args.full:
        full(log, args)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
