"""A ``str`` setting that names an entry of one of the package's registries (algorithms, datasets,
partitions, models): the marker, and how the CLI finds it on a field.

It sits below every settings module (:mod:`dfl_node.learning.algorithm_settings`, :mod:`dfl_node.settings.experiment`,
:mod:`dfl_node.settings.node`) and imports none of the registries itself: each marker's ``lookup`` does,
when called.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema


@dataclass(frozen=True)
class Registered:
    """Marks a ``str`` setting that must name an entry of one of the package's registries.

    The registry is the one declaration of the names: it is read whenever a value is checked, a JSON
    schema is drawn or a verb's ``--help`` lists the choices, so registering an algorithm (a dataset, a
    partition, a model) is all it takes for every verb, ``DFL_*`` variable and config file to accept it.
    ``lookup`` imports the registry only when called, so that reading settings does not import torch.
    ``other``, where given, takes a value that is none of the names and returns it (in its normal spelling) if
    it is valid all the same (a model's ``package.module:factory``), else None.
    """

    kind: str
    lookup: Callable[[], Iterable[str]]
    other: Callable[[str], str | None] | None = None
    other_help: str = ""  # what --help says ``other`` takes, e.g. "package.module:factory"

    def names(self) -> list[str]:
        return sorted(self.lookup())

    def check(self, value: str) -> str:
        """The value, if registered; else the one-line problem that
        :func:`~dfl_node.settings.loading.describe_problem` reports."""
        names = self.names()
        if value in names:
            return value
        accepted = self.other(value) if self.other is not None else None
        if accepted is None:
            also = f", or {self.other_help}" if self.other_help else ""
            raise ValueError(f"unknown {self.kind} {value!r}; available: {', '.join(names)}{also}")
        return accepted

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # names only: an enum, unless other values are valid too (then they are examples)
        return {**handler(schema), ("examples" if self.other else "enum"): self.names()}


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
