"""The results schema shared by ``dfl-node simulate`` and ``dfl-node testbed``.

Both drivers write the same JSON (and CSV), so runs of the simulator and of a real fleet can be
compared and plotted together, and the equivalence test compares them field by field.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import fmean

from pydantic import BaseModel, Field


class EvalRecord(BaseModel):
    """Averaged accuracies after ``round`` rounds (000's "averaged global/local accuracy")."""

    round: int
    global_accuracy: float
    local_accuracy: float
    per_node_global: dict[str, float]
    per_node_local: dict[str, float]
    bytes_transmitted: int
    wall_time_s: float


class NodeResult(BaseModel):
    id: str
    global_accuracy: float
    local_accuracy: float
    param_sha256: str
    num_train: int
    models_sent: int = 0
    models_received: int = 0


class RunResult(BaseModel):
    driver: str = Field(description="simulate or testbed")
    algorithm: str
    mode: str = Field("round", description="round (simulate, testbed) or async (testbed)")
    config: dict
    rounds: int = Field(description="what the run did: rounds reached, or in async mode completed exchanges (fusions)")
    history: list[EvalRecord]
    nodes: list[NodeResult]
    bytes_transmitted: int
    models_transmitted: int
    wall_time_s: float

    @property
    def global_accuracy(self) -> float:
        return fmean(n.global_accuracy for n in self.nodes)

    @property
    def local_accuracy(self) -> float:
        return fmean(n.local_accuracy for n in self.nodes)


def write_results(result: RunResult, out_dir: Path) -> tuple[Path, Path]:
    """``<algorithm>.json`` (everything) and ``<algorithm>.csv`` (the accuracy curve)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / f"{result.algorithm}.json", out_dir / f"{result.algorithm}.csv"
    payload = result.model_dump(mode="json")
    payload["global_accuracy"], payload["local_accuracy"] = result.global_accuracy, result.local_accuracy
    json_path.write_text(json.dumps(payload, indent=1))
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", "global_accuracy", "local_accuracy", "bytes_transmitted", "wall_time_s"])
        for r in result.history:
            writer.writerow([r.round, f"{r.global_accuracy:.6f}", f"{r.local_accuracy:.6f}", r.bytes_transmitted, f"{r.wall_time_s:.3f}"])
    return json_path, csv_path


def read_results(path: Path) -> RunResult:
    return RunResult.model_validate(json.loads(path.read_text()))
