"""Configuration as pydantic models, shared by the simulator, the testbed and the daemon.

Precedence: CLI flags > environment variables (``DFL_<FIELD>``) > config file
(YAML or TOML) > the documented defaults below. :func:`load_config` applies it for any model.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, ErrorDetails, core_schema


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
        """The value, if registered; else the one-line problem that :func:`describe_problem` reports."""
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


class ConfigError(ValueError):
    """Settings that cannot be used (the CLI's exit 2): one line per problem, each naming the setting
    the way the operator wrote it (``--rounds``, ``DFL_ROUNDS`` or ``rounds (in node.yaml)``)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


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
        :func:`load_config` reports as settings errors. A check apart from validation, so that a config
        written elsewhere (a results file, a sweep's grid point) can still be read here."""
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


Model = TypeVar("Model", bound=BaseModel)


def _parse(path: Path, text: str) -> object:
    """YAML or TOML by the file's suffix; a syntax error becomes one line naming the file and line."""
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:  # "Invalid value (at line 2, column 10)"
            found = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(exc))
            if not found:
                raise ConfigError([f"{path}: {_lower_first(str(exc))}"]) from None
            problem, line, column = found.groups()
            raise ConfigError([f"{path} line {line}: {_lower_first(problem)} (column {column})"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path} line {mark.line + 1}" if mark else str(path)
        problem = exc.problem or exc.context or "not valid YAML"
        if exc.problem and exc.context and exc.context_mark:
            problem += f" ({exc.context} on line {exc.context_mark.line + 1})"
        raise ConfigError([f"{where}: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: {' '.join(str(exc).split())}"]) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a YAML or TOML config file into a dict (empty file → empty dict); anything else is a
    :class:`ConfigError` of one line, since the operator must fix the file, not read a traceback."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not a UTF-8 text file"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read it ({exc.strerror})"]) from None
    data = _parse(path, text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected settings (key: value) at the top level, got a {_kind(data)}"])
    return data


def _kind(value: object) -> str:
    names = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}
    return names.get(type(value), type(value).__name__)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


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


def _is_path(model: type[BaseModel], name: str) -> bool:
    field = model.model_fields.get(name)
    return field is not None and Path in (field.annotation, *typing.get_args(field.annotation))


def relative_to_file(model: type[BaseModel], data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Relative paths written in a config file mean "next to this file", wherever the command runs from
    (flags and environment variables stay relative to the working directory, as a shell's do)."""
    def place(name: str, value: Any) -> Any:
        if not _is_path(model, name) or not isinstance(value, str) or not value:
            return value
        written = Path(value).expanduser()
        return written if written.is_absolute() else path.parent / written

    return {name: place(name, value) for name, value in data.items()}


def load_config(
    model: type[Model],
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    preset: dict[str, Any] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> Model:
    """Field defaults < ``preset`` < file < environment < ``overrides`` (CLI flags; ``None`` values are ignored).

    Raises :class:`ConfigError` with one line per unusable setting, named by where its value came
    from: the flag (``flag_names`` maps a field to its option, default ``--field-name``), the
    ``DFL_*`` variable or the file's key.
    """
    layers = [
        (preset or {}, lambda key: f"{key} (preset)"),
        (relative_to_file(model, read_config_file(path), path) if path else {}, lambda key: f"{key} (in {path})"),
        (env_overrides(model), lambda key: f"DFL_{key.upper()}"),
        ({k: v for k, v in (overrides or {}).items() if v is not None}, lambda key: _flag(key, flag_names or {})),
    ]
    data: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for values, label in layers:
        data.update(values)
        origin.update({str(key): label(key) for key in values})
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        problems = [describe_problem(error, origin, model, flag_names or {}) for error in exc.errors()]
        raise ConfigError(problems) from None
    unusable = config.unusable_here() if isinstance(config, LearningConfig) else {}
    if unusable:
        raise ConfigError([f"{origin.get(key, _flag(key, flag_names or {}))}: {problem}"
                           for key, problem in unusable.items()])
    return config


_PROBLEMS: dict[str, str] = {
    "greater_than_equal": "must be ≥ {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be ≤ {le}", "less_than": "must be < {lt}",
    "literal_error": "must be {expected}", "enum": "must be {expected}",
    "string_too_short": "must be at least {min_length} character{s}",
    "string_too_long": "must be at most {max_length} character{s}",
    "string_pattern_mismatch": "must match {pattern}",
    "int_parsing": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number", "float_type": "must be a number",
    "bool_parsing": "must be true or false", "bool_type": "must be true or false",
    "list_type": "must be a list", "string_type": "must be text", "path_type": "must be a path",
}


def describe_problem(error: ErrorDetails, origin: Mapping[str, str], model: type[BaseModel],
                     flag_names: Mapping[str, str]) -> str:
    """One pydantic error as one line an operator can act on: ``--rounds: must be ≥ 0 (got -1)``.

    The one place settings errors are worded, for every verb (start, simulate, partition, testbed).
    """
    key = str(error["loc"][0]) if error["loc"] else ""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "missing":
        return f"{key}: missing (give {_flag(key, flag_names)}, DFL_{key.upper()} or {key} in the --config file)"
    where = origin.get(key, key)
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(key, list(model.model_fields), n=1)
        return f"{where}: unknown setting" + (f" (did you mean {close[0]}?)" if close else "")
    if kind == "value_error":  # our validators' own words, which quote the value: no "item n" needed
        problem = str(ctx.get("error", error["msg"]))
        return f"{where}: {problem}" if where else problem
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in ctx.items()}  # "≤ 1", not 1.0
    count = ctx.get("min_length", ctx.get("max_length"))
    template = _PROBLEMS.get(kind)
    problem = template.format(**ctx, s="" if count == 1 else "s") if template else _lower_first(error["msg"])
    problem += f" (got {_shown(error['input'])})"
    items = [f"item {part + 1}" for part in error["loc"][1:] if isinstance(part, int)]
    return f"{where}: " + " ".join([*items, problem]) if where else problem


def _flag(key: str, flag_names: Mapping[str, str]) -> str:
    """The option a field is set by on this verb's command line (``--peer`` for ``peers``), else ``--field-name``."""
    return flag_names.get(key, "--" + key.replace("_", "-"))


def _shown(value: object) -> str:
    """The offending value as the operator typed it: bare, except an empty string; long values cut."""
    text = repr(value) if value == "" else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
