"""A fleet's result from what its nodes report — each one's ``/status`` and ``/history`` (as JSON) — in the
results schema (:class:`~dfl_node.results.RunResult`). One function for both drivers of real nodes: the
simulator's fleet on the virtual clock (:mod:`dfl_node.sim.experiment`) and the testbed's processes
(:mod:`dfl_node.testbed.launcher`), so their results compare field by field.
"""

from __future__ import annotations

from collections import Counter

from dfl_node.results import EvalRecord, NodeResult, RunResult, SeriesRecord
from dfl_node.settings.experiment import ExperimentConfig

Positions = dict[str, list[tuple[int, dict]]]  # each node's history entries, by how far the fleet had come


def fleet_rounds(statuses: dict[str, dict]) -> tuple[str, int]:
    """The fleet's mode and what it really did (never the configured T).

    Round mode: the round every node reached. Async mode has no rounds: the completed exchanges,
    counted as fusions (a model received and fused), summed over the fleet.
    """
    mode = next(iter(statuses.values()))["mode"]
    if mode == "async":
        return mode, sum(s["fusions"] for s in statuses.values())
    return mode, min(s["round"] for s in statuses.values())


def fleet_positions(histories: dict[str, list[dict]], mode: str) -> Positions:
    """Each node's history entries, tagged with how far the fleet had come, in the unit of :func:`fleet_rounds`.

    In round mode an entry's round is a fleet-wide clock. Async mode has none: an entry's position is
    the number of fusions anywhere in the fleet up to its time (the nodes share one clock).
    """
    if mode != "async":
        return {node_id: [(h["round"], h) for h in entries] for node_id, entries in histories.items()}
    tagged: Positions = {node_id: [] for node_id in histories}
    fusions = 0
    for node_id, h in sorted(((i, h) for i, entries in histories.items() for h in entries), key=lambda e: e[1]["time"]):
        fusions += h["event"] == "fusion"
        tagged[node_id].append((fusions, h))
    return tagged


def accuracy_curve(positions: Positions, points: list[int], started: float) -> list[EvalRecord]:
    """Averaged accuracies at each point, from each node's last evaluation at or before it; the bytes that had
    crossed the fleet's wire by then (what every node had received); the algorithm's other reported models
    (``series``) alike.

    A point is left out until every node has been evaluated; its wall time is when the last entry
    counted at that point happened, relative to ``started`` (on the nodes' clock). ``points`` ascend, and so does
    each node's position along its entries (a node's round, or the fleet's fusions up to an entry's time): one pass
    over each node's entries serves every point, where a pass per point cost minutes for a thousand nodes'
    600 s (ten thousand fusions, a point every ``eval_every``-th).
    """
    history = []
    reached: dict[str, dict] = {}  # each node's last entry at or before the point
    latest: dict[str, dict] = {}  # and its last evaluated one
    passed = dict.fromkeys(positions, 0)  # how many of each node's entries are at or before the point
    last = -float("inf")  # when the last entry counted happened
    for point in points:
        for i, entries in positions.items():
            k = passed[i]
            while k < len(entries) and entries[k][0] <= point:
                h = reached[i] = entries[k][1]
                if h["global_accuracy"] is not None:
                    latest[i] = h
                last = max(last, h["time"])
                k += 1
            passed[i] = k
        if len(latest) < len(positions):
            continue
        evaluated = {i: latest[i] for i in positions}  # in the nodes' order: the means add up as they always did
        series = {name: SeriesRecord(**_averaged({i: h["series"][name] for i, h in evaluated.items()}))
                  for name in next(iter(evaluated.values())).get("series", {})}
        history.append(EvalRecord(round=point, **_averaged(evaluated), series=series,
                                  bytes_transmitted=sum(h.get("bytes_received", 0) for h in reached.values()),
                                  wall_time_s=max(0.0, last - started)))
    return history


def _averaged(accuracies: dict[str, dict]) -> dict:
    """The fleet's mean global and local accuracy, and each node's, from one entry (or series entry) per node."""
    per_global = {i: a["global_accuracy"] for i, a in accuracies.items()}
    per_local = {i: a["local_accuracy"] for i, a in accuracies.items()}
    return {"global_accuracy": sum(per_global.values()) / len(per_global), "per_node_global": per_global,
            "local_accuracy": sum(per_local.values()) / len(per_local), "per_node_local": per_local}


LINK_COUNTERS = ("transfers_cut", "bytes_resent", "groups_replanned")  # what its links cost a fleet


def fleet_result(driver: str, statuses: dict[str, dict], histories: dict[str, list[dict]], config: ExperimentConfig,
                 algorithm: str, train_sizes: dict[str, int], started: float, ended: float) -> RunResult:
    """A fleet's result from each node's ``/status`` and ``/history`` (as JSON), in the results schema;
    ``started``/``ended`` on the nodes' clock (a simulated fleet's is virtual).

    ``rounds`` and the curve's points (0, every ``eval_every``-th and the last) count what the fleet did
    (see :func:`fleet_rounds`), so an async run, or a round run that stopped early, is never reported as
    the configured T rounds.
    """
    mode, rounds = fleet_rounds(statuses)
    results = [
        NodeResult(id=node_id, global_accuracy=status["global_accuracy"], local_accuracy=status["local_accuracy"],
                   param_sha256=status["param_sha256"], num_train=train_sizes[node_id],
                   epsilon=(status.get("privacy") or {}).get("epsilon"),
                   models_sent=status["models_sent"], models_received=status["models_received"],
                   model=status["model"], rejected=status.get("rejected", {}),
                   **{counter: status.get(counter, 0) for counter in LINK_COUNTERS}, **_reach(status))
        for node_id, status in statuses.items()
    ]
    points = sorted({*range(0, rounds + 1, config.eval_every), rounds})
    from dfl_node.learning.tasks import task_of  # noqa: PLC0415 - torch only where a result is made

    task = task_of(config.learning)
    return RunResult(
        driver=driver, algorithm=algorithm, task=task.name, metric=task.metric, mode=mode,
        config=config.flat(mode="json"), rounds=rounds,
        history=accuracy_curve(fleet_positions(histories, mode), points, started), nodes=results,
        bytes_transmitted=sum(s["bytes_sent"] for s in statuses.values()),
        models_transmitted=sum(s["models_sent"] for s in statuses.values()), wall_time_s=ended - started,
        **{counter: sum(getattr(n, counter) for n in results) for counter in LINK_COUNTERS},
        relays=relay_figures(results),
    )


def _reach(status: dict) -> dict:
    """A node's reachability and what it carried as a relay, from its ``/status``."""
    relaying = status.get("relaying") or {}
    return {"reachability": status.get("reachability", ""), "relay": status.get("relay"),
            "relayed_bytes": relaying.get("bytes", 0), "relayed_connections": relaying.get("connections", 0)}


def relay_figures(nodes: list[NodeResult]) -> dict[str, int] | None:
    """What relaying cost a fleet (None: no node was relayed or relayed): nodes relayed, by how many relays, the
    most one relay held, and the bytes and connections the relays carried."""
    relayed = [n for n in nodes if n.relay]
    if not relayed and not any(n.relayed_bytes for n in nodes):
        return None
    per_relay = Counter(n.relay for n in relayed)
    return {"nodes_relayed": len(relayed), "relays": len(per_relay), "most_on_one_relay": max(per_relay.values(),
                                                                                              default=0),
            "bytes_relayed": sum(n.relayed_bytes for n in nodes),
            "connections_relayed": sum(n.relayed_connections for n in nodes),
            "unreachable": sum(n.reachability == "unreachable" for n in nodes)}
