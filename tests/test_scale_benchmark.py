"""benchmarks/scale.py at tiny scale: 3 daemons, a few seconds each of idle and of work.

Why: the benchmark is a 5-minute, 16-daemon run that nobody starts casually, so without this a change to the
testbed's helpers or to ``/status`` could break it unnoticed. Here both of its fleets start, discover each
other, the run fuses, and the JSON carries every figure the benchmark reports. The figures themselves (RSS,
CPU) are not asserted: this is a shared 2-core machine; only that they were measured.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ISOLATED_PYTHON = Path(__file__).with_name("isolated-python")
NODES = 3

pytestmark = pytest.mark.slow


def isolated(argv: list[str]) -> list[str]:
    """In a network namespace of its own where allowed (root), as the README runs it: the daemons' mDNS stays
    inside; elsewhere on this machine's loopback, as the other daemon tests run."""
    if os.geteuid() == 0 and shutil.which("unshare"):
        return [str(ISOLATED_PYTHON), *argv]
    return argv


def test_tiny_fleet_reports_discovery_fusions_rss_and_cpu(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--nodes", str(NODES), "--duration", "6",
            "--idle", "2", "--settle", "1", "--every", "0.5", "--workdir", str(tmp_path)]
    run = subprocess.run(isolated(argv), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["nodes"] == NODES and report["mode"] == "async" and report["threads_per_node"] == 1
    assert report["checks"]["passed"] and report["checks"]["errors"]["count"] == 0, report["checks"]

    idle = report["idle"]
    assert idle["stayed_idle"] and len(idle["per_node"]) == NODES, idle
    assert all(v["peers_alive"] == NODES - 1 and v["rss_mb"] > 0 and v["cpu_percent"] >= 0
               for v in idle["per_node"].values()), idle
    assert set(idle["targets"]) == {"rss_mb_per_node", "cpu_percent_per_node", "rss_met", "cpu_met"}

    run_ = report["run"]
    per_node = run_["per_node"]
    assert len(per_node) == NODES
    for node_id, v in per_node.items():
        assert v["peers_seen"] == NODES - 1 and v["fusions"] > 0, (node_id, v)
        rss = v["rss_mb"]
        assert rss["start"] > 0 and rss["mean"] <= rss["peak"] and rss["end"] <= rss["peak"], (node_id, rss)
        assert v["cpu_percent"] > 0, (node_id, v)
    totals = run_["totals"]
    assert totals["fusions"] == sum(v["fusions"] for v in per_node.values())
    assert 0 < totals["rss_mb_end"] <= totals["rss_mb_peak"] <= totals["rss_mb_sum_of_node_peaks"] + 1, totals
    assert report["workdir"] == str(tmp_path) and (tmp_path / "run" / "node-0.log").exists()
