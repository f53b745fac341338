"""The simulator: deterministic for a seed, and the CLI around it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dfl_node.cli import cli
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim import run_fleet

SMALL = dict(nodes=4, rounds=6, eval_every=3, batch_size=20, mkt_batch_size=20, lr=0.05, hidden=[32, 32])


def _run(algorithm: str, **overrides: object):
    config = ExperimentConfig(**{**SMALL, **overrides})
    return run_fleet(config, algorithm)


def test_same_seed_same_models_other_seed_other_models() -> None:
    for algorithm in ("defkt", "fullavg", "combo"):
        a, b, c = _run(algorithm), _run(algorithm), _run(algorithm, seed=1)
        digests = lambda r: [n.param_sha256 for n in r.nodes]  # noqa: E731
        assert digests(a) == digests(b)
        assert digests(a) != digests(c)
        assert [h.round for h in a.history] == [0, 3, 6]
        assert a.models_transmitted == 6 and a.bytes_transmitted > 0


def test_simulate_cli_writes_json_and_csv(tmp_path) -> None:
    out = tmp_path / "runs"
    result = CliRunner().invoke(
        cli, ["simulate", "--nodes", "4", "--rounds", "4", "--eval-every", "2", "--algorithm", "defkt",
              "--algorithm", "combo", "--out", str(out), "--quiet"],
    )
    assert result.exit_code == 0, result.output
    assert "defkt" in result.output and "combo" in result.output
    data = json.loads((out / "defkt.json").read_text())
    assert data["rounds"] == 4 and len(data["nodes"]) == 4
    assert {"global_accuracy", "local_accuracy", "param_sha256"} <= set(data["nodes"][0])
    assert (out / "combo.csv").read_text().splitlines()[0].startswith("round,global_accuracy")


def test_bad_flag_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["simulate", "--nodes", "1"])
    assert result.exit_code == 2 and "nodes" in result.output


@pytest.mark.parametrize(("partition", "why"), [("shards", "non-empty segments"),
                                               ("iid", "a node would get 1 of them, too few to train on")])
def test_a_fleet_too_large_for_its_dataset_is_one_line_not_a_traceback(tmp_path, partition: str, why: str) -> None:
    """Shards too few for the segments, or an iid split that leaves a node one sample and no validation split (its
    local accuracy would be undefined): the operator's numbers, said in a line before any node starts."""
    result = CliRunner().invoke(cli, ["simulate", "--nodes", "1000", "--algorithm", "defkt", "--partition", partition,
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"error: cannot split digits's 1437 training samples among 1000 nodes ({partition} partition)" \
        in result.output and why in result.output
    assert "Traceback" not in result.output and "--dataset" in result.output
