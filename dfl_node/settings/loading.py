"""Reading settings: the precedence of their sources, config files, ``DFL_*`` variables, and one line per
unusable setting, named the way the operator wrote it.

Precedence: CLI flags > environment variables (``DFL_<KEY>``) > config file (YAML or TOML) > the documented
defaults of the models (:mod:`dfl_node.settings.node`, :mod:`dfl_node.settings.experiment`). Every source names a
setting by its flat key (:mod:`dfl_node.settings.parts`); :func:`load_config` applies the precedence for either.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from dfl_node.settings.parts import Composite


class ConfigError(ValueError):
    """Settings that cannot be used (the CLI's exit 2): one line per problem, each naming the setting
    the way the operator wrote it (``--rounds``, ``DFL_ROUNDS`` or ``rounds (in node.yaml)``)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


Model = TypeVar("Model", bound=Composite)


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


def env_overrides(model: type[Composite], prefix: str = "DFL_") -> dict[str, Any]:
    """``DFL_<KEY>`` variables for the model's settings; lists are comma-separated."""
    found: dict[str, Any] = {}
    for name, (_, field) in model.flat_fields().items():
        raw = os.environ.get(prefix + name.upper())
        if raw is None:
            continue
        is_list = "list" in str(field.annotation)
        found[name] = [v for v in raw.split(",") if v] if is_list else raw
    return found


def _is_path(model: type[Composite], name: str) -> bool:
    found = model.flat_fields().get(name)
    return found is not None and Path in (found[1].annotation, *typing.get_args(found[1].annotation))


def relative_to_file(model: type[Composite], data: dict[str, Any], path: Path) -> dict[str, Any]:
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
    ``DFL_*`` variable or the file's key. A validator that must tell the operator's settings from the verb's
    defaults finds the keys only the ``preset`` set in its context's ``"preset"``.
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
    given = {key for values, _ in layers[1:] for key in values}
    try:
        config = model.model_validate(data, context={"preset": set(preset or {}) - given})
    except ValidationError as exc:
        problems = [describe_problem(error, origin, model, flag_names or {}) for error in exc.errors()]
        raise ConfigError(problems) from None
    unusable = config.unusable_here()
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

    The one place settings errors are worded, for every verb (start, simulate, partition, testbed) and for a
    sweep's grid file; settings made of parts name the key an error is about flat.
    """
    loc = tuple(error["loc"])
    key, rest = model.flat_key(loc) if issubclass(model, Composite) else (str(loc[0]) if loc else "", loc[1:])
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "missing":
        return f"{key}: missing (give {_flag(key, flag_names)}, DFL_{key.upper()} or {key} in the --config file)"
    where = origin.get(key, key)
    if kind == "extra_forbidden":
        keys = model.flat_fields() if issubclass(model, Composite) else model.model_fields
        close = difflib.get_close_matches(key, list(keys), n=1)
        return f"{where}: unknown setting" + (f" (did you mean {close[0]}?)" if close else "")
    if kind == "value_error":  # our validators' own words, which quote the value: no "item n" needed
        problem = str(ctx.get("error", error["msg"]))
        return f"{where}: {problem}" if where else problem
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in ctx.items()}  # "≤ 1", not 1.0
    count = ctx.get("min_length", ctx.get("max_length"))
    template = _PROBLEMS.get(kind)
    problem = template.format(**ctx, s="" if count == 1 else "s") if template else _lower_first(error["msg"])
    problem += f" (got {_shown(error['input'])})"
    items = [f"item {part + 1}" for part in rest if isinstance(part, int)]
    return f"{where}: " + " ".join([*items, problem]) if where else problem


def _flag(key: str, flag_names: Mapping[str, str]) -> str:
    """The option a field is set by on this verb's command line (``--peer`` for ``peers``), else ``--field-name``."""
    return flag_names.get(key, "--" + key.replace("_", "-"))


def _shown(value: object) -> str:
    """The offending value as the operator typed it: bare, except an empty string; long values cut."""
    text = repr(value) if value == "" else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
