"""Command-line options shared by several verbs, declared once.

``simulate``, ``testbed`` and ``partition`` take the same experiment options; each maps onto a
field of :class:`~dfl_node.config.ExperimentConfig`, so a flag, a ``DFL_<FIELD>`` variable and a
config-file key always mean the same thing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel

from dfl_node.algorithms import ALGORITHMS
from dfl_node.config import ConfigError, ExperimentConfig, load_config
from dfl_node.learning.datasets import DATASETS
from dfl_node.learning.partitions import PARTITIONS

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=BaseModel)

EXPERIMENT_OPTIONS = [
    click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="YAML or TOML experiment file (flags override it)."),
    click.option("--dataset", type=click.Choice(DATASETS), help="Dataset (default: digits, embedded)."),
    click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
                 help="Folder with dataset files (default: $DFL_DATA_DIR)."),
    click.option("--algorithm", "algorithms", multiple=True, type=click.Choice(sorted(ALGORITHMS)),
                 help="Algorithm to run; repeat for several (default: all)."),
    click.option("--nodes", type=int, help="K: number of nodes."),
    click.option("--rounds", type=int, help="T: number of rounds."),
    click.option("--seed", type=int, help="Seed of the partition, w0 and every random choice."),
    click.option("--partition", type=click.Choice(PARTITIONS), help="How data is split across nodes."),
    click.option("--zeta", type=int, help="ζ for the shards/classes partitions."),
    click.option("--beta", type=float, help="β for the Dirichlet partition."),
    click.option("--model", help="Architecture from the model registry (mlp, cnn)."),
    click.option("--lr", type=float, help="Learning rate."),
    click.option("--batch-size", type=int, help="B1: local batch size."),
    click.option("--local-epochs", type=int, help="M: local epochs per round."),
    click.option("--eval-every", type=int, help="Evaluate every n rounds."),
]

# Preset used when `dfl-node simulate` / `testbed` get no config file: a quick, meaningful demo on digits.
DEMO_DEFAULTS: dict[str, Any] = {
    "name": "digits-demo", "dataset": "digits", "partition": "shards", "zeta": 4, "nodes": 10,
    "rounds": 200, "eval_every": 20, "batch_size": 20, "mkt_batch_size": 20, "lr": 0.05,
}


def experiment_options(func: F) -> F:
    for option in reversed(EXPERIMENT_OPTIONS):
        func = option(func)
    return func


class SettingsError(click.UsageError):
    """Unusable settings, exit 2: click's ``Error:`` in front of each problem, so each is one line of its own."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__("\nError: ".join(error.problems))


def load_settings(model: type[M], config_path: Path | None, flags: dict[str, Any],
                  preset: dict[str, Any] | None = None) -> M:
    """:func:`~dfl_node.config.load_config` for the running verb: its flags named as the operator typed
    them (``--peer``, ``--algorithm``), any unusable setting a :class:`SettingsError`."""
    params = click.get_current_context().command.params
    flag_names = {p.name: p.opts[0] for p in params if isinstance(p, click.Option) and p.name}
    try:
        return load_config(model, config_path, flags, preset=preset, flag_names=flag_names)
    except ConfigError as exc:
        raise SettingsError(exc) from None


def experiment_config(config_path: Path | None, demo: dict[str, Any], **flags: Any) -> ExperimentConfig:
    """Build the config: demo preset (only without a file) < file < env < flags."""
    flags["algorithms"] = list(flags.get("algorithms") or []) or None
    return load_settings(ExperimentConfig, config_path, flags, preset=demo if config_path is None else None)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll is noise
