"""What the daemon's homes share: deploy/node.env is THE node command line (Compose reads it as an
env_file, Kubernetes through kustomize's configMapGenerator, the namespace testbed as it is; systemd
installs a copy), every DFL_* key anywhere in deploy/ or the compose files is a field of NodeConfig, the
image runs ``dfl-node`` unprivileged, and no credential is in the repository or the image.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dfl_node.learning.provision import fleet_ids
from dfl_node.testbed.netns import PER_NODE_KEYS, NetnsHost, node_environment
from tests.helpers.deploy import (
    COMPOSE,
    COMPOSE_TLS,
    DEPLOY,
    FIELDS,
    K8S_TLS,
    NODE_ENV,
    ROOT,
    SECRET_MARKERS,
    SHARED,
    deployed_node_config,
)


# ----------------------------------------------------------------------------- the image
def test_dockerfile_and_context() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert 'ENTRYPOINT ["dfl-node"]' in lines
    user = next(line for line in reversed(lines) if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert re.search(r"HEALTHCHECK .*CMD .*/healthz", text, re.S)
    torch = text.index("torch==")
    assert "download.pytorch.org/whl/cpu" in text[torch : text.index("\n", torch)]
    assert torch < text.index("COPY pyproject.toml") < text.index("pip install --no-deps /src")  # cache-friendly order
    ignore = [line for line in (ROOT / ".dockerignore").read_text().split("\n") if line and not line.startswith("#")]
    assert ignore[0] == "*" and {"!pyproject.toml", "!dfl_node/"} <= set(ignore)


# ----------------------------------------------------------------------------- the shared env file
def test_node_env_is_plain_and_portable() -> None:
    lines = [line for line in NODE_ENV.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for line in lines:  # the syntax Compose, kustomize, systemd and read_env_file all read identically
        assert re.fullmatch(r"DFL_[A-Z_]+=[A-Za-z0-9_.,:/-]+", line), line
    keys = [line.split("=")[0] for line in lines]
    assert len(keys) == len(set(keys)) == len(SHARED)
    assert set(keys) <= FIELDS
    assert not set(keys) & set(PER_NODE_KEYS)


def test_every_dfl_key_is_a_node_config_field() -> None:
    files = [COMPOSE, COMPOSE_TLS, *sorted(p for d in (DEPLOY, K8S_TLS) for p in d.rglob("*") if p.is_file())]
    for path in files:
        found = set(re.findall(r"\bDFL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
        assert found <= FIELDS, f"{path.relative_to(ROOT)} invents {sorted(found - FIELDS)}"


# ----------------------------------------------------------------------------- namespace testbed
def test_netns_testbed_uses_node_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    count = int(SHARED["DFL_MIN_PEERS"]) + 1
    for index in range(count):
        host = NetnsHost(f"dfl-x-h{index + 1}", f"10.77.0.{index + 1}")
        env = node_environment(SHARED, index, count, host, tmp_path / "shards", tmp_path / "state")
        assert {k: v for k, v in env.items() if k in SHARED} == SHARED and set(env) - set(SHARED) == set(PER_NODE_KEYS)
        config = deployed_node_config(env, monkeypatch)
        assert config.id == fleet_ids(count)[index] and config.network.advertised_host == host.address
    script = (DEPLOY / "netns" / "testbed.sh").read_text()
    assert "-m dfl_node.testbed.netns" in script and "docker" not in script


# ----------------------------------------------------------------------------- credentials
def test_certificates_stay_out_of_git_and_the_image() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {"/certs/", "/swarm-ca/", "/tls/"} <= set(ignored)  # where the documented commands write keys
    docker_ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
                     if line and not line.startswith("#")]
    assert docker_ignore[0] == "*"
    assert not [line for line in docker_ignore if "cert" in line or "swarm" in line or "tls" in line]
    for path in [COMPOSE, COMPOSE_TLS, *(p for d in (DEPLOY, K8S_TLS) for p in d.rglob("*") if p.is_file())]:
        assert not any(marker in path.read_text(errors="replace") for marker in SECRET_MARKERS), path
