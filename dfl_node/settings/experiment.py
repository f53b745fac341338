"""An experiment's settings (:class:`ExperimentConfig`): a fleet the simulator runs as real nodes, a testbed
starts as daemons, ``dfl-node partition`` and ``sweep`` provision — by part: the fleet's data (``shards``), how
its nodes learn (``learning``) and each algorithm's own settings (``per_algorithm``), what its nodes refuse
(``defences``), the simulator's devices, links, faults and adversaries (``simulation``), and the experiment's own
(its name, algorithms, size and schedule).

Named flat by operators (``--zeta``, ``DFL_ZETA``, ``zeta:``), nested here (``config.shards.zeta``):
:mod:`dfl_node.settings.parts`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, model_validator

from dfl_node.learning.algorithm_settings import (
    AlgorithmOptions,
    DefenceSettings,
    ModelSpecText,
    SharedSettings,
    gates_refusal,
    privacy_refusal,
)
from dfl_node.learning.dataset_refs import BUILTIN_DATASETS
from dfl_node.learning.shard_settings import AS_RECORDED, CLASSLESS_PARTITIONS, ShardSettings
from dfl_node.settings.names import WIRE_DTYPE_HELP, AlgorithmName, WireDtype
from dfl_node.settings.parts import Composite
from dfl_node.settings.simulation import SimulationSettings, adversary_counts


class ExperimentConfig(Composite):
    """A simulated (or testbed) experiment: data, fleet size, algorithms and schedule."""

    parts = ("shards", "learning", "per_algorithm", "defences", "simulation")

    shards: ShardSettings = Field(default_factory=ShardSettings)
    learning: SharedSettings = Field(default_factory=SharedSettings)
    per_algorithm: AlgorithmOptions = Field(default_factory=AlgorithmOptions)
    defences: DefenceSettings = Field(default_factory=DefenceSettings)
    name: str = Field("experiment", description="title of the run in tables and results files")
    algorithms: list[AlgorithmName] = Field(default_factory=lambda: ["defkt", "fullavg", "combo"],
                                            description="algorithms to run, one after the other on the same data "
                                            "(built-ins, or installed plugins: `dfl-node plugins`)")
    nodes: int = Field(10, ge=2, description="K: number of clients")
    rounds: int = Field(100, ge=1, description="T: rounds")
    eval_every: int = Field(10, ge=1, description="evaluate every n rounds (and after the last)")
    architectures: list[ModelSpecText] = Field(default_factory=list, description="per-node architectures as registry "
                                               "specs NAME[:W1,W2,...] (e.g. cnn-ln:32,64), spread evenly: node i runs "
                                               "entry i mod A; empty: every node runs model/hidden")
    simulation: SimulationSettings = Field(default_factory=SimulationSettings)
    wire_dtype: WireDtype = Field("exact", description=WIRE_DTYPE_HELP)

    @model_validator(mode="after")
    def _dataset_defaults(self) -> ExperimentConfig:
        """Batch sizes and learning rate not given are the dataset's
        (:data:`~dfl_node.learning.algorithm_settings.PER_DATASET`): the simulator, a testbed's daemons (which get them
        as ``DFL_*``) and the results file then see the same. A dataset of the user's own has them sized to it once it
        is read (:func:`~dfl_node.learning.provision.provision`)."""
        if self.shards.dataset in BUILTIN_DATASETS:
            self.learning.use_dataset_defaults(self.shards.dataset)
        return self

    @model_validator(mode="after")
    def _a_recorded_fleet_has_a_node_per_device(self, info: ValidationInfo) -> ExperimentConfig:
        """``as-recorded``: one node per device of the dataset's folder, so the fleet's size is the folder's; a
        number of nodes given that differs is a mistake, said before anything runs. A verb's preset (the demo's 10
        nodes) is not given: :func:`~dfl_node.settings.loading.load_config` names its keys in ``info.context``. A
        folder that is not there is left to :meth:`unusable_here`."""
        folder = Path(self.shards.dataset)
        if self.shards.partition != AS_RECORDED or not folder.is_dir():
            return self
        from dfl_node.learning.user_datasets import recorded_devices  # noqa: PLC0415 - torch only for this partition

        count = len(recorded_devices(folder))
        preset = (info.context or {}).get("preset", ())
        if "nodes" in self.model_fields_set and "nodes" not in preset and self.nodes != count:
            raise ValueError(f"--nodes {self.nodes}: dataset {folder} holds {count} devices, a node each (partition "
                             f"{AS_RECORDED}); leave --nodes out")
        if count < 2:
            raise ValueError(f"dataset {folder} holds {count} device{'s' * (count != 1)} (a subfolder of data files, "
                             f"or a data file, each); a fleet needs 2 or more")
        self.nodes = count
        return self

    @model_validator(mode="after")
    def _some_nodes_stay_honest(self) -> ExperimentConfig:
        adversary_counts(self.simulation.adversaries, self.nodes)
        return self

    def unusable_here(self) -> dict[str, str]:
        """The learning settings' (a device this machine lacks) and the data's (a dataset it cannot read)."""
        return {**self.learning.unusable_here(), **self.shards.unusable_here()}

    @model_validator(mode="after")
    def _algorithms_learn_the_task(self) -> ExperimentConfig:
        if self.learning.task != "classification":
            from dfl_node.algorithms import check_task  # noqa: PLC0415 - torch out of settings
            from dfl_node.learning.tasks import task_of  # noqa: PLC0415

            check_task(self.algorithms, self.learning.task)
            if not task_of(self.learning).classes and self.shards.partition not in CLASSLESS_PARTITIONS:
                raise ValueError(f"--partition {self.shards.partition} deals out classes: the {self.learning.task} "
                                 f"task has none; use {', '.join(CLASSLESS_PARTITIONS)}")
        gates_refusal(self.learning.task, relative_gate=self.defences.relative_gate)
        privacy_refusal(self.learning, self.per_algorithm, self.algorithms)
        return self

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
