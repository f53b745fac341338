"""Shared helpers of the deployment tests (test_deploy_*.py): where each home's files are, the shared node
command line (deploy/node.env), what ``dfl-node start`` makes of a home's environment, and running the
commands a file documents for its mutual-TLS variant.

Kept in one place so that every home is held to the same NodeConfig, the same env file and the same
reading of its documented commands.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dfl_node.net.tls import TlsFiles, tls_files
from dfl_node.settings.loading import load_config
from dfl_node.settings.node import NodeConfig
from dfl_node.testbed.netns import read_env_file

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
COMPOSE_SWARM_KEY = ROOT / "docker-compose.swarm-key.yml"
K8S_TLS = ROOT / "deploy-tls"
NODE_ENV = DEPLOY / "node.env"
FIELDS = {f"DFL_{name.upper()}" for name in NodeConfig.flat_fields()}
SHARED = read_env_file(NODE_ENV)
SECRET_MARKERS = ("PRIVATE KEY", "BEGIN CERTIFICATE")  # PEM; no credentials live in this repository


def deployed_node_config(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> NodeConfig:
    """What `dfl-node start` would make of exactly this environment."""
    for key in [k for k in os.environ if k.startswith("DFL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = load_config(NodeConfig)
    assert config.network.advertised_host  # 0.0.0.0 needs an advertised address
    return config


def documented_commands(path: Path) -> list[str]:
    """The shell commands of a file's leading comment: lines indented three spaces after ``#``, with
    backslash continuations joined (what an operator copies from the header)."""
    commands: list[str] = []
    current: str | None = None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        body = line[1:]
        if current is not None:
            current += " " + body.strip()
        elif body.startswith("   ") and body.strip():
            current = body.strip()
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
        else:
            commands.append(current)
            current = None
    return commands


def run_documented(commands: list[str], cwd: Path) -> str:
    """Run ``commands`` with bash in ``cwd`` as documented, with this checkout's ``dfl-node``, ``sudo``
    as a no-op when already root (the chown is then real), and ``kubectl`` that only prints (no cluster)."""
    prelude = [
        "set -euo pipefail",
        'dfl-node() { "$PYTHON" -m dfl_node "$@"; }',
        'sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else echo "not root, skipped: $*" >&2; fi; }',
        'kubectl() { command kubectl "$@" --dry-run=client -o yaml; }',
    ]
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["bash", "-c", "\n".join([*prelude, *commands])], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"{commands} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def in_readme(commands: list[str]) -> None:
    """Each command (without its trailing comment) appears in deploy/README.md, continuations joined."""
    readme = " ".join(re.sub(r"\\\n", " ", (DEPLOY / "README.md").read_text()).split())
    for command in commands:
        code = " ".join(command.split("  #")[0].split())
        assert code in readme, f"deploy/README.md lacks `{code}`"


def mounted(files: TlsFiles, mounts: dict[Path, Path]) -> TlsFiles:
    """The host files a container would see at ``files``' paths, given ``mounts`` (container path → host path)."""
    return TlsFiles(*(mounts[path] for path in (files.ca, files.cert, files.key)))


def tls_of(config: NodeConfig) -> TlsFiles:
    network = config.network
    files = tls_files(network.tls_dir, network.tls_ca, network.tls_cert, network.tls_key)
    assert files is not None, "TLS is not configured"
    return files
