"""benchmarks/sim_speed.py's before/after machinery on a tiny setting, so that README's benchmark
command cannot silently stop running again.

Why: the benchmark times an older tree (a temporary ``git worktree`` of an old commit)
against this one, each in a child process that must import ``dfl_node`` from its own tree. It once
died in the old tree's pass, because the editable install of another checkout served it the newer
``dfl_node.settings.loading`` (``'ExperimentConfig' object has no attribute 'unusable_here'``), and no
test ran it. Here: one pass per tree, two algorithms on the embedded digits data, 40 timed rounds (a round's
cost is the difference of two runs: by the process's CPU time that stands above a run's start-up; by the clock,
which counts whatever else this machine runs meanwhile, it may not); the speeds themselves are not asserted (a
2-core shared machine), only that both trees were timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sim_speed import PRE_ISSUE

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

TINY = """\
name: sim_speed_tiny
dataset: digits
partition: iid
nodes: 4
algorithms: [defkt, fullavg]
batch_size: 32
mkt_batch_size: 32
"""


def _has_commit(commit: str) -> bool:
    """A shallow clone or an exported tree lacks the old commit: the benchmark cannot run there."""
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return found.returncode == 0


@pytest.mark.skipif(not _has_commit(PRE_ISSUE), reason=f"no git history with {PRE_ISSUE[:7]} here")
def test_both_trees_are_timed_in_one_run(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_speed.py"), "--rounds", "40", "--repeat", "1",
                          "--config", str(config)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert report["before"] == PRE_ISSUE and report["rounds"] == 40 and report["repeat"] == 1
    for algorithm in ("defkt", "fullavg"):
        entry = report[algorithm]
        for tree in ("before", "after"):
            assert len(entry[tree]["all_rounds_per_s"]) == 1 and isinstance(entry[tree]["rounds_per_s"], float), entry
            assert entry[tree]["cpu_rounds_per_s"] > 0 and entry[tree]["eval_s"] >= 0, entry
        assert entry["cpu_ratio"] > 0, entry
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "sim-speed-" not in worktrees  # the old tree's worktree is gone again
