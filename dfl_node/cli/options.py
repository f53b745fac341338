"""Command-line options generated from the config models, so a verb can never miss a setting.

Every setting of :class:`~dfl_node.settings.experiment.ExperimentConfig` is an option of ``simulate``, ``testbed``
and ``partition``, every setting of :class:`~dfl_node.settings.node.NodeConfig` one of ``start``, by its flat key
(:mod:`dfl_node.settings.parts`): a flag, a ``DFL_<KEY>`` variable and a config-file key always mean the same
thing, with the same description.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from dfl_node.learning.algorithm_settings import DATASET_DEPENDENT, per_dataset_default
from dfl_node.rates import parse_cap
from dfl_node.registered import Registered, registry_of
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import ConfigError, load_config
from dfl_node.settings.parts import Composite

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=Composite)

RATES = ("max_upload", "max_download", "relay_rate", "relay_bytes")  # bytes(/s), or 100k, 1.5M, 20G
# List fields whose repeatable option is spelled as one item (``--peer A --peer B`` fills ``peers``).
ITEM_FLAGS = {"algorithms": "algorithm", "peers": "peer", "architectures": "architecture"}


class RegistryChoice(click.Choice):
    """A registry's names as an option's choices (``--help``, shell completion), read when shown, so a
    name registered after the command was built is offered too.

    The value is not checked here but by the config model: an unknown name is then the same one line
    whether it came from a flag, a ``DFL_*`` variable or a config file.
    """

    def __init__(self, registry: Registered) -> None:  # no super().__init__: the choices are read live
        self.registry = registry
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]  # read live, never assigned
        return tuple(self.registry.names())

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        """The names, and what else the registry takes (a model's ``package.module:factory``)."""
        other = f"|{self.registry.other_help}" if self.registry.other_help else ""
        return f"[{'|'.join(self.choices)}{other}]"


def model_options(model: type[Composite], only: Collection[str] | None = None) -> Callable[[F], F]:
    """One click option per setting of ``model`` (or of its settings in ``only``), in order: ``--grpc-port``
    for ``grpc_port``, ``--x/--no-x`` for a bool, a repeatable option for a list; the help is the setting's
    description. Settings of structured values (a mapping, a schedule: ``devices``, ``links``, ``faults``) are set
    in a config file only."""
    def decorate(func: F) -> F:
        for name, (_, field) in reversed(model.flat_fields().items()):
            if not structured(field.annotation) and (only is None or name in only):
                func = field_option(name, field)(func)
        return func

    return decorate


def field_option(name: str, field: FieldInfo) -> Callable[[F], F]:
    """The option that sets one field; unset, it is ``None`` (or ``()``), so lower layers decide."""
    flag = "--" + ITEM_FLAGS.get(name, name).replace("_", "-")
    value_type = _value_type(field.annotation)
    repeatable = typing.get_origin(value_type) is list
    help_text = f"{field.description or ''}  [{_help_notes(name, field, repeatable)}]"
    if value_type is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text)
    if repeatable:
        [item_type] = typing.get_args(value_type)
        return click.option(flag, name, type=_click_type(field, item_type), multiple=True, help=help_text)
    kind = _Cap() if name in RATES else _click_type(field, value_type)
    return click.option(flag, name, type=kind, default=None, help=help_text)


def _help_notes(name: str, field: FieldInfo, repeatable: bool) -> str:
    """What ``--help`` says beside a field's description: repeatable or not, its variable, its default (shown,
    never passed: an unset flag leaves the setting to the environment, the file and the model)."""
    notes = ["repeatable"] if repeatable else []
    notes.append(f"env: DFL_{name.upper()}")
    default = field.get_default(call_default_factory=True)
    if name in DATASET_DEPENDENT:
        notes.append(f"default: {per_dataset_default(name)}")
    elif default is not None and default != [] and default is not PydanticUndefined:
        shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
        notes.append(f"default: {shown}")
    return "; ".join(notes)


def structured(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel))


def _value_type(annotation: Any) -> Any:
    """``X`` for ``X | None``: an optional setting's flag takes what the setting holds."""
    args = typing.get_args(annotation)
    if type(None) not in args:
        return annotation
    [value_type] = [arg for arg in args if arg is not type(None)]
    return value_type


def _click_type(field: FieldInfo, value_type: Any) -> Any:
    """What click parses a value as: a registry's live names, a ``Literal``'s fixed ones, a path or a number;
    anything else stays text for the config model to check."""
    registry = registry_of(field)
    if registry:
        return RegistryChoice(registry)
    if typing.get_origin(value_type) is typing.Literal:
        return click.Choice(typing.get_args(value_type))
    return {Path: click.Path(path_type=Path), int: int, float: float}.get(value_type, str)


CONFIG_OPTION = click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                             help="YAML or TOML experiment file (flags override it).")


def experiment_options(func: F) -> F:
    """``--config`` and one option per :class:`~dfl_node.settings.experiment.ExperimentConfig` field."""
    return CONFIG_OPTION(model_options(ExperimentConfig)(func))


# What deciding a fleet's shards takes (dfl_node.learning.provision.provision): `partition` offers only these.
PARTITION_FIELDS = ("dataset", "data_dir", "label_column", "sample_shape", "num_classes", "nodes", "partition", "zeta",
                    "zeta_max", "beta", "samples", "large_nodes", "val_fraction", "seed", "train_samples",
                    "test_samples")


def partition_options(func: F) -> F:
    """``--config`` and the options of :data:`PARTITION_FIELDS` (a config file may hold any experiment key)."""
    return CONFIG_OPTION(model_options(ExperimentConfig, only=PARTITION_FIELDS)(func))


NODE_SETTINGS = ("heartbeat", "peer_timeout", "token_timeout", "round_timeout", "max_round_timeout", "group_attempts",
                 "resume_window", "max_upload", "max_download", "interval", "participation")


class _Cap(click.ParamType):
    name = "bytes"  # bytes/s or bytes, with k, M or G

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return parse_cap(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def node_options(func: F) -> F:
    """The nodes' timings, links and caps, as ``dfl-node start`` takes them, for a fleet the simulator runs as real
    nodes."""
    from dfl_node.settings.node import NodeConfig

    for name in reversed(NODE_SETTINGS):
        _, field = NodeConfig.flat_fields()[name]
        kind = _Cap() if name in RATES else int if field.annotation is int else float
        func = click.option(f"--{name.replace('_', '-')}", name, type=kind, default=None,
                            help=f"the nodes': {field.description} (default: {field.default:g})")(func)
    return func


# Preset used when `dfl-node simulate` / `testbed` get no config file: a quick, meaningful demo on digits (whose
# batch sizes and learning rate are its dataset defaults, dfl_node.learning.algorithm_settings.PER_DATASET).
DEMO_DEFAULTS: dict[str, Any] = {
    "name": "demo", "dataset": "digits", "partition": "shards", "zeta": 4, "nodes": 10,
    "rounds": 200, "eval_every": 20,
}


class SettingsError(click.UsageError):
    """Unusable settings, exit 2: click's ``Error:`` in front of each problem, so each is one line of its own."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__("\nError: ".join(error.problems))


def load_settings(model: type[M], config_path: Path | None, flags: dict[str, Any],
                  preset: dict[str, Any] | None = None) -> M:
    """:func:`~dfl_node.settings.loading.load_config` for the running verb: its flags named as the operator typed
    them (``--peer``, ``--algorithm``), a repeatable option not given left to the lower layers, any
    unusable setting a :class:`SettingsError`."""
    params = click.get_current_context().command.params
    flag_names = {p.name: p.opts[0] for p in params if isinstance(p, click.Option) and p.name}
    given = {name: (list(value) or None) if isinstance(value, tuple) else value for name, value in flags.items()}
    try:
        return load_config(model, config_path, given, preset=preset, flag_names=flag_names)
    except ConfigError as exc:
        raise SettingsError(exc) from None


def experiment_config(config_path: Path | None, demo: dict[str, Any], **flags: Any) -> ExperimentConfig:
    """Build the config: demo preset (only without a file) < file < env < flags."""
    return load_settings(ExperimentConfig, config_path, flags, preset=demo if config_path is None else None)


