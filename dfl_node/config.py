"""The settings, as pydantic models shared by the simulator, the testbed and the daemon: each one's
meaning, documented default and valid values (names checked against the package's registries).

Where values come from (flags, ``DFL_*`` variables, config files) and how a bad one is reported is
:mod:`dfl_node.config_loader`; this module only says what a valid configuration is. It also holds
:class:`OperatorError`, the run-time counterpart of a settings error that the CLI reports in one line.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema


@dataclass(frozen=True)
class Registered:
    """Marks a ``str`` setting that must name an entry of one of the package's registries.

    The registry is the one declaration of the names: it is read whenever a value is checked, a JSON
    schema is drawn or a verb's ``--help`` lists the choices, so registering an algorithm (a dataset, a
    partition, a model) is all it takes for every verb, ``DFL_*`` variable and config file to accept it.
    ``lookup`` imports the registry only when called, since the registries' packages import this
    module (every algorithm takes a :class:`LearningConfig`).
    """

    kind: str
    lookup: Callable[[], Iterable[str]]

    def names(self) -> list[str]:
        return sorted(self.lookup())

    def check(self, value: str) -> str:
        """The value, if registered; else the one-line problem that
        :func:`~dfl_node.config_loader.describe_problem` reports."""
        names = self.names()
        if value not in names:
            raise ValueError(f"unknown {self.kind} {value!r}; available: {', '.join(names)}")
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "enum": self.names()}


def _algorithms() -> Iterable[str]:
    from dfl_node.algorithms import ALGORITHMS  # noqa: PLC0415 - it imports this module

    return ALGORITHMS


def _datasets() -> Iterable[str]:
    from dfl_node.learning.datasets import DATASETS  # noqa: PLC0415 - keeps torch out of reading settings

    return DATASETS


def _partitions() -> Iterable[str]:
    from dfl_node.learning.partitions import PARTITIONS  # noqa: PLC0415 - keeps numpy out of reading settings

    return PARTITIONS


def _models() -> Iterable[str]:
    from dfl_node.learning.models import available_models  # noqa: PLC0415 - keeps torch out of reading settings

    return available_models()


def _model_spec(value: str) -> str:
    """An architecture spec (``cnn-ln:32,64``) that the model registry can build, in its normal spelling."""
    from dfl_node.learning.models import ModelSpec  # noqa: PLC0415 - keeps torch out of reading settings

    return str(ModelSpec.parse(value))


AlgorithmName = Annotated[str, Registered("algorithm", _algorithms)]
DatasetName = Annotated[str, Registered("dataset", _datasets)]
PartitionName = Annotated[str, Registered("partition", _partitions)]
ModelName = Annotated[str, Registered("model", _models)]
ModelSpecText = Annotated[str, AfterValidator(_model_spec)]


def registry_of(field: FieldInfo) -> Registered | None:
    """The registry a field's values come from (for ``list[AlgorithmName]``, its items'), if any: the CLI
    offers its names as the flag's choices."""
    return _find_registered([*field.metadata, field.annotation])


def _find_registered(items: Iterable[object]) -> Registered | None:
    for item in items:
        found = item if isinstance(item, Registered) else _find_registered(typing.get_args(item))
        if found:
            return found
    return None


class OperatorError(Exception):
    """A mistake of the operator's found at run time (a port in use, a state dir taken, a duplicate id):
    the CLI reports it as one line ``error: …`` and exits 1, without a traceback, which stays for bugs."""


class LearningConfig(BaseModel):
    """How a node learns and fuses; identical on every node of a fleet and in the simulator."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = Field("mlp", description="architecture from the model registry")
    hidden: list[int] | None = Field(None, description="layer widths overriding the architecture's default")
    seed: int = Field(0, description="seed of w0, the round plans and every minibatch order")
    pairs: int = Field(1, ge=1, description="Q: sender/receiver pairs per round")
    supervision: Literal["ce", "wsm"] | None = Field(
        None, description="supervision loss of local training and mutual learning: ce, or 003's WSM (eq. 2, class "
                          "proportions of the data trained on); default per algorithm: wsm for dfml, heterofl, fedrolex "
                          "and feddropout (003), ce for the others (defkt, fullavg, combo always ce)")
    dfml_epochs: int = Field(10, ge=1, description="dfml: K, passes of weighted mutual learning over the aggregator's "
                             "data (003: 10)")
    alpha_max: float = Field(0.9, ge=0, le=1, description="dfml: largest α of the cyclic schedule (003: 0.8, 0.9 or 1.0)")
    alpha_min: float = Field(0.0, ge=0, le=1, description="dfml: smallest α of the cyclic schedule (003: 0)")
    alpha_period: int = Field(10, ge=2, description="dfml: rounds of the first α cycle (003: 10)")
    alpha_period_growth: int = Field(10, ge=0, description="dfml: rounds each completed α cycle adds to the next")
    peak_updates: int = Field(0, ge=0, description="dfml: how many of a cycle's largest α values update peak models "
                              "(0: 1 with 50 % senders or more, else ceil(N / (2|S|)), 003 A.4.6)")
    fml_alpha: float = Field(0.5, ge=0, le=1, description="fml: α of the local model's loss α·CE + (1−α)·KL (004 eq. 3)")
    fml_beta: float = Field(0.5, ge=0, le=1, description="fml: β of the meme model's loss β·CE + (1−β)·KL (004 eq. 3)")
    meme_model: ModelSpecText = Field("cnn-ln:32,64", description="fml: the meme model every node shares, as a "
                                      "registry spec (003 A.4.11: cnn-ln:32,64)")
    fedrolex_roll_largest: bool = Field(True, description="fedrolex: roll the largest participant's units with "
                                        "eq. 9 too (003 Alg. 3). A shift shared by every participant only relabels "
                                        "W_g's units, so this is HeteroFL bit for bit, as 003 Table 4's near-equal "
                                        "figures suggest. Off: W_g is the largest model as it is and the smaller "
                                        "models' windows roll over it (they then meet other units every round)")
    local_epochs: int = Field(1, ge=1, description="M: local passes of a sender (000 eq. 1)")
    batch_size: int = Field(200, ge=1, description="B1: local training batch size")
    lr: float = Field(0.01, gt=0, description="local learning rate (also η1 = η2 of MKT unless mkt_lr is set)")
    momentum: float = Field(0.5, ge=0, description="SGD momentum")
    mkt_epochs: int = Field(1, ge=1, description="E: passes of mutual knowledge transfer over the receiver's data")
    mkt_batch_size: int = Field(200, ge=1, description="B2: MKT batch size")
    mkt_lr: float | None = Field(None, gt=0, description="η1 = η2 of MKT; defaults to lr")
    segments: int = Field(2, ge=2, description="S: Combo's number of model segments")
    sender_keeps_trained: bool | None = Field(
        None, description="sender stores its trained model (001's variant); default per algorithm: Combo and "
                          "defkt-select (001) yes, else no"
    )
    threads: int = Field(1, ge=1, description="torch threads (1 per node process keeps testbeds fast)")
    senders: float = Field(0.5, gt=0, le=1, description="group algorithms (fedavg, fedprox): share of the fleet "
                           "that sends to each round's aggregator (003: 50 %)")
    prox_mu: float = Field(0.01, ge=0, description="μ of FedProx's proximal term μ/2·‖w − w_start‖²")
    selection: Literal["random", "probe-samples", "class-profile"] = Field(
        "class-profile", description="defkt-select (001): how a sender picks its receiver. random: 001's Def-KT "
        "(Procedure 1); probe-samples: candidates are scored on the sender's least certain validation samples, "
        "which leave the device (001, Procedure 2: opt-in); class-profile: candidates answer with their per-class "
        "validation accuracy only, no data leaves a device")
    selection_samples: int = Field(20, ge=1, le=256, description="probe-samples: raw samples a sender sends each "
                                   "candidate (at most 256, and at most 512 KiB)")
    selection_candidates: int = Field(0, ge=0, description="defkt-select: candidates a sender probes (0: every node "
                                      "of its share of the fleet)")
    fair_c: float = Field(0.5, description="fairavg (002 eq. 4): the constant C in P_i = (pef_i − pef_j)/(2·pef_max) + C")
    fair_weight_min: float = Field(0.0, ge=0, le=1, description="fairavg: P_i is clipped to [fair_weight_min, "
                                   "fair_weight_max] (then P_j = 1 − P_i, eq. 5)")
    fair_weight_max: float = Field(1.0, ge=0, le=1, description="fairavg: upper clip of P_i")
    fair_data: Literal["val", "train"] = Field("val", description="fairavg: the node's own data pef is measured on "
                                               "(002 uses local accuracy: the validation split)")
    device: Literal["auto", "cpu", "cuda"] = Field("cpu", description="where models and data live: cpu, cuda (an "
                                                   "error where CUDA is absent) or auto (cuda when available)")

    def unusable_here(self) -> dict[str, str]:
        """Settings valid anywhere that this machine cannot honour (field → problem), which
        :func:`~dfl_node.config_loader.load_config` reports as settings errors. A check apart from validation,
        so that a config written elsewhere (a results file, a sweep's grid point) can still be read here."""
        from dfl_node.learning.devices import device_problem  # noqa: PLC0415 - torch only for cuda

        problem = device_problem(self.device)
        return {"device": problem} if problem else {}

    @model_validator(mode="after")
    def _fair_clip_is_an_interval(self) -> LearningConfig:
        if self.fair_weight_min > self.fair_weight_max:
            raise ValueError(f"fair_weight_min {self.fair_weight_min} is above fair_weight_max {self.fair_weight_max}")
        return self


class ExperimentConfig(LearningConfig):
    """A simulated (or testbed) experiment: data, fleet size, algorithms and schedule."""

    name: str = Field("experiment", description="title of the run in tables and results files")
    dataset: DatasetName = Field("digits", description="dataset (digits is embedded, the others read from data_dir)")
    data_dir: Path | None = Field(None, description="folder with dataset files (else $DFL_DATA_DIR)")
    partition: PartitionName = Field("iid", description="how the training data is split across the nodes")
    zeta: int = Field(2, ge=1, description="ζ: segments (shards) or classes per client")
    beta: float = Field(0.5, gt=0, description="β of the Dirichlet partition")
    zeta_max: int = Field(0, ge=0, description="classes partitions: client k holds ζ_k classes drawn from zeta..zeta_max "
                          "(002: 2..4); 0: every client holds zeta")
    samples: int = Field(0, ge=0, description="iid and classes: samples per client before the validation split "
                         "(002's balanced 800); 0: the partition shares out the whole training set")
    large_nodes: int = Field(2, ge=0, description="unbalanced partitions: clients holding 10,000 samples (002: 2 in "
                             "the non-IID case)")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="share of each client's data held out for local validation")
    train_samples: int = Field(0, ge=0, description="the fleet shares a seeded random subset of this many training "
                               "samples (0: the whole training set), for CPU-sized reproductions")
    test_samples: int = Field(0, ge=0, description="global test set: a seeded random subset of this many test samples "
                              "(0: all)")
    algorithms: list[AlgorithmName] = Field(default_factory=lambda: ["defkt", "fullavg", "combo"],
                                            description="algorithms to run, one after the other on the same data")
    nodes: int = Field(10, ge=2, description="K: number of clients")
    rounds: int = Field(100, ge=1, description="T: rounds")
    eval_every: int = Field(10, ge=1, description="evaluate every n rounds (and after the last)")
    architectures: list[ModelSpecText] = Field(default_factory=list, description="per-node architectures as registry specs "
                                     "NAME[:W1,W2,...] (e.g. cnn-ln:32,64), spread evenly: node i runs entry i mod A; "
                                     "empty: every node runs model/hidden")

    @model_validator(mode="after")
    def _mixed_fleets_need_algorithms_that_fuse_them(self) -> ExperimentConfig:
        if len(set(self.architectures)) > 1:
            from dfl_node.algorithms import ALGORITHMS  # noqa: PLC0415 - it imports this module

            same_only = [a for a in self.algorithms if ALGORITHMS[a].architectures == "identical"]
            if same_only:
                raise ValueError(f"{', '.join(same_only)} fuse identical architectures only; a fleet of "
                                 f"{len(set(self.architectures))} architectures needs an algorithm that fuses others "
                                 f"({', '.join(n for n, a in ALGORITHMS.items() if a.architectures == 'any')})")
        return self
