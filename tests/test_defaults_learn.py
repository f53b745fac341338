"""Defaults that learn: a fleet given no learning settings learns the embedded digits.

000's MNIST settings (B = 200, lr 0.01) give a node of a 4-node digits fleet ~290 samples, one or two SGD steps an
epoch: 20 rounds of four ``dfl-node start`` daemons with no learning flags ended at 10 % mean local accuracy. Batch
sizes and learning rate now default per dataset (``dfl_node.learning.algorithm_settings.PER_DATASET``): the experiment's
dataset decides them for ``simulate``, ``testbed`` and ``partition``, a node's shard (which names its dataset) for
``start``; a flag, a ``DFL_*`` variable or a config file's key always wins, and mnist, fashion_mnist and cifar10
keep the papers' values, which the simulator reproduces.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dfl_node.cli.options import DEMO_DEFAULTS
from dfl_node.cli.testbed import TESTBED_DEFAULTS
from dfl_node.learning.algorithm_settings import DATASET_DEPENDENT, PER_DATASET, SharedSettings, dataset_defaults
from dfl_node.learning.datasets import DATASETS, shard_dataset
from dfl_node.learning.provision import TRAIN_FILE, node_dataset, provision, write_fleet
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.testbed.launcher import Placement, done_twice, plan_fleet, poll_status, wait_until
from tests.helpers.cli import invoke
from tests.helpers.fleet import running_daemons

PAPER = {"batch_size": 200, "mkt_batch_size": 200, "lr": 0.01}  # 000's MNIST settings
DIGITS = {"batch_size": 20, "mkt_batch_size": 20, "lr": 0.05}
LEARNS = 0.80  # mean local accuracy after 20 rounds of 4 nodes (measured: daemons 0.90, before 0.10; testbed 0.89)


def learning(config: SharedSettings | ExperimentConfig | NodeConfig) -> dict[str, Any]:
    settings = config if isinstance(config, SharedSettings) else config.learning
    return settings.model_dump(include=set(DATASET_DEPENDENT))


def mean_local(statuses: dict[str, Any]) -> float:
    return sum(s["local_accuracy"] for s in statuses.values()) / len(statuses)


# ----------------------------------------------------------------------------- real fleets, no learning settings


@pytest.mark.slow
@pytest.mark.usefixtures("clean_env")
def test_daemons_started_with_no_learning_settings_learn_digits(tmp_path: Path) -> None:
    """A newcomer's fleet (README "Run a fleet" without its --lr / --batch-size flags): `dfl-node partition`, then
    four `dfl-node start` given only their id, data, ports, peers and --rounds 20, in round mode."""
    shards = tmp_path / "shards"
    done = invoke("partition", "--dataset", "digits", "--nodes", "4", "--partition", "iid", "--out", str(shards))
    assert done.exit_code == 0, done.output
    assert {shard_dataset(f) for f in shards.glob("**/*.safetensors")} == {"digits"}  # every shard names it
    config = ExperimentConfig(nodes=4, rounds=20)
    nodes = plan_fleet(config, "defkt", shards, tmp_path, [Placement("127.0.0.1")] * 4, swarm="defaults", mdns=False,
                       static_peers=True)
    for node in nodes:  # what the operator did not give: the daemon decides, from its shard
        for name in DATASET_DEPENDENT:
            del node.env[f"DFL_{name.upper()}"]
    with running_daemons(nodes):
        wait_until(nodes, done_twice(), timeout=120)
        statuses = poll_status(nodes)
    assert all(s is not None and s["round"] == 20 for s in statuses.values()), statuses
    assert mean_local(statuses) >= LEARNS, {n: s and s["local_accuracy"] for n, s in statuses.items()}


@pytest.mark.slow
def test_testbed_with_no_flags_learns_and_its_results_hold_the_settings_used(tmp_path: Path) -> None:
    """`dfl-node testbed` as it comes (4 daemons, digits, ζ = 4 shards, 20 rounds, round mode); its demo preset no
    longer carries batch sizes or a learning rate: they are digits' defaults, and the results file says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    env.update(TMPDIR=str(tmp_path), COLUMNS="200", PYTHONUNBUFFERED="1")
    out = tmp_path / "RESULTS.json"
    done = subprocess.run([sys.executable, "-m", "dfl_node", "testbed", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["rounds"], len(result["nodes"]), result["config"]["dataset"]) == (20, 4, "digits")
    assert {k: result["config"][k] for k in DATASET_DEPENDENT} == DIGITS  # what the daemons were given
    local = [n["local_accuracy"] for n in result["nodes"]]
    assert sum(local) / len(local) >= LEARNS, local
    # without --workdir a good run's logs were once deleted; its logs and state stay (its shards go)
    kept = re.findall(r"node logs and state kept in (\S+)", done.stderr)
    assert len(kept) == 1, done.stderr
    assert sorted(p.name for p in Path(kept[0]).glob("defkt/node-*.log")) == [f"node-{i}.log" for i in range(4)]
    assert not (Path(kept[0]) / "shards").exists()


# ----------------------------------------------------------------------------- where the defaults come from


def test_each_dataset_has_its_defaults_and_the_papers_keep_theirs() -> None:
    assert set(PER_DATASET) <= set(DATASETS)
    assert dataset_defaults("digits") == DIGITS
    for dataset in ("mnist", "fashion_mnist", "cifar10", None):
        assert dataset_defaults(dataset) == PAPER, dataset
    assert learning(SharedSettings()) == PAPER  # no dataset known: the fields' own
    assert learning(ExperimentConfig()) == DIGITS  # the embedded default dataset
    assert learning(ExperimentConfig(dataset="mnist")) == PAPER
    assert learning(ExperimentConfig(dataset="cifar10")) == PAPER


def test_given_values_win_over_the_datasets_even_when_equal_to_the_papers() -> None:
    assert learning(ExperimentConfig(batch_size=200)) == {**DIGITS, "batch_size": 200}
    assert learning(ExperimentConfig(dataset="mnist", lr=0.05)) == {**PAPER, "lr": 0.05}
    written = ExperimentConfig().flat(mode="json")  # a results file's config: every value in it was used
    assert learning(ExperimentConfig.model_validate(written | {"dataset": "mnist"})) == DIGITS


def test_demo_presets_leave_the_learning_settings_to_the_dataset() -> None:
    assert not set(DATASET_DEPENDENT) & (set(DEMO_DEFAULTS) | set(TESTBED_DEFAULTS))


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits-shards")
    write_fleet(provision(ExperimentConfig(nodes=2)), out)
    return out


def test_a_node_takes_the_defaults_of_the_dataset_its_shard_names(digits_shards: Path, tmp_path: Path) -> None:
    assert node_dataset(digits_shards / "node-0") == "digits"
    assert learning(NodeConfig(id="a", data=digits_shards / "node-0")) == DIGITS
    assert learning(NodeConfig(id="a", data=tmp_path / "missing")) == PAPER  # nothing to read: the fields' own
    assert shard_dataset(tmp_path / "missing" / TRAIN_FILE) is None
    explicit = NodeConfig(id="a", data=digits_shards / "node-0", lr=0.2, batch_size=50)
    assert learning(explicit) == {"batch_size": 50, "mkt_batch_size": 20, "lr": 0.2}


@pytest.mark.usefixtures("clean_env")
def test_a_flag_or_variable_given_to_start_wins_over_its_shards_dataset(digits_shards: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What `dfl-node start` builds from --lr / --batch-size / DFL_MKT_BATCH_SIZE, stopped before it serves."""
    built: list[NodeConfig] = []

    async def capture(config: NodeConfig) -> None:
        built.append(config)

    monkeypatch.setattr("dfl_node.service.run.serve", capture)
    args = ["start", "--id", "a", "--data", str(digits_shards / "node-0")]
    for extra, env, expected in [
        ([], {}, DIGITS),
        (["--lr", "0.01", "--batch-size", "200"], {"DFL_MKT_BATCH_SIZE": "7"}, {**PAPER, "mkt_batch_size": 7}),
    ]:
        result = invoke(*args, *extra, env=env)
        assert result.exit_code == 0, result.output
        assert learning(built[-1]) == expected


@pytest.mark.usefixtures("clean_env")
def test_an_explicit_flag_wins_in_simulate_and_testbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configs `simulate` and `testbed` run, stopped before they run them."""
    seen: list[ExperimentConfig] = []

    class Stop(Exception):
        pass

    def capture(config_path: Path | None, demo: dict[str, Any], **flags: Any) -> ExperimentConfig:
        seen.append(real(config_path, demo, **flags))
        raise Stop

    from dfl_node.cli import options, simulate, testbed  # noqa: PLC0415 - the verbs' own references

    real = options.experiment_config
    for module in (simulate, testbed):
        monkeypatch.setattr(module, "experiment_config", capture)
    for verb in ("simulate", "testbed"):
        with pytest.raises(Stop):
            invoke(verb)
        assert learning(seen[-1]) == DIGITS
        with pytest.raises(Stop):
            invoke(verb, "--lr", "0.01", "--batch-size", "200", env={"DFL_MKT_BATCH_SIZE": "7"})
        assert learning(seen[-1]) == {**PAPER, "mkt_batch_size": 7}
        with pytest.raises(Stop):
            invoke(verb, "--dataset", "mnist")
        assert learning(seen[-1]) == PAPER


@pytest.mark.parametrize("verb", ["start", "simulate", "testbed"])
def test_help_says_the_default_is_per_dataset(verb: str) -> None:
    shown = " ".join(invoke(verb, "--help").output.split())
    yours = "your own data: sized to it"
    assert f"[env: DFL_BATCH_SIZE; default: per dataset (digits 20, others 200; {yours})]" in shown
    assert f"[env: DFL_MKT_BATCH_SIZE; default: per dataset (digits 20, others 200; {yours})]" in shown
    assert "[env: DFL_LR; default: per dataset (digits 0.05, others 0.01; your own data: 0.05)]" in shown
