"""What a node installs and loads: `dfl-node start` imports nothing it does not use, and the verbs
that draw (the ``[plot]`` extra) say in one line how to get matplotlib where it is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfl_node.cli import cli
from dfl_node.testbed.launcher import Placement, plan_fleet
from tests.helpers.fleet import FLEET

ROOT = Path(__file__).resolve().parents[1]
PLOT_MISSING = "draws with matplotlib, which is not installed: pip install 'dfl-node[plot]'"

# Modules a node has no use for: scikit-learn and matplotlib are not even its dependencies any more, Ray is an
# extra of sweeps, SciPy and pandas come with them; cryptography only with mutual TLS (--tls-dir), gRPC
# reflection only with --reflection (grpcio imports the empty grpc_reflection package itself: its v1alpha is
# the service); the REST API serves no WebSocket, so uvicorn loads no WebSocket protocol (wsproto); the node's
# SGD is its own, so torch.optim never loads its compiler (torch._dynamo).
UNUSED = ("sklearn", "matplotlib", "ray", "scipy", "pandas", "cryptography", "grpc_reflection.v1alpha", "wsproto",
          "websockets", "torch._dynamo")

# `dfl-node start` as its console script runs it, in this process, then what it had imported once it was done.
AUDIT = f"""
import sys
from dfl_node.cli import cli
try:
    cli(["start"])
except SystemExit as exc:
    print("exit", exc.code)
print("unused:", sorted(m for m in {UNUSED!r} if m in sys.modules))
"""


@pytest.mark.slow
def test_a_running_node_imports_nothing_it_does_not_use(fleet_shards: Path, tmp_path: Path) -> None:
    """Two real nodes (defaults: no TLS, no reflection) that play 3 rounds with each other, evaluate, and exit
    when done; each then lists what it imported of :data:`UNUSED`."""
    config = FLEET.model_copy(update={"nodes": 2, "rounds": 3, "eval_every": 1})
    nodes = plan_fleet(config, "defkt", fleet_shards, tmp_path, [Placement("127.0.0.1")] * 2, swarm="footprint",
                       mdns=False, static_peers=True, extra={"exit_when_done": True})
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    procs = [subprocess.Popen([sys.executable, "-c", AUDIT], env=env | node.env, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for node in nodes]
    try:
        outputs = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for node, (out, err) in zip(nodes, outputs):
        assert out.splitlines() == ["exit 0", "unused: []"], (node.id, out, err[-2000:])


def test_plot_without_matplotlib_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without [plot] finds: no matplotlib
    results = tmp_path / "defkt.json"
    results.write_text("{}")
    done = CliRunner().invoke(cli, ["plot", str(results), "-o", str(tmp_path / "fig.png")])
    assert done.exit_code == 1
    assert done.stderr == f"error: dfl-node plot {PLOT_MISSING}\n" and done.stdout == ""
    assert not (tmp_path / "fig.png").exists()


def test_a_sweep_without_matplotlib_fails_before_its_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its report draws a figure per grid point: it says so at once, not after hours of runs."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "sweep"
    done = CliRunner().invoke(cli, ["sweep", str(ROOT / "experiments" / "sweep_digits.yaml"), "--out", str(out)])
    assert done.exit_code == 1
    assert done.stderr == f"error: dfl-node sweep {PLOT_MISSING}\n"
    assert not out.exists()
