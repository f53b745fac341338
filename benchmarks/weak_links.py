"""Links that break and devices that crawl, with real ``dfl-node start`` daemons on loopback.

* ``cut``: every connection to node-1's gRPC port goes through the weak-link proxy
  (:class:`~dfl_node.testbed.threaded_proxy.LinkProxy`: ``--rate`` bytes/s each way, each connection cut after
  ``--cut-after`` seconds); Def-KT in round mode. Reports the rounds, the wall time, the proxy's counters (bytes
  per model that crossed into node-1, against the model's size) and whether the fleet's models equal the
  simulator's for the same seed over perfect links, bit for bit. The issue's run: 2 nodes, MNIST, the
  784-200-200-10 MLP (800 kB), 100 kB/s, cut every 5 s, 6 rounds.
* ``never``: the same, but node-0's link cuts each connection too soon for any model to cross (``--cut-after``
  0.3 s at 100 kB/s: 30 kB, less than a 64 KiB chunk), in a fleet of 4: the fleet plans around it. Reports the
  rounds, the groups planned around and the wall time.
* ``slow``: 4 nodes, 2 of them in a cgroup held to ``--quota`` of one core (cgroup v1 ``cpu.cfs_quota_us``, as a
  small board beside a desktop); Def-KT in round mode with 000's CNN. Reports the rounds, how often each slow node
  took part, how many times a group was played (the holders' logs), and the wall time.

A daemon behind the proxy advertises the proxy's port (``--advertise HOST:PORT``); every daemon runs one torch
thread. Prints one JSON object.

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/weak_links.py cut --dataset mnist --nodes 2 \\
        --hidden 200,200 --rounds 6 --rate 100000 --cut-after 5'

Needs root for ``slow`` (a cgroup); Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  - after the path above, as every import of dfl_node below
from safetensors.torch import load_file  # noqa: E402

from dfl_node.algorithms import Group  # noqa: E402
from dfl_node.algorithms.base import sample_pairs  # noqa: E402
from dfl_node.learning.provision import fleet_ids, provision, write_fleet  # noqa: E402
from dfl_node.settings.experiment import ExperimentConfig  # noqa: E402
from dfl_node.sim.experiment import run_fleet  # noqa: E402
from dfl_node.testbed.launcher import (  # noqa: E402
    NodeProcess,
    Placement,
    all_done,
    plan_fleet,
    stop_all,
    wait_until,
)
from dfl_node.testbed.threaded_proxy import LinkProxy  # noqa: E402

CGROUP = Path("/sys/fs/cgroup/cpu")


@contextlib.contextmanager
def started(nodes: list[NodeProcess]) -> Iterator[list[NodeProcess]]:
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        stop_all(nodes)


@contextlib.contextmanager
def behind_proxy(nodes: list[NodeProcess], weak: int, rate: float, cut_after: float) -> Iterator[LinkProxy]:
    """Node ``weak`` advertises the port of a proxy that forwards to its own: its peers dial it there."""
    node = nodes[weak]
    with LinkProxy(target=("127.0.0.1", node.grpc_port), rate=rate, cut_after=cut_after) as proxy:
        node.env["DFL_ADVERTISE"] = f"127.0.0.1:{proxy.port}"
        for other in nodes:
            if other is not node:
                other.env["DFL_PEERS"] = other.env["DFL_PEERS"].replace(f":{node.grpc_port}", f":{proxy.port}")
        yield proxy


@contextlib.contextmanager
def cpu_quota(name: str, quota: float) -> Iterator[Path]:
    """A cgroup v1 ``cpu`` group held to ``quota`` of one core; processes join it by pid (``tasks``)."""
    group = CGROUP / name
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(quota * 100000)))
        yield group
    finally:
        for pid in (group / "tasks").read_text().split():  # back to the root group, so the group can go
            with contextlib.suppress(OSError):
                (CGROUP / "tasks").write_text(pid)
        group.rmdir()


def plan(args: argparse.Namespace, config: ExperimentConfig, work: Path) -> list[NodeProcess]:
    shards = work / "shards"
    write_fleet(provision(config), shards)
    return plan_fleet(config, "defkt", shards, work, [Placement("127.0.0.1")] * config.nodes, swarm="weak",
                      mdns=False, static_peers=True, extra={"threads": 1, "round_timeout": args.round_timeout,
                                                            "resume_window": args.resume_window})


def model_bytes(nodes: list[NodeProcess]) -> int:
    state = load_file(str(nodes[0].state_dir / "model.safetensors"))
    return sum(t.numel() * t.element_size() for k, t in state.items() if not k.startswith(("aux:", "scalar:")))


def replays(nodes: list[NodeProcess]) -> dict[str, int]:
    """How many times each round's groups were played again, from the holders' logs."""
    counts: Counter[str] = Counter()
    for node in nodes:
        for round_ in re.findall(r": round (\d+): \d+ group\(s\) did not fuse", node.log_path.read_text()):
            counts[round_] += 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def groups(config: ExperimentConfig) -> list[Group]:
    """Every group of the run's plans (Def-KT's pairs, drawn from the seed as the holders draw them)."""
    return [g for r in range(config.rounds)
            for g in sample_pairs(config.learning.seed, r, fleet_ids(config.nodes), config.learning.pairs)]


def behind_weak_link(args: argparse.Namespace, config: ExperimentConfig, work: Path, weak: int
                     ) -> tuple[list[NodeProcess], dict[str, dict], float, dict[str, int]]:
    """The fleet run to its end with node ``weak`` behind the proxy: its nodes, their final statuses, the wall
    time it took and the proxy's counters."""
    nodes = plan(args, config, work)
    began = time.monotonic()
    with behind_proxy(nodes, weak, args.rate, args.cut_after) as proxy, started(nodes):
        statuses = wait_until(nodes, all_done, timeout=args.timeout)
        return nodes, statuses, time.monotonic() - began, proxy.counters.as_dict()


def cut(args: argparse.Namespace, config: ExperimentConfig, work: Path) -> dict[str, object]:
    nodes, statuses, took, counters = behind_weak_link(args, config, work, 1)
    into = sum(g.aggregator == "node-1" for g in groups(config))
    size = model_bytes(nodes)
    result = run_fleet(config, "defkt", work / "sim")
    sim_models = {n.id: load_file(str(work / "sim" / "defkt" / n.id / "model.safetensors")) for n in nodes}
    equal = all(torch.equal(load_file(str(n.state_dir / "model.safetensors"))[k], sim_models[n.id][k])
                for n in nodes for k in sim_models[n.id])
    return {"rounds": [s["round"] for s in statuses.values()], "wall_s": round(took, 1), "model_bytes": size,
            "models_into_node_1": into, "proxy": counters,
            "bytes_into_node_1_per_model": round(counters["bytes_client_to_target"] / max(1, into)),
            "per_model_x_size": round(counters["bytes_client_to_target"] / max(1, into) / size, 3),
            "transfers_cut": {n: s["transfers_cut"] for n, s in statuses.items()},
            "bytes_resent": {n: s["bytes_resent"] for n, s in statuses.items()},
            "fusions": {n: s["fusions"] for n, s in statuses.items()}, "replays": replays(nodes),
            "equal_to_simulator_bit_for_bit": equal,
            "param_sha256_equal": [s["param_sha256"] for s in statuses.values()] == [
                n.param_sha256 for n in result.nodes]}


def never(args: argparse.Namespace, config: ExperimentConfig, work: Path) -> dict[str, object]:
    nodes, statuses, took, counters = behind_weak_link(args, config, work, 0)
    return {"rounds": [s["round"] for s in statuses.values()], "wall_s": round(took, 1),
            "rounds_node_0_was_planned_into": sum("node-0" in g.members for g in groups(config)), "proxy": counters,
            "groups_replanned": sum(s["groups_replanned"] for s in statuses.values()),
            "groups_abandoned": sum(s["groups_abandoned"] for s in statuses.values()),
            "fusions": {n: s["fusions"] for n, s in statuses.items()},
            "models_sent": {n: s["models_sent"] for n, s in statuses.items()}, "replays": replays(nodes)}


def slow(args: argparse.Namespace, config: ExperimentConfig, work: Path) -> dict[str, object]:
    nodes = plan(args, config, work)
    began = time.monotonic()
    with cpu_quota(f"dfl-slow-{time.time_ns()}", args.quota) as group, started(nodes):
        for node in nodes[2:]:  # node-2 and node-3: the slow boards
            assert node.process is not None
            (group / "tasks").write_text(str(node.process.pid))
        statuses = wait_until(nodes, all_done, timeout=args.timeout)
        took = time.monotonic() - began
    return {"rounds": [s["round"] for s in statuses.values()], "wall_s": round(took, 1), "quota": args.quota,
            "slow": ["node-2", "node-3"],
            "planned_with_a_slow_node": sum(bool({"node-2", "node-3"} & set(g.members)) for g in groups(config)),
            "work_s": {n: round(s["work_s"], 1) for n, s in statuses.items()},
            "sent": {n: s["models_sent"] for n, s in statuses.items()},
            "fusions": {n: s["fusions"] for n, s in statuses.items()},
            "groups_replanned": sum(s["groups_replanned"] for s in statuses.values()),
            "groups_abandoned": sum(s["groups_abandoned"] for s in statuses.values()), "replays": replays(nodes),
            "global_accuracy": {n: s["global_accuracy"] for n, s in statuses.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=["cut", "never", "slow"])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", type=Path, help="where mnist.npz is (default: ../shared/datasets)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--hidden", default="256,256", help="the MLP's widths ('' for a CNN's default)")
    parser.add_argument("--train-samples", type=int, default=0, help="training samples of the dataset (0: all)")
    parser.add_argument("--test-samples", type=int, default=0, help="test samples, the global test set (0: all)")
    parser.add_argument("--rate", type=float, default=100_000, help="the proxy's bytes/s each way")
    parser.add_argument("--cut-after", type=float, default=5.0, help="the proxy cuts each connection after this")
    parser.add_argument("--resume-window", type=float, default=10.0)
    parser.add_argument("--quota", type=float, default=0.15, help="slow: the share of one core the slow nodes get")
    parser.add_argument("--round-timeout", type=float, default=120.0, help="the nodes' shortest group deadline")
    parser.add_argument("--timeout", type=float, default=1800.0, help="the whole run's")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    data_dir = args.data_dir or REPO.parent / "shared" / "datasets"
    config = ExperimentConfig(dataset=args.dataset, data_dir=data_dir if args.dataset != "digits" else None,
                              nodes=args.nodes, rounds=args.rounds, eval_every=args.rounds, partition="iid",
                              seed=args.seed, model=args.model, hidden=[int(h) for h in args.hidden.split(",") if h],
                              train_samples=args.train_samples, test_samples=args.test_samples)
    with tempfile.TemporaryDirectory(prefix="dfl-weak-") as work:
        report = {"cut": cut, "never": never, "slow": slow}[args.experiment](args, config, Path(work))
    print(json.dumps({"benchmark": "weak_links", "experiment": args.experiment, "config": {
        "dataset": args.dataset, "nodes": args.nodes, "rounds": args.rounds, "model": args.model, "hidden": args.hidden,
        "train_samples": args.train_samples, "test_samples": args.test_samples, "rate": args.rate,
        "cut_after": args.cut_after, "round_timeout": args.round_timeout}, **report}, indent=1))


if __name__ == "__main__":
    main()
