"""The verbs' options are generated from the config models: every setting is a flag, named
``--field-name`` (``--algorithm`` / ``--peer`` repeated for the lists ``algorithms`` / ``peers``),
with the field's description and ``[env: DFL_FIELD; default: …]`` as help (``repeatable`` for a list); names
of algorithms, datasets, partitions and models are the registries', so registering one is all every verb needs
to accept it.

The verbs run in-process (click's runner) up to the config they build, which a stub records.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import BaseModel

from dfl_node.algorithms import ALGORITHMS
from dfl_node.cli.options import PARTITION_FIELDS, experiment_config, structured
from dfl_node.learning.datasets import DATASETS
from dfl_node.learning.partitions import PARTITIONS
from dfl_node.learning.shard_settings import AS_RECORDED, ShardSettings
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import load_config
from dfl_node.settings.node import NodeConfig
from tests.helpers.cli import START, error_lines, invoke, verb_command

EXPERIMENT_VERBS = ("simulate", "testbed")
VERB_MODELS: list[tuple[str, type[BaseModel]]] = [*((verb, ExperimentConfig) for verb in EXPERIMENT_VERBS),
                                                  ("start", NodeConfig), ("partition", ExperimentConfig)]
PARTITION_NAMES = (*PARTITIONS, AS_RECORDED)  # the partition setting's: the schemes, and a recorded fleet as it is

pytestmark = pytest.mark.usefixtures("clean_env")


class Built(Exception):
    """Raised by the stubs once a verb has built its config: nothing is provisioned or served."""

    def __init__(self, config: BaseModel) -> None:
        super().__init__("config built")
        self.config = config


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each verb stops once it has built its config, raising :class:`Built` with it."""
    def stop(*args: Any, **kwargs: Any) -> None:
        raise Built(experiment_config(*args, **kwargs))

    async def serve(config: NodeConfig) -> None:
        raise Built(config)

    for module in ("dfl_node.cli.simulate", "dfl_node.cli.testbed", "dfl_node.cli.node_cmds"):
        monkeypatch.setattr(importlib.import_module(module), "experiment_config", stop)
    monkeypatch.setattr("dfl_node.service.run.serve", serve)


def config_of(*args: str, env: dict[str, str] | None = None) -> Any:
    """The config a verb builds from these arguments (needs the ``built`` fixture)."""
    with pytest.raises(Built) as stopped:
        invoke(*args, env=env)
    return stopped.value.config


def verb_args(verb: str) -> tuple[str, ...]:
    """The verb with what it needs besides the settings under test."""
    return {"simulate": ("simulate", "--quiet"), "partition": ("partition", "--out", "shards"),
            "start": START}.get(verb, (verb,))


def available(names: object) -> str:
    return ", ".join(sorted(names))  # type: ignore[call-overload]


# ----------------------------------------------------------------------------- one flag per field


@pytest.mark.parametrize(("verb", "model"), VERB_MODELS)
def test_every_field_is_a_flag_with_its_description(verb: str, model: type[BaseModel]) -> None:
    command = verb_command(verb)
    options = {p.name: p for p in command.params if isinstance(p, click.Option)}
    shown = invoke(verb, "--help")
    assert shown.exit_code == 0
    for name, (_, field) in model.flat_fields().items():
        assert field.description, f"{model.__name__}.{name} has no description"
        if structured(field.annotation) or (verb == "partition" and name not in PARTITION_FIELDS):
            assert name not in options, name  # devices:, links:, faults: in a file only; partition: its own flags
            continue
        option = options[name]
        assert option.help is not None and option.help.startswith(f"{field.description}  [")
        notes = option.help.rsplit("  [", 1)[1].rstrip("]").split("; ")
        assert f"env: DFL_{name.upper()}" in notes
        assert ("repeatable" in notes) == bool(option.multiple), (verb, name)  # said, not left to guess
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if default not in (None, []):  # a default is said, not learnt from the code
            assert any(n.startswith("default: ") for n in notes), (verb, name, notes)
        assert option.opts[0] in shown.output, (verb, name)
    assert {"--config"} <= {opt for p in options.values() for opt in p.opts}


@pytest.mark.parametrize(("verb", "model"), VERB_MODELS[:-1])
def test_flags_keep_their_spellings(verb: str, model: type[BaseModel]) -> None:
    options = {p.name: p for p in verb_command(verb).params if isinstance(p, click.Option)}
    assert options["seed"].opts == ["--seed"] and options["local_epochs"].opts == ["--local-epochs"]
    assert options["sender_keeps_trained"].opts == ["--sender-keeps-trained"]
    assert options["sender_keeps_trained"].secondary_opts == ["--no-sender-keeps-trained"]
    assert options["hidden"].opts == ["--hidden"] and options["hidden"].multiple
    if model is NodeConfig:
        assert options["peers"].opts == ["--peer"] and options["peers"].multiple
        assert options["grpc_port"].opts == ["--grpc-port"]
    else:
        assert options["algorithms"].opts == ["--algorithm"] and options["algorithms"].multiple


def test_help_lists_the_registries_names() -> None:
    shown = invoke("simulate", "--help").output
    for names in (ALGORITHMS, DATASETS, PARTITION_NAMES):
        assert f"[{'|'.join(sorted(names))}]" in shown
    schema = ExperimentConfig.model_json_schema()["properties"]
    assert schema["algorithms"]["items"]["enum"] == sorted(ALGORITHMS)
    shards = ShardSettings.model_json_schema()["properties"]  # the experiment's data part
    # a dataset is a name, or a path of the user's own files: the names are examples, not an enum
    assert shards["dataset"]["examples"] == sorted(DATASETS) and shards["partition"]["enum"] == sorted(PARTITION_NAMES)
    assert NodeConfig.model_json_schema()["properties"]["algorithm"]["enum"] == sorted(ALGORITHMS)


# ----------------------------------------------------------------------------- flags reach the config

LEARNING_FLAGS = ("--momentum", "0.9", "--pairs", "2", "--segments", "3", "--mkt-epochs", "2", "--mkt-lr", "0.1",
                  "--mkt-batch-size", "10", "--threads", "2", "--hidden", "8", "--hidden", "4",
                  "--no-sender-keeps-trained")
LEARNING_VALUES = {"momentum": 0.9, "pairs": 2, "segments": 3, "mkt_epochs": 2, "mkt_lr": 0.1, "mkt_batch_size": 10,
                   "threads": 2, "hidden": [8, 4], "sender_keeps_trained": False}


@pytest.mark.parametrize("verb", EXPERIMENT_VERBS)
@pytest.mark.usefixtures("built")
def test_experiment_flags_reach_the_config(verb: str) -> None:
    config = config_of(*verb_args(verb), *LEARNING_FLAGS, "--val-fraction", "0.3", "--name", "run-1",
                       "--algorithm", "combo", "--algorithm", "defkt")
    assert isinstance(config, ExperimentConfig)
    assert config.flat(keys=LEARNING_VALUES) == LEARNING_VALUES
    assert (config.shards.val_fraction, config.name, config.algorithms) == (0.3, "run-1", ["combo", "defkt"])


@pytest.mark.usefixtures("built")
def test_partition_offers_only_what_decides_the_shards() -> None:
    """`partition` once offered ~35 training-only flags."""
    config = config_of("partition", "--out", "shards", "--partition", "shards", "--zeta", "3", "--val-fraction", "0.3",
                       "--seed", "5", "--nodes", "6")
    shards = config.shards
    assert (shards.partition, shards.zeta, shards.val_fraction, config.learning.seed, config.nodes) == \
        ("shards", 3, 0.3, 5, 6)
    refused = invoke("partition", "--out", "shards", "--lr", "0.1")
    assert refused.exit_code == 2 and "No such option '--lr'" in refused.output


@pytest.mark.usefixtures("built")
def test_node_flags_reach_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = config_of(*START, *LEARNING_FLAGS, "--peer", "a:1", "--peer", "b:2", "--no-mdns", "--grpc-port", "6000")
    assert isinstance(config, NodeConfig)
    assert config.flat(keys=LEARNING_VALUES) == LEARNING_VALUES
    assert (config.membership.peers, config.membership.mdns, config.network.grpc_port) == (["a:1", "b:2"], False, 6000)


@pytest.mark.usefixtures("built")
def test_flags_beat_env_which_beats_the_file_which_beats_the_preset(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.yaml").write_text("momentum: 0.1\npairs: 2\nsegments: 3\n")
    env = {"DFL_MOMENTUM": "0.2", "DFL_PAIRS": "4", "DFL_HIDDEN": "16,8"}
    config = config_of("simulate", "--quiet", "--config", "x.yaml", "--momentum", "0.3", env=env)
    learning = config.learning
    assert (learning.momentum, learning.pairs, config.per_algorithm.segments, learning.hidden) == (0.3, 4, 3, [16, 8])
    assert learning.lr == ExperimentConfig().learning.lr  # the demo preset only applies without a file
    assert config_of("simulate", "--quiet").learning.lr == 0.05  # ... which it does here
    assert config_of("simulate", "--quiet", env=env).learning.hidden == [16, 8]  # an option not given leaves env be


# ----------------------------------------------------------------------------- names from the registries


@pytest.mark.parametrize(("verb", "flag"), [("simulate", "--algorithm"), ("testbed", "--algorithm"),
                                            ("start", "--algorithm")])
def test_an_unknown_algorithm_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: str,
                                          flag: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*verb_args(verb), flag, "nonesuch")
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [f"Error: {flag}: unknown algorithm 'nonesuch'; available: {available(ALGORITHMS)}"]


@pytest.mark.parametrize(("setting", "kind", "names"), [("dataset", "dataset", DATASETS),
                                                        ("partition", "partition", PARTITION_NAMES)])
def test_every_layer_checks_names_against_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       setting: str, kind: str, names: tuple[str, ...]) -> None:
    monkeypatch.chdir(tmp_path)
    problem = f"unknown {kind} 'nonesuch'; available: {available(names)}"
    if kind == "dataset":  # or one of the user's own
        problem += ("; or your own: the path of a .csv or .npz file or of a folder of them (./data.csv), or "
                    "package.module:factory")
    flag = invoke("simulate", "--quiet", f"--{setting}", "nonesuch")
    assert flag.exit_code == 2 and error_lines(flag) == [f"Error: --{setting}: {problem}"]
    env = invoke("simulate", "--quiet", env={f"DFL_{setting.upper()}": "nonesuch"})
    assert env.exit_code == 2 and error_lines(env) == [f"Error: DFL_{setting.upper()}: {problem}"]


def test_a_registered_algorithm_is_accepted_everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       built: None) -> None:
    class Dummy:
        name = "dummy"

    monkeypatch.setitem(ALGORITHMS, "dummy", Dummy)
    monkeypatch.chdir(tmp_path)
    assert load_config(ExperimentConfig, overrides={"algorithms": ["dummy", "defkt"]}).algorithms == ["dummy", "defkt"]
    assert NodeConfig(id="n", data=Path("d"), algorithm="dummy").algorithm == "dummy"
    assert config_of("simulate", "--quiet", "--algorithm", "dummy").algorithms == ["dummy"]
    assert config_of(*START, "--algorithm", "dummy").algorithm == "dummy"
    assert "dummy" in invoke("testbed", "--help").output
    assert "dummy" in ExperimentConfig.model_json_schema()["properties"]["algorithms"]["items"]["enum"]


def test_a_flag_name_means_one_thing_on_every_verb() -> None:
    """``--duration`` once read "stop volunteering after" on start and "virtual seconds the fleet runs" on
    simulate. Its defaults differ on purpose (a daemon volunteers until stopped; a testbed or a simulated run
    must end), its meaning does not; ``--algorithm`` names one algorithm per use, repeatable where a verb runs
    several."""
    def option(verb: str, name: str) -> click.Option:
        found = [p for p in verb_command(verb).params if isinstance(p, click.Option) and name in p.opts]
        assert len(found) == 1, (verb, name)
        return found[0]

    for verb in ("start", "simulate", "testbed"):
        duration = option(verb, "--duration").help or ""
        assert duration.lower().startswith("async mode") and "how long" in duration and "volunteers" in duration, \
            (verb, duration)
        algorithm = option(verb, "--algorithm")
        assert algorithm.multiple == (verb != "start"), verb
