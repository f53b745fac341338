"""Configuration as pydantic models, shared by the simulator, the testbed and the daemon.

Precedence (design §4): CLI flags > environment variables (``DFL_<FIELD>``) > config file
(YAML or TOML) > the documented defaults below. :func:`load_config` applies it for any model.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

AlgorithmName = Literal["defkt", "fullavg", "combo"]
PartitionName = Literal["iid", "shards", "classes", "dirichlet", "unbalanced"]
DatasetName = Literal["digits", "mnist", "fashion_mnist", "cifar10"]


class LearningConfig(BaseModel):
    """How a node learns and fuses; identical on every node of a fleet and in the simulator."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("mlp", description="architecture from the model registry (mlp, cnn)")
    hidden: list[int] | None = Field(None, description="layer widths overriding the architecture's default")
    seed: int = Field(0, description="seed of w0, the round plans and every minibatch order")
    pairs: int = Field(1, ge=1, description="Q: sender/receiver pairs per round")
    local_epochs: int = Field(1, ge=1, description="M: local passes of a sender (000 eq. 1)")
    batch_size: int = Field(200, ge=1, description="B1: local training batch size")
    lr: float = Field(0.01, gt=0, description="local learning rate (also η1 = η2 of MKT unless mkt_lr is set)")
    momentum: float = Field(0.5, ge=0, description="SGD momentum")
    mkt_epochs: int = Field(1, ge=1, description="E: passes of mutual knowledge transfer over the receiver's data")
    mkt_batch_size: int = Field(200, ge=1, description="B2: MKT batch size")
    mkt_lr: float | None = Field(None, gt=0, description="η1 = η2 of MKT; defaults to lr")
    segments: int = Field(2, ge=2, description="S: Combo's number of model segments")
    sender_keeps_trained: bool | None = Field(
        None, description="sender stores its trained model (001's variant); default per algorithm: Combo yes, else no"
    )
    threads: int = Field(1, ge=1, description="torch threads (1 per node process keeps testbeds fast)")


class ExperimentConfig(LearningConfig):
    """A simulated (or testbed) experiment: data, fleet size, algorithms and schedule."""

    name: str = "experiment"
    dataset: DatasetName = "digits"
    data_dir: Path | None = Field(None, description="folder with dataset files (else $DFL_DATA_DIR)")
    partition: PartitionName = "iid"
    zeta: int = Field(2, ge=1, description="ζ: segments (shards) or classes per client")
    beta: float = Field(0.5, gt=0, description="β of the Dirichlet partition")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="share of each client's data held out for local validation")
    algorithms: list[AlgorithmName] = Field(default_factory=lambda: ["defkt", "fullavg", "combo"])
    nodes: int = Field(10, ge=2, description="K: number of clients")
    rounds: int = Field(100, ge=1, description="T: rounds")
    eval_every: int = Field(10, ge=1, description="evaluate every n rounds (and after the last)")


Model = TypeVar("Model", bound=BaseModel)


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a YAML or TOML config file into a dict (empty file → empty dict)."""
    text = path.read_text()
    data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def env_overrides(model: type[BaseModel], prefix: str = "DFL_") -> dict[str, Any]:
    """``DFL_<FIELD>`` variables for the model's fields; lists are comma-separated."""
    found: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        raw = os.environ.get(prefix + name.upper())
        if raw is None:
            continue
        is_list = "list" in str(field.annotation)
        found[name] = [v for v in raw.split(",") if v] if is_list else raw
    return found


def load_config(
    model: type[Model],
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    preset: dict[str, Any] | None = None,
) -> Model:
    """Field defaults < ``preset`` < file < environment < ``overrides`` (CLI flags; ``None`` values are ignored)."""
    data: dict[str, Any] = dict(preset or {})
    data.update(read_config_file(path) if path else {})
    data.update(env_overrides(model))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        where = f" (from {path})" if path else ""
        raise ValueError(f"invalid configuration{where}:\n{exc}") from exc
