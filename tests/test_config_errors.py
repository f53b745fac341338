"""Operator mistakes in settings: every unusable config file, flag, ``DFL_*`` variable or
config-file key is reported in one line that names the setting the way the operator wrote it, exit 2;
relative paths in a config file are read from the file's folder; a missing dataset is one line, exit 1.

These run the `dfl-node` verbs in-process (click's runner): each fails before a daemon would start.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dfl_node.algorithms import ALGORITHMS
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import ConfigError, load_config
from dfl_node.settings.node import NodeConfig
from tests.helpers.cli import START, error_lines, invoke

pytestmark = pytest.mark.usefixtures("clean_env")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path



# ----------------------------------------------------------------------------- config files


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("node.yaml", "id: node-0\nrounds: 3\n  seed: 4\n", "node.yaml line 3: mapping values are not allowed here"),
    ("node.yaml", "id: node-0\npeers: [a:1\n",
     "node.yaml line 3: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence on line 2)"),
    ("node.toml", "id = 'node-0'\nrounds = \n", "node.toml line 2: invalid value (column 10)"),
    ("node.yaml", "- id\n- rounds\n", "node.yaml: expected settings (key: value) at the top level, got a list"),
    ("node.toml", b"id = '\xff'\n", "node.toml: not a UTF-8 text file"),
])
def test_an_unreadable_config_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                               text: str | bytes, expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_bytes(text.encode() if isinstance(text, str) else text)
    for verb in (["start"], ["simulate", "--quiet"], ["partition", "--out", "shards"]):
        result = invoke(*verb, "--config", name)
        assert result.exit_code == 2, result.output
        assert error_lines(result) == [f"Error: {expected}"], verb


def test_a_missing_config_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("start", "--config", "nope.yaml")
    assert result.exit_code == 2
    assert error_lines(result) == ["Error: Invalid value for '--config': File 'nope.yaml' does not exist."]
    with pytest.raises(ValueError) as exc:  # the same for callers of load_config (benchmarks)
        load_config(ExperimentConfig, Path("nope.yaml"))
    assert str(exc.value) == "nope.yaml: no such file"


# ----------------------------------------------------------------------------- bad settings


def test_a_bad_setting_is_named_as_the_operator_wrote_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    flag = invoke(*START, "--rounds", "-1")
    assert flag.exit_code == 2 and error_lines(flag) == ["Error: --rounds: must be ≥ 0 (got -1)"]
    env = invoke(*START, env={"DFL_ROUNDS": "-1"})
    assert env.exit_code == 2 and error_lines(env) == ["Error: DFL_ROUNDS: must be ≥ 0 (got -1)"]
    write(tmp_path / "node.yaml", "rounds: -1\n")
    file = invoke(*START, "--config", "node.yaml")
    assert file.exit_code == 2 and error_lines(file) == ["Error: rounds (in node.yaml): must be ≥ 0 (got -1)"]
    assert load_config(NodeConfig, Path("node.yaml"), {"id": "n", "data": Path("d"), "rounds": 5}).schedule.rounds == 5


def test_every_bad_setting_gets_its_own_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "node.yaml", "roundz: 3\nmode: rounds\nswarm: ''\n")
    result = invoke("start", "--config", "node.yaml", "--participation", "2", env={"DFL_HEARTBEAT": "often"})
    assert result.exit_code == 2
    assert error_lines(result) == [
        "Error: id: missing (give --id, DFL_ID or id in the --config file)",
        "Error: swarm (in node.yaml): must be at least 1 character (got '')",
        "Error: data: missing (give --data, DFL_DATA or data in the --config file)",
        "Error: mode (in node.yaml): must be 'round' or 'async' (got rounds)",
        "Error: --participation: must be ≤ 1 (got 2.0)",
        "Error: DFL_HEARTBEAT: must be a number (got often)",
        "Error: roundz (in node.yaml): unknown setting (did you mean rounds?)",
    ]


def test_experiment_verbs_share_the_same_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("simulate", "--nodes", "1", "--quiet")
    assert result.exit_code == 2 and error_lines(result) == ["Error: --nodes: must be ≥ 2 (got 1)"]
    write(tmp_path / "x.yaml", "algorithms: [defkt, nonesuch]\n")
    result = invoke("partition", "--config", "x.yaml", "--out", "shards")
    assert result.exit_code == 2
    assert error_lines(result) == [
        f"Error: algorithms (in x.yaml): unknown algorithm 'nonesuch'; available: {', '.join(sorted(ALGORITHMS))}"]


@pytest.mark.parametrize(("peer", "problem"), [
    ("notaport", "peer 'notaport': missing ':PORT' (expected HOST:PORT)"),
    ("host:0", "peer 'host:0': port 0 is out of range 1..65535"),
    ("host:70000", "peer 'host:70000': port 70000 is out of range 1..65535"),
    ("::1:50051", "peer '::1:50051': write IPv6 addresses in brackets, e.g. [::1]:50051"),
])
@pytest.mark.parametrize(("flag", "variable"), [("--peer", "DFL_PEERS"), ("--join", "DFL_JOIN")])
def test_a_static_peer_must_be_host_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peer: str,
                                         problem: str, flag: str, variable: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*START, flag, "node-1:50051", flag, peer)
    assert result.exit_code == 2 and error_lines(result) == [f"Error: {flag}: {problem}"]
    result = invoke(*START, env={variable: f"node-1:50051,{peer}"})
    assert result.exit_code == 2 and error_lines(result) == [f"Error: {variable}: {problem}"]
    good = NodeConfig(id="n", data=Path("d"), peers=["node-1:50051", "10.0.0.2:1", "[::1]:65535"])
    assert good.membership.peers == ["node-1:50051", "10.0.0.2:1", "[::1]:65535"]


def test_help_still_lists_the_settings() -> None:
    result = invoke("start", "--help")
    assert result.exit_code == 0
    for text in ("--peer", "static peers HOST:PORT", "DFL_PEERS", "--state-dir", "--config"):
        assert text in result.output


# ----------------------------------------------------------------------------- paths and data


def test_relative_paths_in_a_config_file_are_read_from_its_folder(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "conf"
    config = write(folder / "node.yaml", "id: node-0\ndata: shards/node-0\ntest_data: /abs/test.safetensors\n"
                                         "state_dir: ../state\n")
    monkeypatch.chdir(tmp_path)
    loaded = load_config(NodeConfig, Path("conf/node.yaml"))
    assert loaded.local.data == Path("conf/shards/node-0") and loaded.storage.state_dir == Path("conf/../state")
    assert loaded.local.test_data == Path("/abs/test.safetensors")
    monkeypatch.setenv("DFL_STATE_DIR", "here")  # flags and env are the operator's: relative to the cwd
    loaded = load_config(NodeConfig, config, {"data": Path("mine")})
    assert loaded.local.data == Path("mine") and loaded.storage.state_dir == Path("here")
    experiment = load_config(ExperimentConfig, write(folder / "x.toml", "data_dir = 'data'\n"))
    assert experiment.shards.data_dir == folder / "data"


def _tiny_mnist(folder: Path) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    np.savez(folder / "mnist.npz", x_train=rng.integers(0, 255, (40, 28, 28), dtype=np.uint8),
             y_train=np.arange(40) % 10, x_test=rng.integers(0, 255, (20, 28, 28), dtype=np.uint8),
             y_test=np.arange(20) % 10)


def test_simulate_reads_a_config_file_from_another_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tiny_mnist(tmp_path / "project" / "data")
    write(tmp_path / "project" / "experiments" / "x.yaml", "dataset: mnist\ndata_dir: ../data\nnodes: 2\n"
          "rounds: 1\neval_every: 1\nbatch_size: 8\nhidden: [8]\nalgorithms: [fullavg]\n")
    monkeypatch.chdir(tmp_path)  # where ../data is not the data
    result = invoke("simulate", "--config", "project/experiments/x.yaml", "--quiet")
    assert result.exit_code == 0, result.output
    assert "fullavg" in result.output


@pytest.mark.parametrize("verb", [["simulate", "--quiet"], ["partition", "--out", "shards"], ["testbed"]])
def test_a_missing_dataset_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    result = invoke(*verb, "--dataset", "mnist", "--data-dir", "empty")
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert re.match(r"error: mnist: neither empty/mnist\.npz nor .* --data-dir / DFL_DATA_DIR", line), line
    assert not (tmp_path / "shards").exists()


# ----------------------------------------------------------------------------- beyond loopback: --insecure
@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.8.7", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_needs_no_credentials(host: str) -> None:
    config = NodeConfig(id="node-0", data=Path("d"), host=host)
    assert not config.network.open_to_network and not config.network.insecure


@pytest.mark.parametrize("host", ["0.0.0.0", "10.77.0.1", "::", "node-0.lan"])
def test_beyond_loopback_without_credentials_is_a_settings_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  host: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*START, "--host", host, "--advertise", "10.0.0.9")
    assert result.exit_code == 2
    assert error_lines(result) == [f"Error: host {host} is reachable from the network but neither mutual TLS "
                                   "(--tls-dir) nor a swarm key (--swarm-key-file) is set, so anyone there could push "
                                   "a model into this node; give one, or --insecure (DFL_INSECURE=1) on a private "
                                   "network"]


def test_insecure_is_a_flag_a_variable_and_a_config_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    base = {"id": "node-0", "data": Path("d"), "host": "0.0.0.0", "advertise": "10.0.0.9"}
    assert load_config(NodeConfig, None, {**base, "insecure": True}).network.open_to_network  # --insecure
    write(tmp_path / "node.yaml", "insecure: true\n")
    assert load_config(NodeConfig, Path("node.yaml"), base).network.insecure
    monkeypatch.setenv("DFL_INSECURE", "1")
    assert load_config(NodeConfig, None, base).network.insecure
    monkeypatch.setenv("DFL_INSECURE", "0")  # and nothing else makes it so
    with pytest.raises(ConfigError):
        load_config(NodeConfig, None, base)
    key = write(tmp_path / "swarm.key", "k" * 32)  # credentials: no flag needed (the file is read at start)
    assert not load_config(NodeConfig, None, {**base, "swarm_key_file": key}).network.open_to_network
    assert not load_config(NodeConfig, None, {**base, "tls_dir": tmp_path}).network.open_to_network
