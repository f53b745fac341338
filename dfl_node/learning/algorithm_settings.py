"""How a node learns and fuses: the settings every algorithm shares (:class:`SharedSettings`, the ``learning``
part of a node's and an experiment's settings) and each algorithm's own, one model per algorithm or family
(:class:`DFMLSettings`, :class:`SelectionSettings`, …), which the algorithm declares as its ``settings_model`` and
reads as its ``settings`` (all of them together: :class:`AlgorithmOptions`, the ``per_algorithm`` part);
identical on every node of a fleet and in the simulator.

They live in the learning layer, below the algorithms, so that the algorithms read their settings without
importing :mod:`dfl_node.settings` (which names the algorithms, and so imports them): no import circle.

A few settings have no value that serves every dataset (:data:`PER_DATASET`): one not given takes the default of
the data it trains on, filled in by :meth:`SharedSettings.use_dataset_defaults` when the config is read (an
experiment's from its ``dataset``, a node's from its shard), so every later reader sees the value in use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from dfl_node.plugins import is_reference
from dfl_node.registered import Registered


def _models() -> Iterable[str]:
    from dfl_node.learning.models import available_models  # noqa: PLC0415 - keeps torch out of reading settings

    return available_models()


def _model_spec(value: str) -> str:
    """An architecture spec (``cnn-ln:32,64``) that the model registry can build, in its normal spelling; a
    ``package.module:factory`` is loaded now (it is this node's own setting)."""
    from dfl_node.learning.models import ModelSpec  # noqa: PLC0415 - keeps torch out of reading settings

    return str(ModelSpec.parse(value, configured=True))


def _model_reference(value: str) -> str | None:
    """A ``package.module:factory`` model, loaded now: a missing module or attribute is the one-line error."""
    return _model_spec(value) if is_reference(value) else None


ModelName = Annotated[str, Registered("model", _models, _model_reference, "package.module:factory")]
BUILTIN_TASK_NAMES = ("classification", "regression", "anomaly")  # dfl_node.learning.tasks.BUILTIN_TASKS' (a test)


def _tasks() -> Iterable[str]:
    from dfl_node.plugins import installed  # noqa: PLC0415 - the entry points only when a task is checked

    return [*BUILTIN_TASK_NAMES, *installed("tasks")]


TaskName = Annotated[str, Registered("task", _tasks)]
ModelSpecText = Annotated[str, AfterValidator(_model_spec)]

# Settings whose default depends on the dataset, where one value cannot serve them all; a dataset not named here
# takes the field's own default, 000's MNIST setting (B = 200, lr 0.01), which the papers' experiments use and the
# simulator reproduces. The embedded digits give a node of a small fleet ~300 samples: batches of 200 are one or
# two SGD steps an epoch there, and 20 rounds of 4 nodes end near chance (10 % local accuracy); with these, 90 %.
# Keyed by the names of dfl_node.learning.datasets.DATASETS (a test checks it); kept here, beside the fields,
# because reading settings and drawing --help must not import torch, which the dataset registry does.
PER_DATASET: dict[str, dict[str, int | float]] = {
    "digits": {"batch_size": 20, "mkt_batch_size": 20, "lr": 0.05},
}
DATASET_DEPENDENT = ("batch_size", "mkt_batch_size", "lr")
# A dataset of the user's own (files, a plugin) has no entry above: its defaults are sized to the training samples
# a node holds (sized_defaults), rather than those of a 60,000-sample benchmark.
SIZED_STEPS, SIZED_BATCH, SIZED_LR = 16, (8, 128), 0.05


class AlgorithmSettings(BaseModel):
    """An algorithm's own settings: the algorithm reads them from its ``settings`` (a model of just these fields,
    :func:`dfl_node.algorithms.base.Algorithm.settings_model`), the settings every algorithm shares from its
    ``config`` (:class:`SharedSettings`), and no other algorithm's."""

    model_config = ConfigDict(extra="forbid")


class NoSettings(AlgorithmSettings):
    """defkt, fullavg, gossip: nothing of their own."""


class ComboSettings(AlgorithmSettings):
    """Combo (000's Combo): how many segments a model is cut into."""

    segments: int = Field(2, ge=2, description="S: Combo's number of model segments")


class GroupSettings(AlgorithmSettings):
    """Algorithms whose round is one group of senders around an aggregator (fedavg, fedprox, dfml, heterofl,
    fedrolex, feddropout, fml): how many send."""

    senders: float = Field(0.5, gt=0, le=1, description="group algorithms (fedavg, fedprox): share of the fleet "
                           "that sends to each round's aggregator (003: 50 %)")


class FedAvgSettings(GroupSettings):
    """Fedavg and fedprox: how a cluster's models are combined (the averaging family's robust rules)."""

    aggregation: Literal["mean", "median", "trimmed-mean"] = Field(
        "mean", description="fedavg, fedprox: how the aggregator combines a cluster's models: mean (003 eq. 5, "
        "weighted by the sample counts the senders claim), or, against poisoned members, the coordinate-wise median "
        "or trimmed-mean (Yin et al. 2018), which ignore the counts (docs/robustness.md)")
    trim_fraction: float = Field(0.2, ge=0, lt=0.5, description="trimmed-mean: the share of a cluster's values cut "
                                 "at each end of every coordinate (rounded down)")


class FedProxSettings(FedAvgSettings):
    """Fedprox: its proximal term."""

    prox_mu: float = Field(0.01, ge=0, description="μ of FedProx's proximal term μ/2·‖w − w_start‖²")


class DFMLSettings(GroupSettings):
    """Dfml (003): its mutual-learning passes, its cyclic α and its peak models."""

    dfml_epochs: int = Field(10, ge=1, description="dfml: K, passes of weighted mutual learning over the aggregator's "
                             "data (003: 10)")
    alpha_max: float = Field(0.9, ge=0, le=1, description="dfml: largest α of the cyclic schedule "
                             "(003: 0.8, 0.9 or 1.0)")
    alpha_min: float = Field(0.0, ge=0, le=1, description="dfml: smallest α of the cyclic schedule (003: 0)")
    alpha_period: int = Field(10, ge=2, description="dfml: rounds of the first α cycle (003: 10)")
    alpha_period_growth: int = Field(10, ge=0, description="dfml: rounds each completed α cycle adds to the next")
    peak_updates: int = Field(0, ge=0, description="dfml: how many of a cycle's largest α values update peak models "
                              "(0: 1 with 50 % senders or more, else ceil(N / (2|S|)), 003 A.4.6)")


class FMLSettings(GroupSettings):
    """Fml (004): its two losses and the meme model."""

    fml_alpha: float = Field(0.5, ge=0, le=1, description="fml: α of the local model's loss α·CE + (1−α)·KL "
                             "(004 eq. 3)")
    fml_beta: float = Field(0.5, ge=0, le=1, description="fml: β of the meme model's loss β·CE + (1−β)·KL (004 eq. 3)")
    meme_model: ModelSpecText = Field("cnn-ln:32,64", description="fml: the meme model every node shares, as a "
                                      "registry spec (003 A.4.11: cnn-ln:32,64)")


class PartialSettings(GroupSettings):
    """Heterofl, fedrolex, feddropout (003's partial training): how FedRolex rolls."""

    fedrolex_roll_largest: bool = Field(True, description="fedrolex: roll the largest participant's units with "
                                        "eq. 9 too (003 Alg. 3). A shift shared by every participant only relabels "
                                        "W_g's units, so this is HeteroFL bit for bit, as 003 Table 4's near-equal "
                                        "figures suggest. Off: W_g is the largest model as it is and the smaller "
                                        "models' windows roll over it (they then meet other units every round)")


class SelectionSettings(AlgorithmSettings):
    """Defkt-select (001): how a sender chooses its receiver."""

    selection: Literal["random", "probe-samples", "class-profile"] = Field(
        "class-profile", description="defkt-select (001): how a sender picks its receiver. random: 001's Def-KT "
        "(Procedure 1); probe-samples: candidates are scored on the sender's least certain validation samples, "
        "which leave the device (001, Procedure 2: opt-in); class-profile: candidates answer with their per-class "
        "validation accuracy only, no data leaves a device")
    selection_samples: int = Field(20, ge=1, le=256, description="probe-samples: raw samples a sender sends each "
                                   "candidate (at most 256, and at most 512 KiB)")
    selection_candidates: int = Field(0, ge=0, description="defkt-select: candidates a sender probes (0: every node "
                                      "of its share of the fleet)")


class FairAvgSettings(AlgorithmSettings):
    """Fairavg (002): how a pair's weights are drawn from their accuracies."""

    fair_c: float = Field(0.5, description="fairavg (002 eq. 4): the constant C in "
                          "P_i = (pef_i − pef_j)/(2·pef_max) + C")
    fair_weight_min: float = Field(0.0, ge=0, le=1, description="fairavg: P_i is clipped to [fair_weight_min, "
                                   "fair_weight_max] (then P_j = 1 − P_i, eq. 5)")
    fair_weight_max: float = Field(1.0, ge=0, le=1, description="fairavg: upper clip of P_i")
    fair_data: Literal["val", "train"] = Field("val", description="fairavg: the node's own data pef is measured on "
                                               "(002 uses local accuracy: the validation split)")

    @model_validator(mode="after")
    def _fair_clip_is_an_interval(self) -> FairAvgSettings:
        if self.fair_weight_min > self.fair_weight_max:
            raise ValueError(f"fair_weight_min {self.fair_weight_min} is above fair_weight_max {self.fair_weight_max}")
        return self


def gates_refusal(task: str, **gates: float | None) -> None:
    """A ``ValueError`` where an accuracy gate (``min_accuracy``, ``relative_gate``) is set for a task that is not
    classification: they compare accuracies."""
    if task != "classification" and (named := [name for name, value in gates.items() if value]):
        raise ValueError(f"{', '.join('--' + n.replace('_', '-') for n in named)} compare accuracies: the {task} "
                         "task has none (classification only)")


def privacy_refusal(learning: SharedSettings, options: AlgorithmOptions, algorithms: Iterable[str]) -> None:
    """A ``ValueError`` where differential privacy is on and one of ``algorithms`` would send raw samples anyway:
    defkt-select's ``probe-samples`` sends validation samples to its candidates, which no clipping or noise bounds."""
    if learning.private and options.selection == "probe-samples" and "defkt-select" in algorithms:
        raise ValueError("--selection probe-samples sends raw samples to peers, which differential privacy cannot "
                         "bound: use class-profile or random with --dp-epsilon/--dp-noise")


class DefenceSettings(BaseModel):
    """Bounds a receiver puts on what its peers send, before it fuses (:mod:`dfl_node.algorithms.defences`): the
    ``defences`` part of a node's and an experiment's settings, read by every algorithm's round, all off by default,
    each refusal counted by its reason (docs/robustness.md)."""

    model_config = ConfigDict(extra="forbid")

    sample_cap: float | None = Field(None, gt=0, description="defence: a received sample count weighs at most this "
                                     "many times the receiver's own training samples (fullavg, combo, fedavg, "
                                     "fedprox and gossip weigh models by the counts senders claim); a count above "
                                     "is capped and counted (sample_count). Unset: off")
    norm_bound: float | None = Field(None, gt=0, description="defence: refuse a received model (or segment) that "
                                     "lies farther from the receiver's own than this many times the norm of the "
                                     "receiver's own, over the elements it carries (norm_bound). Unset: off")
    relative_gate: float | None = Field(None, ge=0, le=1, description="defence: refuse a received whole model whose "
                                        "accuracy on this node's validation split is more than this below its own "
                                        "model's (relative_accuracy): for knowledge-transfer fusion (defkt, dfml), "
                                        "beside min_accuracy. Unset: off")

    @property
    def on(self) -> bool:
        """Whether any defence is on: where none is, nothing is screened and nothing changes."""
        return any(v is not None for v in (self.sample_cap, self.norm_bound, self.relative_gate))


class SharedSettings(BaseModel):
    """What every algorithm reads: the model, the seed, local training and mutual knowledge transfer, the device."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName = Field("mlp", description="architecture: a built-in, an installed plugin's name (entry-point "
                             "group dfl_node.models; `dfl-node plugins` lists them) or package.module:factory, a "
                             "callable (sample_shape, num_classes) -> torch.nn.Module; the same on every node")
    hidden: list[int] | None = Field(None, description="layer widths overriding the architecture's default")
    task: TaskName = Field("classification", description="what the fleet learns (docs/tasks.md): classification (a "
                           "class per sample), regression (float targets: a forecast, a reading), anomaly (an "
                           "autoencoder that flags samples unlike the normal ones), or an installed plugin's "
                           "(entry-point group dfl_node.tasks)")
    regression_loss: Literal["mse", "huber"] = Field("mse", description="regression: the training loss (huber: "
                                                     "Huber with delta 1, for targets with outliers)")
    anomaly_quantile: float = Field(0.99, gt=0, lt=1, description="anomaly: a sample is flagged where its "
                                    "reconstruction error exceeds this quantile of the node's validation errors")
    seed: int = Field(0, description="seed of w0, the round plans and every minibatch order")
    pairs: int = Field(1, ge=1, description="Q: sender/receiver pairs per round")
    supervision: Literal["ce", "wsm"] | None = Field(
        None, description="supervision loss of local training and mutual learning: ce, or 003's WSM (eq. 2, class "
                          "proportions of the data trained on); default per algorithm: wsm for dfml, heterofl, "
                          "fedrolex and feddropout (003), ce for the others (defkt, fullavg, combo always ce)")
    local_epochs: int = Field(1, ge=1, description="M: local passes of a sender (000 eq. 1)")
    # batch_size, lr, mkt_batch_size: their defaults are the dataset's (PER_DATASET), these where it has none
    batch_size: int = Field(200, ge=1, description="B1: local training batch size")
    lr: float = Field(0.01, gt=0, description="local learning rate (also η1 = η2 of MKT unless mkt_lr is set)")
    momentum: float = Field(0.5, ge=0, description="SGD momentum")
    mkt_epochs: int = Field(1, ge=1, description="E: passes of mutual knowledge transfer over the receiver's data")
    mkt_batch_size: int = Field(200, ge=1, description="B2: MKT batch size")
    mkt_lr: float | None = Field(None, gt=0, description="η1 = η2 of MKT; defaults to lr")
    sender_keeps_trained: bool | None = Field(
        None, description="sender stores its trained model (001's variant); default per algorithm: Combo and "
                          "defkt-select (001) yes, else no"
    )
    threads: int = Field(1, ge=1, description="torch threads (1 per node process keeps testbeds fast)")
    device: Literal["auto", "cpu", "cuda"] = Field("cpu", description="where models and data live: cpu, cuda (an "
                                                   "error where CUDA is absent) or auto (cuda when available)")
    # How training runs on a GPU (docs/gpu.md): none of these changes a value on the CPU, but bf16
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        "fp32", description="training arithmetic: fp32 = float32 tensors, matrix products in full float32, "
        "convolutions as PyTorch lets cuDNN do them by default (TF32 on Ampere and newer GPUs); tf32 = matrix "
        "products in TF32 too (CUDA); bf16 = forward passes under bfloat16 autocast (any device). Evaluation is "
        "float32 in every case")
    cuda_graphs: bool = Field(True, description="on CUDA, replay each epoch of local training (cross-entropy) and of "
                              "MKT as a captured CUDA graph: the same steps, a launch per epoch; no effect on the CPU")
    cudnn_benchmark: bool = Field(False, description="on CUDA, let cuDNN time its convolution algorithms for each "
                                  "shape once and keep the fastest (torch.backends.cudnn.benchmark)")
    # Sample-level differential privacy (DP-SGD) of every step on a node's data (dfl_node.learning.privacy)
    dp_epsilon: float | None = Field(None, gt=0, description="differential privacy: the node's budget ε (at "
                                     "--dp-delta); a node that reaches it stops training on its data. Unset, and no "
                                     "--dp-noise: no differential privacy")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="differential privacy: the δ that ε is accounted at (below "
                            "1/N for N samples)")
    dp_noise: float | None = Field(None, gt=0, description="differential privacy: the noise multiplier σ (noise "
                                   "std σ·dp_clip on each clipped gradient sum); unset: the smallest σ that keeps "
                                   "--dp-epochs passes of local training within --dp-epsilon")
    dp_clip: float = Field(1.0, gt=0, description="differential privacy: each sample's gradient is clipped to this "
                           "L2 norm (per model) before the sum is noised")
    dp_epochs: float = Field(20.0, gt=0, description="differential privacy: passes over its data a node's budget is "
                             "planned for, where --dp-noise is not given (σ is chosen for them)")
    dp_secure: bool = Field(False, description="differential privacy: draw batches and noise from OS entropy with "
                            "Opacus's secure_mode noise (production), not from the seed (reproducible runs)")

    @property
    def private(self) -> bool:
        """Whether differential privacy is on: a budget or a noise multiplier is given."""
        return self.dp_epsilon is not None or self.dp_noise is not None

    @model_validator(mode="after")
    def _privacy_settings_need_privacy(self) -> SharedSettings:
        """A DP setting given while DP is off is a mistake (a budget forgotten), not a silent no-op: compared with
        the defaults, since an experiment's node configs carry every value."""
        if not self.private:
            given = [name for name in ("dp_delta", "dp_clip", "dp_epochs", "dp_secure")
                     if getattr(self, name) != SharedSettings.model_fields[name].default]
            if given:
                raise ValueError(f"{', '.join('--' + n.replace('_', '-') for n in given)} need differential privacy "
                                 "on: give --dp-epsilon or --dp-noise")
        return self

    @model_validator(mode="after")
    def _wsm_weights_classes(self) -> SharedSettings:
        if self.supervision == "wsm" and self.task != "classification":
            raise ValueError(f"--supervision wsm weights classes (003 eq. 2): the {self.task} task has none; use ce")
        return self

    def unusable_here(self) -> dict[str, str]:
        """Settings valid anywhere that this machine cannot honour (field → problem), which
        :func:`~dfl_node.settings.loading.load_config` reports as settings errors. A check apart from validation,
        so that a config written elsewhere (a results file, a sweep's grid point) can still be read here."""
        from dfl_node.learning.devices import device_problem  # noqa: PLC0415 - torch only for cuda

        problem = device_problem(self.device)
        return {"device": problem} if problem else {}

    def use_dataset_defaults(self, dataset: str | None) -> None:
        """Give each setting of :data:`DATASET_DEPENDENT` that was not set (by a flag, a ``DFL_*`` variable, a
        config file, a preset or a keyword) the default of ``dataset`` (None, or a dataset without an entry in
        :data:`PER_DATASET`: the field's own default stays). The one place these defaults are decided: called
        by the validators of the experiment's and the node's configs, so the value a run uses is the one its
        config holds, in results files and in every node's settings alike."""
        self.use_defaults(dataset_defaults(dataset))

    def use_defaults(self, values: dict[str, int | float]) -> list[str]:
        """Give each setting of ``values`` that was not set its value (then counted as set: a copy or a re-read
        keeps it); the names given a value here."""
        filled = [name for name in values if name not in self.model_fields_set]
        for name in filled:
            setattr(self, name, values[name])
        return filled


class AlgorithmOptions(SelectionSettings, FairAvgSettings, ComboSettings, FMLSettings, PartialSettings,
                       DFMLSettings, FedProxSettings):
    """Every built-in algorithm's own settings together: what a fleet's settings hold, flat, so that a flag, a
    ``DFL_*`` variable and a config file name each one as before. An algorithm is given only its own
    (:func:`dfl_node.algorithms.make_algorithm`: the fields of its ``settings_model``)."""


def dataset_defaults(dataset: str | None) -> dict[str, int | float]:
    """The defaults of the settings of :data:`DATASET_DEPENDENT` for ``dataset`` (None: the fields' own)."""
    own = PER_DATASET.get(dataset or "", {})
    return {name: own.get(name, SharedSettings.model_fields[name].default) for name in DATASET_DEPENDENT}


def sized_defaults(num_samples: int) -> dict[str, int | float]:
    """The defaults of :data:`DATASET_DEPENDENT` for a dataset of the user's own, of which a node trains on
    ``num_samples``: batches of the power of two nearest to N/16 (about 16 SGD steps an epoch; 8 to 128), the same
    for MKT, and the learning rate of the embedded digits (0.05, in its batches of 20). Powers of two, so that
    nodes whose counts lie in one band (16·2^(k±½)) resolve alike; where a fleet must agree whatever its nodes
    hold, the shards ``dfl-node partition`` writes carry the fleet's values, or the operator gives them."""
    low, high = SIZED_BATCH
    batch = min(high, max(low, 2 ** round(math.log2(max(num_samples, 1) / SIZED_STEPS))))
    return {"batch_size": batch, "mkt_batch_size": batch, "lr": SIZED_LR}


def per_dataset_default(name: str) -> str:
    """How ``--help`` states the default of a setting of :data:`DATASET_DEPENDENT`: ``per dataset (digits 20,
    others 200; your own data: sized to it)``."""
    own = [f"{dataset} {values[name]:g}" for dataset, values in PER_DATASET.items() if name in values]
    yours = f"{SIZED_LR:g}" if name == "lr" else "sized to it"
    return (f"per dataset ({', '.join([*own, f'others {SharedSettings.model_fields[name].default:g}'])}; your own "
            f"data: {yours})")
