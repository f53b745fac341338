"""The results schema shared by ``dfl-node simulate`` and ``dfl-node testbed``.

Both drivers write the same JSON (and CSV), so runs of the simulator and of a real fleet can be
compared and plotted together, and the equivalence test compares them field by field.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import fmean
from typing import Any

from pydantic import BaseModel, Field, computed_field

# 002's Tables 4–5 count nodes below/over these local accuracies (E-MNIST 92/96 % and 80/90 %, CIFAR-10 55/65 %)
FAIRNESS_THRESHOLDS = (0.55, 0.65, 0.80, 0.90, 0.92, 0.96)
HISTOGRAM_BINS = 20  # 5 % wide, over [0, 1]


class SeriesRecord(BaseModel):
    """Another model of every node evaluated at the same point (DFML's regular models beside its peak models,
    FML's meme models beside the local ones): ``Algorithm.reported_models`` names them."""

    global_accuracy: float
    local_accuracy: float
    per_node_global: dict[str, float]
    per_node_local: dict[str, float]


class EvalRecord(BaseModel):
    """Averaged accuracies after ``round`` rounds (000's "averaged global/local accuracy")."""

    round: int
    global_accuracy: float
    local_accuracy: float
    per_node_global: dict[str, float]
    per_node_local: dict[str, float]
    bytes_transmitted: int
    wall_time_s: float
    series: dict[str, SeriesRecord] = Field(default_factory=dict, description="other reported models, by name")


def _absent(value: object) -> bool:
    """An optional figure a run did not measure is left out of the results (not written as null): a run without
    the option writes what it wrote before the option existed."""
    return value is None


class MembershipInference(BaseModel):
    """A curious member's membership-inference attack on one node's final model (``privacy_audit``;
    :mod:`dfl_node.learning.membership_inference`, docs/privacy.md): the loss threshold over the node's training
    samples (members) against as many samples it never trained on (non-members)."""

    attacker: str = Field(description="the curious member: the next node in id order, which received the model")
    held_out: str = Field(description="where the non-members came from: the node's validation split, or the global "
                          "test set where that split is too small")
    samples: int = Field(description="members, and as many non-members, compared (the FPR's resolution: 1/samples)")
    auc: float = Field(description="ROC AUC of the attack's score (−loss), members against non-members: 0.5 is "
                       "chance")
    tpr_at_1pct_fpr: float = Field(description="the share of members flagged by the lowest threshold that flags at "
                                   "most 1 % of the non-members (with under 100 non-members: none of them)")
    advantage: float = Field(description="TPR − FPR of the threshold the attacker calibrated on its own data, on "
                             "this node's samples (Yeom's membership advantage: 0 is chance, 1 total)")


class MembershipInferenceSummary(BaseModel):
    """The fleet's nodes under the attack (:class:`MembershipInference`), in a line."""

    nodes: int = Field(description="nodes attacked (those up at the end)")
    mean_auc: float
    max_auc: float
    mean_tpr_at_1pct_fpr: float
    mean_advantage: float


def inference_summary(attacked: list[MembershipInference]) -> MembershipInferenceSummary:
    """The mean and worst AUC, mean TPR at 1 % FPR and mean advantage over ``attacked`` (one per node)."""
    if not attacked:
        raise ValueError("no node attacked")
    return MembershipInferenceSummary(nodes=len(attacked), mean_auc=fmean(a.auc for a in attacked),
                                      max_auc=max(a.auc for a in attacked),
                                      mean_tpr_at_1pct_fpr=fmean(a.tpr_at_1pct_fpr for a in attacked),
                                      mean_advantage=fmean(a.advantage for a in attacked))


class NodeResult(BaseModel):
    id: str
    global_accuracy: float
    local_accuracy: float
    param_sha256: str
    num_train: int
    epsilon: float | None = Field(None, description="differential privacy: ε the node spent on its data by the end, "
                                  "at the run's dp_delta (None: no differential privacy)")
    models_sent: int = 0
    models_received: int = 0
    model: str = Field("", description="the node's architecture (registry spec)")
    rejected: dict[str, int] = Field(default_factory=dict, description="what the node refused, by reason")
    transfers_cut: int = Field(0, description="model streams a link cut mid-way, at either end (resumed where they "
                               "could be)")
    bytes_resent: int = Field(0, description="bytes the node sent again because a stream was cut")
    groups_replanned: int = Field(0, description="round mode, as holder: groups planned around after they kept failing")
    reachability: str = Field("", description="how peers reached the node at the end: direct, relayed, unreachable")
    relay: str | None = Field(None, description="the member that relayed it (behind NAT)")
    relayed_bytes: int = Field(0, description="bytes it carried as a relay for others, both ways")
    relayed_connections: int = Field(0, description="connections it carried as a relay for others")
    membership_inference: MembershipInference | None = Field(None, exclude_if=_absent, description="simulate "
                                                             "--privacy-audit: a curious member's attack on its final "
                                                             "model")


class ThresholdCount(BaseModel):
    threshold: float
    below: int = Field(description="nodes whose final local accuracy is below the threshold")
    over: int = Field(description="nodes at or over it")


class Fairness(BaseModel):
    """002's fairness view of a run: how the nodes' final *local* accuracies are distributed."""

    bin_edges: list[float] = Field(description="histogram bin edges (the last bin includes 1.0)")
    histogram: list[int] = Field(description="nodes per bin")
    thresholds: list[ThresholdCount]
    min: float
    max: float
    std: float = Field(description="population standard deviation of the local accuracies")
    worst_decile: float = Field(description="mean local accuracy of the worst 10 % of nodes (at least one node)")


def fairness(local_accuracies: list[float]) -> Fairness:
    """The distribution of ``local_accuracies`` (one per node): histogram, threshold counts, spread."""
    values = sorted(local_accuracies)
    if not values:
        raise ValueError("no nodes")
    edges = [i / HISTOGRAM_BINS for i in range(HISTOGRAM_BINS + 1)]
    histogram = [0] * HISTOGRAM_BINS
    for v in values:
        histogram[min(HISTOGRAM_BINS - 1, int(v * HISTOGRAM_BINS))] += 1
    mean = fmean(values)
    worst = values[: max(1, len(values) // 10)]
    return Fairness(bin_edges=edges, histogram=histogram,
                    thresholds=[ThresholdCount(threshold=t, below=sum(v < t for v in values),
                                               over=sum(v >= t for v in values)) for t in FAIRNESS_THRESHOLDS],
                    min=values[0], max=values[-1], std=fmean((v - mean) ** 2 for v in values) ** 0.5,
                    worst_decile=fmean(worst))


class RunResult(BaseModel):
    driver: str = Field(description="simulate or testbed")
    algorithm: str
    task: str = Field("classification", description="what the fleet learned (dfl_node.learning.tasks)")
    metric: str = Field("accuracy", description="the task's headline metric, which every *_accuracy figure of the "
                        "results holds (rmse for regression, auc for anomaly): one schema for every task, so that "
                        "results read, plot and compare alike")
    mode: str = Field("round", description="round (simulate, testbed) or async (testbed)")
    config: dict
    rounds: int = Field(description="what the run did: rounds reached, or in async mode completed exchanges (fusions)")
    history: list[EvalRecord]
    nodes: list[NodeResult]
    bytes_transmitted: int
    models_transmitted: int
    bytes_resent: int = Field(0, description="of bytes_transmitted, those sent again because a link cut a stream")
    transfers_cut: int = Field(0, description="model streams a link cut, counted at both ends")
    groups_replanned: int = Field(0, description="round mode: groups planned around after they kept failing (a link "
                                  "that could not carry their model, a member too slow for its deadline)")
    relays: dict[str, int] | None = Field(None, description="a fleet with nodes behind NAT: how many were relayed, "
                                          "by how many relays, and what the relays carried (docs/nat.md)")
    wall_time_s: float = Field(description="seconds the run took; a simulated fleet's: virtual seconds, as its "
                                           "curve's wall_time_s")
    faults: dict[str, Any] | None = Field(None, description="a simulated fleet's faults and what they cost "
                                                            "(dfl_node.sim.faults.fault_figures)")
    membership: dict[str, Any] | None = Field(None, description="a simulated fleet's membership: messages and "
                                              "bytes per node and second, suspicions, detection and join times "
                                              "(dfl_node.sim.membership)")
    device_classes: dict[str, dict[str, Any]] | None = Field(None, description="a simulated fleet's device "
                                                             "classes: nodes, fusions, mean final accuracies")
    adversaries: dict[str, str] = Field(default_factory=dict, description="a simulated fleet's compromised nodes "
                                        "and the attack each played (KIND:FRACTION[:STRENGTH]); honest_* leave "
                                        "them out")
    membership_inference: MembershipInferenceSummary | None = Field(None, exclude_if=_absent, description="simulate "
                                                                    "--privacy-audit: the nodes' attacks summed up")

    @property
    def global_accuracy(self) -> float:
        return fmean(n.global_accuracy for n in self.nodes)

    @property
    def local_accuracy(self) -> float:
        return fmean(n.local_accuracy for n in self.nodes)

    @property
    def honest(self) -> list[NodeResult]:
        """The nodes that played no attack (all, in a fleet without adversaries)."""
        return [n for n in self.nodes if n.id not in self.adversaries]

    @computed_field  # type: ignore[prop-decorator]  # written with every result; ignored when a result is read back
    @property
    def honest_global_accuracy(self) -> float:
        """The honest nodes' mean final global accuracy: what a fleet with adversaries achieved for its members."""
        return fmean(n.global_accuracy for n in self.honest)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def honest_local_accuracy(self) -> float:
        return fmean(n.local_accuracy for n in self.honest)

    @computed_field  # type: ignore[prop-decorator]  # written with every result; ignored when a result is read back
    @property
    def fairness(self) -> Fairness:
        """The distribution of the nodes' final local accuracies (002's Figs. 3–10, Tables 4–5)."""
        return fairness([n.local_accuracy for n in self.nodes])


def write_results(result: RunResult, out_dir: Path) -> tuple[Path, Path]:
    """``<algorithm>.json`` (everything) and ``<algorithm>.csv`` (the accuracy curve)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / f"{result.algorithm}.json", out_dir / f"{result.algorithm}.csv"
    payload = result.model_dump(mode="json")
    payload["global_accuracy"], payload["local_accuracy"] = result.global_accuracy, result.local_accuracy
    payload["clusters"] = cluster_accuracy(result)
    json_path.write_text(json.dumps(payload, indent=1))
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", f"global_{result.metric}", f"local_{result.metric}", "bytes_transmitted",
                         "wall_time_s"])
        for r in result.history:
            writer.writerow([r.round, f"{r.global_accuracy:.6f}", f"{r.local_accuracy:.6f}", r.bytes_transmitted,
                             f"{r.wall_time_s:.3f}"])
    return json_path, csv_path


def read_results(path: Path) -> RunResult:
    return RunResult.model_validate(json.loads(path.read_text()))


def cluster_accuracy(run: RunResult, record: EvalRecord | None = None) -> dict[str, float]:
    """003 Fig. 5: the mean global accuracy of each architecture cluster (the nodes running one spec) at
    ``record`` (default: the last evaluation), clusters in the order of the nodes (of ``architectures``)."""
    record = record or run.history[-1]
    clusters: dict[str, list[float]] = {}
    for node in run.nodes:
        if node.id in record.per_node_global:
            clusters.setdefault(node.model or run.config.get("model", ""), []).append(record.per_node_global[node.id])
    return {model: fmean(accs) for model, accs in clusters.items()}


def rounds_to_reach(run: RunResult, target: float) -> int | None:
    """003 Table 8: the first evaluated round at which the averaged global accuracy reaches ``target``."""
    return next((r.round for r in run.history if r.global_accuracy >= target), None)


def comparison(runs: list[RunResult], baseline: str) -> dict:
    """Every run against ``baseline`` (an algorithm among ``runs``): final accuracies, clusters, and the rounds
    each needs to reach the global accuracy the baseline has after its last round R (003 Table 8), with the
    speed-up R / those rounds."""
    base = next((r for r in runs if r.algorithm == baseline), None)
    if base is None:
        raise ValueError(f"no run of {baseline!r} among {', '.join(r.algorithm for r in runs)}")
    target, horizon = base.history[-1].global_accuracy, base.history[-1].round
    rows = {}
    for run in runs:
        reached = rounds_to_reach(run, target)
        rows[run.algorithm] = {
            "global_accuracy": run.history[-1].global_accuracy, "local_accuracy": run.history[-1].local_accuracy,
            "series": {name: s.global_accuracy for name, s in run.history[-1].series.items()},
            "clusters": cluster_accuracy(run), "rounds": run.rounds, "rounds_to_baseline_final": reached,
            "speedup": horizon / reached if reached else None,
        }
    return {"baseline": baseline, "baseline_final_global_accuracy": target, "runs": rows}
