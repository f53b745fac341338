"""README shows code that exists: its algorithm example is the package's own module, verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_algorithm_is_the_gossip_module() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"The whole of pull gossip.*?```python\n(.*?)```", readme, re.S)
    assert shown, "README lost its 'Writing an algorithm' example"
    module = (ROOT / "dfl_node" / "algorithms" / "gossip.py").read_text()
    code = module.split('"""', 2)[2].lstrip("\n")  # the module without its docstring
    assert shown.group(1) == code
    assert len(module.splitlines()) < 60


def test_what_pyproject_and_readme_promise_is_in_the_repository() -> None:
    """The license pyproject.toml declares ships with the code; what the examples write is not committed."""
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {"/dfl-state/", "/shards/", "/node-*.log"} <= set(ignored)  # README's fleet example writes these here
