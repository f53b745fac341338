"""The docs show code that exists: the algorithm example is the package's own module, verbatim; the simulator's
config example loads."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim.costs import CostModel

ROOT = Path(__file__).resolve().parents[1]


def test_the_algorithm_example_is_the_pull_and_gossip_modules() -> None:
    page = (ROOT / "docs" / "algorithms.md").read_text()
    shown = re.search(r"The whole of pull gossip.*?```python\n(.*?)```.*?```python\n(.*?)```", page, re.S)
    assert shown, "docs/algorithms.md lost its example"
    for block, name in zip(shown.groups(), ("pull.py", "gossip.py"), strict=True):
        module = (ROOT / "dfl_node" / "algorithms" / name).read_text()
        code = module.split('"""', 2)[2].lstrip("\n")  # the module without its docstring
        assert block == code, name
        assert len(module.splitlines()) < 60


def test_what_pyproject_and_readme_promise_is_in_the_repository() -> None:
    """The license pyproject.toml declares ships with the code; what the examples write is not committed."""
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {"/dfl-state/", "/shards/", "/node-*.log"} <= set(ignored)  # README's fleet example writes these here


def test_the_devices_links_and_faults_example_is_a_fleet_config() -> None:
    """The simulator's example (three speed classes, every kind of fault) loads as a 10-node config and costs."""
    block = (ROOT / "docs" / "simulator.md").read_text().split("three speed classes:\n\n```yaml\n")[1].split("```")[0]
    config = ExperimentConfig(nodes=10, **yaml.safe_load(block))
    faults = config.simulation.faults
    assert [len(faults.kills), len(faults.partitions), len(faults.links), len(faults.slow_nodes)] == [2, 1, 1, 1]
    costs = CostModel({f"node-{i}": f"127.0.0.1:{50_000 + i}" for i in range(10)}, config.simulation.devices,
                       config.simulation.links)
    assert sorted(set(costs.class_of.values())) == ["fast", "medium", "slow"]
