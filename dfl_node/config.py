"""The settings, as pydantic models shared by the simulator, the testbed and the daemon: each one's
meaning, documented default and valid values (names checked against the package's registries).

How a node learns (:class:`LearningConfig`) is :mod:`dfl_node.learning.settings`, below the algorithms
that take it; this module re-exports it and adds what names the algorithms (:data:`AlgorithmName`,
:class:`ExperimentConfig`), so it imports them and they never import it.

Where values come from (flags, ``DFL_*`` variables, config files) and how a bad one is reported is
:mod:`dfl_node.config_loader`; this module only says what a valid configuration is (a mistake found at run
time is :class:`dfl_node.errors.OperatorError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.dataset_refs import BUILTIN_DATASETS, check_dataset, dataset_names, dataset_problem
from dfl_node.learning.settings import LearningConfig, ModelName, ModelSpecText
from dfl_node.registered import Registered, registry_of
from dfl_node.sim_config import DeviceClass, FaultSchedule, LinkClass


def _algorithms() -> Iterable[str]:
    from dfl_node.algorithms import algorithm_names  # noqa: PLC0415 - keeps torch out of reading settings

    return algorithm_names()


@dataclass(frozen=True)
class DatasetRef(Registered):
    """A dataset setting: a registered name (built-in or an installed plugin, offered by ``--help``), or one of the
    user's own (:mod:`dfl_node.learning.dataset_refs`): a path, or ``package.module:factory``."""

    def check(self, value: str) -> str:
        return check_dataset(value)

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "examples": self.names()}


def _partitions() -> Iterable[str]:
    from dfl_node.learning.partitions import PARTITIONS  # noqa: PLC0415 - keeps numpy out of reading settings

    return PARTITIONS


WireDtype = Literal["exact", "float16", "int8"]  # how models' floating tensors travel: dfl_node.peering.wire_dtypes
WIRE_DTYPE_HELP = ("how models' floating tensors travel: exact (as the model holds them), float16, or int8 (a "
                   "symmetric scale per tensor): 1/2 or 1/4 of float32's bytes, for slow links, at some accuracy; "
                   "the same on every node of a swarm (peers that differ refuse each other at Hello)")

AlgorithmName = Annotated[str, Registered("algorithm", _algorithms)]
DatasetName = Annotated[str, DatasetRef("dataset", dataset_names)]
PartitionName = Annotated[str, Registered("partition", _partitions)]


class ExperimentConfig(LearningConfig, DataFormat):
    """A simulated (or testbed) experiment: data, fleet size, algorithms and schedule."""

    name: str = Field("experiment", description="title of the run in tables and results files")
    dataset: DatasetName = Field("digits", description="dataset: digits (embedded), mnist, fashion_mnist or cifar10 "
                                 "(read from data_dir), an installed dfl_node.datasets plugin, package.module:factory, "
                                 "or your own: a .csv or .npz file or a folder of them (docs/data.md)")
    data_dir: Path | None = Field(None, description="folder with dataset files (else $DFL_DATA_DIR)")
    partition: PartitionName = Field("iid", description="how the training data is split across the nodes")
    zeta: int = Field(2, ge=1, description="ζ: segments (shards) or classes per client")
    beta: float = Field(0.5, gt=0, description="β of the Dirichlet partition")
    zeta_max: int = Field(0, ge=0, description="classes partitions: client k holds ζ_k classes drawn from "
                          "zeta..zeta_max (002: 2..4); 0: every client holds zeta")
    samples: int = Field(0, ge=0, description="iid and classes: samples per client before the validation split "
                         "(002's balanced 800); 0: the partition shares out the whole training set")
    large_nodes: int = Field(2, ge=0, description="unbalanced partitions: clients holding 10,000 samples (002: 2 in "
                             "the non-IID case)")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="share of each client's data held out for local "
                                "validation")
    train_samples: int = Field(0, ge=0, description="the fleet shares a seeded random subset of this many training "
                               "samples (0: the whole training set), for CPU-sized reproductions")
    test_samples: int = Field(0, ge=0, description="global test set: a seeded random subset of this many test samples "
                              "(0: all)")
    algorithms: list[AlgorithmName] = Field(default_factory=lambda: ["defkt", "fullavg", "combo"],
                                            description="algorithms to run, one after the other on the same data "
                                            "(built-ins, or installed plugins: `dfl-node plugins`)")
    nodes: int = Field(10, ge=2, description="K: number of clients")
    rounds: int = Field(100, ge=1, description="T: rounds")
    eval_every: int = Field(10, ge=1, description="evaluate every n rounds (and after the last)")
    architectures: list[ModelSpecText] = Field(default_factory=list, description="per-node architectures as registry "
                                               "specs NAME[:W1,W2,...] (e.g. cnn-ln:32,64), spread evenly: node i runs "
                                               "entry i mod A; empty: every node runs model/hidden")
    # a simulated fleet of real nodes (dfl-node simulate): see dfl_node.sim_config
    devices: dict[str, DeviceClass] = Field(default_factory=dict, description="simulate: device classes by "
                                            "name, what computation costs on each")
    links: dict[str, LinkClass] = Field(default_factory=dict, description="simulate: link classes by name, "
                                        "what a transfer costs on each (\"default\": nodes of no class)")
    faults: FaultSchedule = Field(default_factory=FaultSchedule, description="simulate: kills and "
                                  "partitions, in virtual seconds")
    wire_dtype: WireDtype = Field("exact", description=WIRE_DTYPE_HELP)

    @model_validator(mode="after")
    def _dataset_defaults(self) -> ExperimentConfig:
        """Batch sizes and learning rate not given are the dataset's (:data:`~dfl_node.learning.settings.PER_DATASET`):
        the simulator, a testbed's daemons (which get them as ``DFL_*``) and the results file then see the same. A
        dataset of the user's own has them sized to it once it is read (:func:`~dfl_node.learning.fleet.provision`)."""
        if self.dataset in BUILTIN_DATASETS:
            self.use_dataset_defaults(self.dataset)
        return self

    def unusable_here(self) -> dict[str, str]:
        """As :meth:`LearningConfig.unusable_here`, and a dataset this machine cannot read
        (:func:`~dfl_node.learning.dataset_refs.dataset_problem`)."""
        problems = super().unusable_here()
        found = dataset_problem(self.dataset, self.data_dir)
        if found is not None:
            problems[found[0]] = found[1]
        return problems

    @model_validator(mode="after")
    def _mixed_fleets_need_algorithms_that_fuse_them(self) -> ExperimentConfig:
        if len(set(self.architectures)) > 1:
            from dfl_node.algorithms import ALGORITHMS, algorithm_class  # noqa: PLC0415 - torch out of settings

            same_only = [a for a in self.algorithms if algorithm_class(a).architectures == "identical"]
            if same_only:
                raise ValueError(f"{', '.join(same_only)} fuse identical architectures only; a fleet of "
                                 f"{len(set(self.architectures))} architectures needs an algorithm that fuses others "
                                 f"({', '.join(n for n, a in ALGORITHMS.items() if a.architectures == 'any')})")
        return self


__all__ = ["AlgorithmName", "DatasetName", "ExperimentConfig", "LearningConfig", "ModelName", "ModelSpecText",
           "PartitionName", "Registered", "registry_of"]
