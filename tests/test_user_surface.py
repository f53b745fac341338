"""What users type stays what it was: every verb's options, and every config key and ``DFL_*`` variable of
a node's and an experiment's settings, against ``tests/data/user_surface.json``, captured on main (6fea10d) before
the settings were nested by part.

A flag, a variable and a key that this test lists must also work: a config file that sets every key, and an
environment that sets every variable, load.

To record a deliberate change of the surface: ``python tests/test_user_surface.py > tests/data/user_surface.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from dfl_node.cli import cli
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import env_overrides, load_config
from dfl_node.settings.node import NodeConfig
from dfl_node.settings.parts import Composite

CAPTURED = Path(__file__).with_name("data") / "user_surface.json"
MODELS: dict[str, type[Composite]] = {"start": NodeConfig, "experiment": ExperimentConfig}


def _options(command: click.Command, path: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every option and argument of ``command`` and of its subcommands, by command path."""
    params = []
    for p in command.params:
        if isinstance(p, click.Option):
            params.append({"name": p.name, "opts": sorted(p.opts), "secondary_opts": sorted(p.secondary_opts),
                           "multiple": p.multiple, "is_flag": p.is_flag, "envvar": p.envvar, "help": p.help,
                           "type": p.type.name, "default": repr(p.default)})
        elif isinstance(p, click.Argument):
            params.append({"argument": p.name, "nargs": p.nargs})
    found = {" ".join(path): sorted(params, key=lambda d: d.get("name") or d.get("argument") or "")}
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            assert sub is not None
            found.update(_options(sub, [*path, name]))
    return found


def surface() -> dict[str, Any]:
    """The user-facing surface of this tree, in the captured file's form."""
    settings = {verb: sorted(model.flat_fields()) for verb, model in MODELS.items()}
    return {"commands": _options(cli, ["dfl-node"]), "settings": settings,
            "env": {verb: ["DFL_" + key.upper() for key in keys] for verb, keys in settings.items()}}


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    return surface()


@pytest.fixture(scope="module")
def before() -> dict[str, Any]:
    return json.loads(CAPTURED.read_text())


def test_every_verb_keeps_its_options(now: dict[str, Any], before: dict[str, Any]) -> None:
    assert sorted(now["commands"]) == sorted(before["commands"])
    for command, options in before["commands"].items():
        assert now["commands"][command] == options, command


@pytest.mark.parametrize("verb", sorted(MODELS))
def test_every_config_key_and_variable_stays(now: dict[str, Any], before: dict[str, Any], verb: str) -> None:
    assert now["settings"][verb] == before["settings"][verb]
    assert now["env"][verb] == before["env"][verb]


# The values every key and variable is given below: each setting's default where it has one, else one it accepts.
REQUIRED = {"id": "node-0", "data": "shards/node-0"}
LISTS = {"peers": ["a:1"], "hidden": [8], "algorithms": ["defkt"], "architectures": ["mlp"]}


def _value(model: type[Composite], key: str) -> Any:
    _, field = model.flat_fields()[key]
    if key in REQUIRED:
        return REQUIRED[key]
    if key in LISTS:
        return LISTS[key]
    default = field.get_default(call_default_factory=True)
    return default.model_dump() if hasattr(default, "model_dump") else default


@pytest.mark.parametrize("verb", sorted(MODELS))
def test_a_file_setting_every_key_loads(before: dict[str, Any], verb: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = MODELS[verb]
    monkeypatch.chdir(tmp_path)
    values = {key: _value(model, key) for key in before["settings"][verb]}
    values = {key: str(value) if isinstance(value, Path) else value for key, value in values.items()}
    (tmp_path / "all.yaml").write_text(yaml.safe_dump(values))
    loaded = load_config(model, tmp_path / "all.yaml").flat()
    assert sorted(loaded) == sorted(values)


@pytest.mark.parametrize("verb", sorted(MODELS))
def test_every_variable_is_read(before: dict[str, Any], verb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in before["env"][verb]:
        monkeypatch.setenv(variable, "x")
    read = env_overrides(MODELS[verb])
    assert sorted(f"DFL_{key.upper()}" for key in read) == sorted(before["env"][verb])


if __name__ == "__main__":
    json.dump(surface(), sys.stdout, indent=1, sort_keys=True)
    print()
