"""How an experiment draws its fleet's data and splits it into one shard per node (:class:`ShardSettings`): the
dataset, the partition and its parameters, the share held out for validation, CPU-sized subsets, and how a
user's files are read. The simulator, the testbed and ``dfl-node partition`` provision from these
(:func:`~dfl_node.learning.provision.provision`); the rest of an experiment's settings is
:class:`~dfl_node.settings.experiment.ExperimentConfig`'s.

In the learning layer, beside the data it describes, so that provisioning reads settings without importing
anything above it. Plain pydantic: reading settings imports neither torch nor numpy (the registries of datasets
and partitions are read when a value is checked).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.dataset_refs import check_dataset, dataset_kind, dataset_names, dataset_problem
from dfl_node.registered import Registered

# A recorded fleet run as it was recorded: the dataset's folder holds one subfolder (or file) per device, and each
# device is a node (:func:`~dfl_node.learning.user_datasets.load_recorded`); no partition of pooled data.
AS_RECORDED = "as-recorded"
# The partitions that deal out samples, not classes: those a task without classes (regression, anomaly) takes
CLASSLESS_PARTITIONS = ("iid", "unbalanced", AS_RECORDED)


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

    return (*PARTITIONS, AS_RECORDED)


DatasetName = Annotated[str, DatasetRef("dataset", dataset_names)]
PartitionName = Annotated[str, Registered("partition", _partitions)]


class ShardSettings(DataFormat):
    """The fleet's data: which dataset, read how (:class:`DataFormat`), split how."""

    dataset: DatasetName = Field("digits", description="dataset: digits (embedded), mnist, fashion_mnist or cifar10 "
                                 "(read from data_dir), an installed dfl_node.datasets plugin, package.module:factory, "
                                 "or your own: a .csv or .npz file or a folder of them (docs/data.md)")
    data_dir: Path | None = Field(None, description="folder with dataset files (else $DFL_DATA_DIR)")
    partition: PartitionName = Field("iid", description="how the training data is split across the nodes; "
                                     "as-recorded: a folder of devices (a subfolder or file each), one node each, "
                                     "as recorded")
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

    @model_validator(mode="after")
    def _as_recorded_reads_a_folder_of_devices(self) -> ShardSettings:
        """``as-recorded`` keeps each device's data as it was recorded: it reads a folder of them, and has no pooled
        training set to draw a subset of (``train_samples``) nor a number of samples to give each node
        (``samples``), which it would otherwise ignore."""
        if self.partition != AS_RECORDED:
            return self
        if dataset_kind(self.dataset) != "path" or Path(self.dataset).is_file():
            raise ValueError(f"partition {AS_RECORDED} reads a folder of recorded devices (a subfolder or a data file "
                             f"each); dataset {self.dataset} is none")
        sized = [f"--{name.replace('_', '-')}" for name in ("samples", "train_samples") if getattr(self, name)]
        if sized:
            raise ValueError(f"{' and '.join(sized)}: partition {AS_RECORDED} keeps every device's samples as "
                             "recorded; leave it out")
        return self

    def unusable_here(self) -> dict[str, str]:
        """A dataset this machine cannot read (:func:`~dfl_node.learning.dataset_refs.dataset_problem`), by setting."""
        found = dataset_problem(self.dataset, self.data_dir)
        return {found[0]: found[1]} if found is not None else {}
