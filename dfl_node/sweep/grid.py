"""GRID.yaml, the file ``dfl-node sweep`` reads: which simulator runs a sweep is made of.

\b
    base: ../experiments/mnist_mlp_zeta4.yaml  # optional: an experiment config, relative to this file's folder
    settings:                                  # optional: experiment settings over the base
      rounds: 100
      algorithms: [defkt, combo]
    grid:                                      # setting -> list of values; every combination is a grid point
      partition: [iid, shards]
      lr: [0.01, 0.05]
    seeds: [0, 1, 2]                           # each grid point once per seed (default: the config's seed)

One run is one grid point × one seed × one algorithm of the config's ``algorithms`` (2 × 2 × 3 × 2 =
24 runs above). A run's settings are, lowest first: the defaults, the base file, ``DFL_*``
variables, ``settings``, the grid point's values, the seed. Relative paths in ``settings`` or
``grid`` (``data_dir``) are read from the grid file's folder, as in any config file. ``threads`` is
1 unless the grid file sets it: a sweep runs one run per CPU. ``seed`` belongs in ``seeds``, and
``algorithms`` in ``settings`` (each algorithm is its own run anyway), not in ``grid``.

Each run has a stable, readable name from its grid point (settings sorted by name), algorithm and
seed, e.g. ``lr=0.05,partition=shards__defkt__seed1``: the name of its result file, so that a
sweep run again knows which runs are done.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import (
    ConfigError,
    describe_problem,
    load_config,
    read_config_file,
    relative_to_file,
)


class GridFile(BaseModel):
    """The keys of a GRID.yaml (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    base: Path | None = Field(None, description="experiment config file, relative to the grid file's folder")
    settings: dict[str, Any] = Field(default_factory=dict, description="settings over the base")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="setting -> values (cartesian product)")
    seeds: list[int] | None = Field(None, description="seeds each grid point runs with")


@dataclass(frozen=True)
class RunTask:
    """One run of a sweep: what a worker needs (the validated config as JSON) and how it is named."""

    name: str
    point: dict[str, Any] = field(hash=False)  # this run's grid values, sorted by setting
    algorithm: str
    seed: int
    config: dict[str, Any] = field(hash=False)  # ExperimentConfig.flat(mode="json"), algorithms=[algorithm]
    run: dict[str, Any] = field(default_factory=dict, hash=False)  # run_fleet's other keywords (simulate's --mode…)

    @property
    def label(self) -> str:
        """The grid point's part of the name (shared by its seeds and algorithms)."""
        return point_label(self.point)

    def experiment(self) -> ExperimentConfig:
        return ExperimentConfig.model_validate(self.config)


def read_grid(path: Path) -> GridFile:
    """Parse and check a GRID.yaml; problems are one :class:`ConfigError` line each, named as in the file."""
    data = read_config_file(path)
    try:
        grid = GridFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_grid_problem(error, path) for error in exc.errors()]) from None
    problems = [f"grid: {key} (in {path}): needs at least one value" for key, values in grid.grid.items() if not values]
    if "algorithms" in grid.grid:
        problems.append(f"grid: algorithms (in {path}): put algorithms in settings; each algorithm is its own run")
    if grid.seeds is not None and ("seed" in grid.grid or "seed" in grid.settings):
        problems.append(f"seed (in {path}): give seeds either as seeds: or as a seed setting, not both")
    if grid.seeds == []:
        problems.append(f"seeds (in {path}): needs at least one seed")
    if problems:
        raise ConfigError(problems)
    return grid


def _grid_problem(error: ErrorDetails, path: Path) -> str:
    """A GRID.yaml error in config's words, a nested key named with its section (``grid: lr (in …)``)."""
    loc = error["loc"]
    if len(loc) > 1 and isinstance(loc[1], str):
        error = {**error, "loc": (f"{loc[0]}: {loc[1]}", *loc[2:])}
    key = str(error["loc"][0]) if error["loc"] else ""
    return describe_problem(error, {key: f"{key} (in {path})"}, GridFile, {})


def expand(path: Path) -> list[RunTask]:
    """Every run of the sweep in ``path``: grid points (cartesian product) × seeds × algorithms.

    Every config is validated here, before anything runs, so a bad value fails the sweep at once."""
    grid = read_grid(path)
    base = path.parent / grid.base if grid.base else None
    keys = sorted(grid.grid)
    tasks: list[RunTask] = []
    for values in itertools.product(*(grid.grid[k] for k in keys)):
        point = dict(zip(keys, values))
        seeds: list[int | None] = [*(grid.seeds or [])] or [None]
        for seed in seeds:
            config = _point_config(path, base, grid, point, seed)
            for algorithm in config.algorithms:
                one = config.model_copy(update={"algorithms": [algorithm]})
                seed_ = config.learning.seed
                tasks.append(RunTask(run_name(point, algorithm, seed_), point, algorithm, seed_, one.flat(mode="json")))
    _check_unique(tasks, path)
    return tasks


def _point_config(
    path: Path, base: Path | None, grid: GridFile, point: dict[str, Any], seed: int | None
) -> ExperimentConfig:
    settings = {"threads": 1, **grid.settings, **point, **({"seed": seed} if seed is not None else {})}
    where = {key: f"{key} (in {path} settings)" for key in grid.settings}
    where |= {key: f"{key} = {value} (in {path} grid)" for key, value in point.items()}
    return load_config(ExperimentConfig, base, relative_to_file(ExperimentConfig, settings, path), flag_names=where)


def _check_unique(tasks: list[RunTask], path: Path) -> None:
    seen: dict[str, RunTask] = {}
    for task in tasks:
        other = seen.setdefault(task.name, task)
        if other is not task:
            raise ConfigError([f"{path}: grid points {other.point} and {task.point} have the same name {task.name!r}"])


_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def point_label(point: dict[str, Any]) -> str:
    """``lr=0.05,partition=shards`` (settings sorted by name); ``base`` for a sweep without a grid."""
    if not point:
        return "base"
    return _UNSAFE.sub("_", ",".join(f"{key}={_shown(point[key])}" for key in sorted(point)))


def run_name(point: dict[str, Any], algorithm: str, seed: int) -> str:
    return f"{point_label(point)}__{algorithm}__seed{seed}"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "+".join(_shown(v) for v in value)
    return str(value)
