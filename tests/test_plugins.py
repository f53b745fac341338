"""A user's own model and algorithm as plugins: installed through entry points, or named as
``package.module:factory``; a node builds a peer's model only from what is installed here, and a peer whose model
or algorithm is not installed here is refused at Hello (``unknown_model``, ``unknown_algorithm``), visibly.

The plugin is a throwaway package the test installs for real (:mod:`tests.helpers.plugins`): a ``*.dist-info``
beside the package on ``sys.path`` (this process: the simulator) and ``PYTHONPATH`` (the daemons).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dfl_node.learning.models import ModelSpec
from dfl_node.testbed.launcher import Placement, all_done, plan_fleet, wait_until
from tests.helpers.cli import error_lines, invoke
from tests.helpers.fleet import FLEET, loopback_fleet, running_daemons, simulated
from tests.helpers.plugins import install_plugin


def _on_pythonpath(folder: Path) -> str:
    return os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture
def fleet_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``fleet_plugins`` installed for this process and every daemon it starts: model ``tiny-fleet``, algorithm
    ``plugin-kt``."""
    folder = install_plugin(tmp_path / "site", "fleet_plugins", models={"tiny-fleet": "tiny"},
                            algorithms={"plugin-kt": "PluginKT"})
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", _on_pythonpath(folder))
    return folder


@pytest.mark.slow
def test_a_model_and_an_algorithm_plugin_train_in_a_testbed_as_in_the_simulator_bit_for_bit(
        fleet_shards: Path, tmp_path: Path, fleet_plugin: Path) -> None:
    config = FLEET.model_copy(update={"rounds": 10, "model": "tiny-fleet", "hidden": None})
    with loopback_fleet(fleet_shards, tmp_path, "plugin-kt", config=config, mdns=False, static_peers=True) as nodes:
        statuses = wait_until(nodes, all_done, timeout=180)
    result, models = simulated(config, "plugin-kt", tmp_path / "sim")
    expected = {n.id: n for n in result.nodes}
    w0 = ModelSpec.parse("tiny-fleet").build((1, 8, 8), 10, seed=config.learning.seed).state_dict()
    for node in nodes:
        mine = load_file(str(node.state_dir / "model.safetensors"))
        status = statuses[node.id]
        assert set(mine) == set(w0)  # the plugin's model, trained where the node fused (a sender keeps its own)
        assert torch.equal(mine["1.weight"], w0["1.weight"]) == (status["fusions"] == 0), node.id
        unequal = [k for k in models[node.id] if not torch.equal(mine[k], models[node.id][k])]
        assert not unequal, node.id
        assert (status["model"], status["algorithm"], status["rejected"]) == ("tiny-fleet", "plugin-kt", {})
        for field in ("global_accuracy", "local_accuracy", "models_sent"):
            assert status[field] == getattr(expected[node.id], field), (node.id, field)
    assert sum(s["fusions"] for s in statuses.values()) == 10  # one aggregation a round


@pytest.mark.slow
def test_a_node_without_the_plugin_refuses_its_peers_with_unknown_model_and_they_see_it(
        fleet_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = install_plugin(tmp_path / "site", "fleet_plugins_b", models={"tiny-b": "tiny"})
    monkeypatch.syspath_prepend(str(folder))  # the test plans the fleet; of the daemons, node-2 lacks the plugin
    config = FLEET.model_copy(update={"nodes": 3, "model": "tiny-b", "hidden": None})
    nodes = plan_fleet(config, "defkt", fleet_shards, tmp_path, [Placement("127.0.0.1")] * 3,
                       swarm=f"plug-{uuid.uuid4().hex[:8]}", mdns=False, static_peers=True)
    for node in nodes[:2]:
        node.env["PYTHONPATH"] = _on_pythonpath(folder)
    nodes[2].env.update(DFL_MODEL="mlp", DFL_HIDDEN="32,32")  # node-2 has no plugin: it runs a built-in

    def refused(status: dict | None, peer: str, reason: str, by: str) -> bool:
        return status is not None and any((r["id"], r["reason"], r["by"]) == (peer, reason, by)
                                          for r in status["refused_peers"])

    with running_daemons(nodes):
        statuses = wait_until(nodes, lambda s: all(refused(s["node-2"], p, "unknown_model", "us")
                                                   and refused(s[p], "node-2", "unknown_model", "peer")
                                                   and any(peer["alive"] for peer in s[p]["peers"])
                                                   for p in ("node-0", "node-1")), timeout=120)
        log = nodes[2].log_path.read_text()
        nodes[2].stop()  # node-2 gets the plugin, and runs the fleet's model: it is let in, and nothing stays refused
        nodes[2].env.update(PYTHONPATH=_on_pythonpath(folder), DFL_MODEL="tiny-b", DFL_HIDDEN="",
                            DFL_STATE_DIR=str(tmp_path / "state" / "node-2-again"))
        nodes[2].start()
        mended = wait_until(nodes, lambda s: all(st is not None and not st["refused_peers"] and
                                                 sum(p["alive"] for p in st["peers"]) == 2 for st in s.values()),
                            timeout=120)
    assert {st["model"] for st in mended.values()} == {"tiny-b"}
    assert statuses["node-2"]["rejected"]["unknown_model"] >= 2 and statuses["node-2"]["peers"] == []
    assert [p["id"] for p in statuses["node-0"]["peers"]] == ["node-1"]  # the two with the plugin are a fleet
    detail = next(r["detail"] for r in statuses["node-2"]["refused_peers"] if r["reason"] == "unknown_model")
    assert "'tiny-b' is neither built in, installed here" in detail
    assert len(re.findall(r"WARNING .*refused node-0 .* at hello: unknown_model", log)) == 1  # once, not per Hello


def _write_data(folder: Path, features: int, seed: int) -> None:
    """A node's shard of two-class tabular data with ``features`` columns (train, val and a test set)."""
    from dfl_node.learning.datasets import ArrayDataset, save_shard

    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    for name, n in (("train", 80), ("val", 20), ("test", 20)):
        x = torch.randn(n, features, generator=generator)
        save_shard(folder / f"{name}.safetensors", ArrayDataset(x, (x.sum(1) > 0).long(), 2))


@pytest.mark.slow
def test_a_device_with_other_features_is_visible_in_status_and_status_all(tmp_path: Path) -> None:
    config = FLEET.model_copy(update={"nodes": 3, "hidden": [16]})
    shards = tmp_path / "shards"
    for i, features in enumerate((6, 6, 5)):  # node-2's sensor gives one column less
        _write_data(shards / f"node-{i}", features, seed=i)
    nodes = plan_fleet(config, "defkt", shards, tmp_path, [Placement("127.0.0.1")] * 3,
                       swarm=f"feat-{uuid.uuid4().hex[:8]}", mdns=False, static_peers=True,
                       extra={"min_peers": 2})  # nobody trains: no node has two compatible peers
    for node in nodes:
        node.env["DFL_TEST_DATA"] = str(shards / node.id / "test.safetensors")

    def isolated(statuses: dict) -> bool:
        return all(s is not None for s in statuses.values()) and \
            "has no compatible peer" in nodes[2].log_path.read_text()

    with running_daemons(nodes):
        statuses = wait_until(nodes, isolated, timeout=120)
        fleet = invoke("status", nodes[0].url, "--all")
        lonely = invoke("status", nodes[2].url, "--all")
        as_json = json.loads(invoke("status", nodes[0].url, "--all", "--json").output)
        logs = [n.log_path.read_text() for n in nodes]
    print(fleet.output, lonely.output)  # what an operator sees, shown where the test fails
    odd = statuses["node-2"]
    assert odd["peers"] == [] and {(r["id"], r["reason"]) for r in odd["refused_peers"]} == {
        ("node-0", "sample_shape_mismatch"), ("node-1", "sample_shape_mismatch")}
    entry = next(r for r in statuses["node-0"]["refused_peers"] if r["by"] == "us")
    assert (entry["id"], entry["reason"]) == ("node-2", "sample_shape_mismatch")
    assert entry["detail"] == "samples (5,) there, (6,) here: other features, or another layout"
    assert statuses["node-0"]["rejected"]["sample_shape_mismatch"] >= 2  # counted at every Hello …
    assert len(re.findall(r"WARNING .*refused node-2 .*sample_shape_mismatch", logs[0])) == 1  # … logged once
    assert re.search(r"WARNING .*node-2 has no compatible peer: .*node-0 \(sample_shape_mismatch\)", logs[2])
    assert fleet.exit_code == 0 and "Traceback" not in fleet.output
    assert re.search(r"│ node-0 .* ok, 1 refused", fleet.output)  # the fleet table: its state …
    assert re.search(r"│ node-2 .* no compatible", fleet.output)  # … node-2 queried, though not a peer of node-0
    assert re.search(r"│ node-0 +│ node-2 +│ sample_shape_mismatch +│ both +│ samples \(5,\) there", fleet.output)
    assert re.search(r"│ node-2 +│ node-0 +│ sample_shape_mismatch +│ both +│ samples \(6,\) there", lonely.output)
    assert {s["id"] for s in as_json} == {"node-0", "node-1", "node-2"}


def test_dfl_node_plugins_lists_an_installed_plugin_and_checks_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = install_plugin(tmp_path / "site", "listed_plugins", models={"listed-tiny": "tiny",
                                                                        "listed-broken": "NOT_CALLABLE"},
                            algorithms={"listed-kt": "PluginKT"})
    monkeypatch.syspath_prepend(str(folder))
    for verb in ("start", "simulate"):  # --help offers the installed names, and says where plugins come from …
        shown = invoke(verb, "--help").output
        choices = re.search(r"--model \[([^\]]*)\]", shown)
        assert choices and {"mlp", "listed-tiny", "listed-broken", "package.module:factory"} <= set(
            choices.group(1).split("|"))
        assert "listed-kt" in shown and "Models and algorithms of your own" in shown
    listing = json.loads(invoke("plugins", "--json").output)
    assert "listed_plugins" not in sys.modules  # … and neither --help nor the listing imported a plugin
    assert {"name": "listed-tiny", "value": "listed_plugins:tiny", "package": "listed-plugins",
            "version": "0.1.0"} in listing["models"]["plugins"]
    assert [p["name"] for p in listing["algorithms"]["plugins"]] == ["listed-kt"]
    assert {"mlp", "cnn", "cnn-ln"} <= set(listing["models"]["builtin"]) and "digits" in listing["datasets"]["builtin"]
    table = invoke("plugins")
    assert table.exit_code == 0 and "listed-tiny" in table.output and "listed-plugins 0.1.0" in table.output
    checked = json.loads(invoke("plugins", "--json", "--check").output)
    problems = {p["name"]: p["problem"] for p in checked["models"]["plugins"] + checked["algorithms"]["plugins"]}
    assert problems == {"listed-tiny": None, "listed-kt": None,
                        "listed-broken": "listed_plugins:NOT_CALLABLE is not callable"}
    assert invoke("plugins", "--check").exit_code == 1


@pytest.mark.parametrize(("reference", "problem"), [
    ("no_such_module_anywhere:factory", "cannot load no_such_module_anywhere:factory: ModuleNotFoundError"),
    ("errors_plugins:missing", "cannot load errors_plugins:missing: AttributeError"),
    ("errors_plugins:NOT_CALLABLE", "errors_plugins:NOT_CALLABLE is not callable (it is a int)"),
])
def test_a_model_reference_that_cannot_load_is_one_line_at_start_exit_2(
        fleet_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None, reference: str,
        problem: str) -> None:
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", "errors_plugins")))
    result = invoke("start", "--id", "node-0", "--data", str(fleet_shards / "node-0"), "--model", reference,
                    "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 2
    [line] = error_lines(result)
    assert line.startswith("Error: --model: ") and problem in line


@pytest.mark.parametrize(("factory", "problem"), [
    ("returns_none", "its factory returned a NoneType, not a torch.nn.Module"),
    ("wrong_output", "gives (2, 64) for a batch of 2 samples of shape (1, 8, 8); a model for 10 classes must give "
                     "(2, 10) scores"),
    ("refuses", "failed to build for samples (1, 8, 8) and 10 classes: ValueError: samples (1, 8, 8) are not"),
])
def test_a_model_factory_that_fails_for_the_data_is_one_line_exit_2(
        fleet_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None, factory: str,
        problem: str) -> None:
    folder = install_plugin(tmp_path / "site", "build_plugins")
    monkeypatch.syspath_prepend(str(folder))
    simulated_run = invoke("simulate", "--model", f"build_plugins:{factory}", "--nodes", "2", "--rounds", "1",
                           "--quiet", "--algorithm", "defkt", "--workdir", str(tmp_path / "sim"))
    assert simulated_run.exit_code == 2 and problem in error_lines(simulated_run)[-1]
    if factory == "wrong_output":  # and a device's start, as an operator runs it
        done = subprocess.run([sys.executable, "-m", "dfl_node", "start", "--id", "node-0", "--data",
                               str(fleet_shards / "node-0"), "--state-dir", str(tmp_path / "state"), "--no-mdns",
                               "--http-port", "0", "--model", "build_plugins:wrong_output"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": _on_pythonpath(folder)})
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1] == f"error: model build_plugins:wrong_output {problem}"
        assert not (tmp_path / "state" / "model.safetensors").exists()


def test_a_peer_cannot_make_a_node_import_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a reference this node is configured with, or an installed plugin's name, resolves: a module a peer
    names is never imported, even one that is importable here."""
    (tmp_path / "canary_module.py").write_text("raise SystemExit('imported because a peer said so')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("canary_module:factory", "os:system", "canary_module:factory:1"):
        with pytest.raises(ValueError, match="unknown model"):
            ModelSpec.parse(spec)
    assert "canary_module" not in sys.modules


def test_the_example_plugin_package_installs_and_its_model_builds(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/smart-meters/plugin, installed with pip as a user would (from a copy: pip builds in the source
    folder), is listed and loads; its meter-cnn classifies days of 24 readings, as (24,) or (1, 24)."""
    source = shutil.copytree(Path(__file__).parents[1] / "examples" / "smart-meters" / "plugin", tmp_path / "src")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    monkeypatch.syspath_prepend(str(target))
    listing = invoke("plugins", "--check")
    assert listing.exit_code == 0 and "meter-cnn  meter_models:meter_cnn  (meter-models 0.1.0)  ok" in listing.output
    for shape in ((24,), (1, 24)):
        model = ModelSpec.parse("meter-cnn").build(shape, 2, seed=0)
        assert model(torch.zeros(5, *shape)).shape == (5, 2)
