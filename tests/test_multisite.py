"""The multi-site testbed: 3 sites (bridges in namespaces, routed to each other by a router namespace),
2 daemons each, every node given one ``--join`` address in the next site. mDNS stays within each site (each site's
monitor hears its own nodes and nobody else's), yet every node knows every other within a few seconds of the last
start, and the fleet learns, in round mode (so the same models as on one LAN, or in the simulator)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dfl_node.testbed.netns import list_namespaces

pytestmark = [pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]
KNOWN_WITHIN_S = 20.0  # joins are tried at once, then after 1, 2, 4… s: a few seconds once every node serves


def test_three_sites_join_through_each_other_with_mdns_confined_and_learn(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")} | {"COLUMNS": "200"}
    out = tmp_path / "RESULTS.json"
    done = subprocess.run([sys.executable, "-m", "dfl_node", "testbed", "--netns", "--sites", "3", "--nodes", "6",
                           "--rounds", "6", "--eval-every", "3", "--timeout", "150", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    known = re.search(r"every node knew every other within ([\d.]+) s", done.stdout)
    assert known and float(known[1]) <= KNOWN_WITHIN_S, done.stdout[-3000:]
    sites = re.findall(r"site (\d): mDNS from (\d+) of its (\d+) nodes, (\d+) from elsewhere", done.stdout)
    assert sites == [(str(s), "2", "2", "0") for s in (1, 2, 3)], done.stdout[-3000:]
    result = json.loads(out.read_text())
    local = [n["local_accuracy"] for n in result["nodes"]]
    assert result["rounds"] == 6 and sum(local) / len(local) >= 0.15, local  # chance is 0.1
    assert not [n for n in list_namespaces() if "-s1h" in n or n.endswith("-rt")], "namespaces left behind"
