"""The Compose files: docker-compose.yml is valid for Compose and runs nodes on the shared node command
line; the mutual-TLS and swarm-key overrides (docker-compose.tls.yml, docker-compose.swarm-key.yml) add
credentials only, and their documented commands make credentials that each node loads where Compose mounts them.

docker-compose.yml validates against the official Compose Specification JSON schema, vendored as
tests/data/compose-spec.json from github.com/compose-spec/compose-spec, schema/compose-spec.json at
commit 00655e2222608fa6eaecdf12ac5195889ca2244a (74133 bytes).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from dfl_node.learning.provision import fleet_ids
from dfl_node.net.certs import CA_CERT, NODE_CERT, NODE_KEY
from dfl_node.net.swarm_tls import read_swarm_keys
from dfl_node.net.tls import load_tls
from dfl_node.secret_file import read_secret
from dfl_node.testbed.netns import PER_NODE_KEYS
from tests.helpers.deploy import (
    COMPOSE,
    COMPOSE_SWARM_KEY,
    COMPOSE_TLS,
    DEPLOY,
    NODE_ENV,
    ROOT,
    SECRET_MARKERS,
    SHARED,
    deployed_node_config,
    documented_commands,
    in_readme,
    mounted,
    run_documented,
    tls_of,
)

SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
HTTP_TOKEN = "http.token"
# node.env's DFL_INSECURE=true cannot be removed by an override, only set back to false; REST beyond loopback then
# needs its token
TLS_ENV = {"DFL_TLS_DIR": "/run/secrets", "DFL_INSECURE": "false", "DFL_HTTP_TOKEN_FILE": f"/run/secrets/{HTTP_TOKEN}"}
SWARM_KEY_ENV = {"DFL_SWARM_KEY_FILE": "/run/secrets/swarm.key", "DFL_INSECURE": "false",
                 "DFL_HTTP_TOKEN_FILE": f"/run/secrets/{HTTP_TOKEN}"}


_VAR = re.compile(r"\$(?:\$|\{(\w+)(?::?-([^}]*))?\}|(\w+))")


def interpolate(value: object, unset: list[str]) -> object:
    """Compose's ${VAR:-default} interpolation with an empty environment (records variables without a default)."""
    if isinstance(value, dict):
        return {k: interpolate(v, unset) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, unset) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group(2) is None:
            unset.append(m.group(1) or m.group(3))
            return ""
        return m.group(2)

    return _VAR.sub(one, value)


@pytest.fixture(scope="module")
def raw_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def compose(raw_compose: dict) -> dict:
    unset: list[str] = []
    resolved = interpolate(raw_compose, unset)
    assert unset == [], f"variables without a default break a bare `docker compose up`: {unset}"
    return resolved


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def split_services(compose: dict) -> tuple[str, dict, dict[str, dict]]:
    services = compose["services"]
    inits = {n: s for n, s in services.items() if s.get("command", [None])[0] == "partition"}
    nodes = {n: s for n, s in services.items() if s.get("command") == ["start"]}
    assert len(inits) == 1 and len(nodes) + 1 == len(services), "one partition service, the rest nodes"
    (init_name, init), = inits.items()
    return init_name, init, nodes


def test_compose_validates_against_the_compose_spec(raw_compose: dict, compose: dict) -> None:
    import json

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    for document in (raw_compose, compose):
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
        assert errors == []
    # the validator is not vacuous: it rejects what Compose rejects
    broken = copy.deepcopy(compose)
    broken["services"]["node-0"]["restart_policy"] = "always"
    broken["services"]["node-1"]["depends_on"]["partition"]["condition"] = "service_done"
    broken["volume"] = {}
    assert len(list(validator.iter_errors(broken))) == 3


def test_compose_references_resolve(compose: dict) -> None:
    services = compose["services"]
    for name, svc in services.items():
        for target in svc.get("depends_on", {}):
            assert target in services, f"{name} depends on unknown {target}"
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            assert source in compose["volumes"], f"{name}: undeclared volume {source}"
        for network in svc.get("networks", []):
            assert network in compose["networks"], f"{name}: undeclared network {network}"
        for env_file in svc.get("env_file", []):
            assert (COMPOSE.parent / env_file).is_file()


def test_compose_nodes_share_the_node_command_line(compose: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    init_name, init, nodes = split_services(compose)
    count, out = int(flag(init["command"], "--nodes")), flag(init["command"], "--out")
    assert count == len(nodes) == int(SHARED["DFL_MIN_PEERS"]) + 1
    assert f"shards:{out}" in init["volumes"] and init["healthcheck"] == {"disable": True}
    ids, host_ports = [], []
    for name, svc in nodes.items():
        assert [(COMPOSE.parent / f).resolve() for f in svc["env_file"]] == [NODE_ENV]
        env = svc["environment"]
        assert set(env) == {*PER_NODE_KEYS, "DFL_STATUS_URL"}, ("nodes set only per-node values; the rest is "
                                                                "deploy/node.env")
        nid = env["DFL_ID"]
        ids.append(nid)
        assert env["DFL_DATA"] == f"{out}/{nid}" and env["DFL_TEST_DATA"] == f"{out}/test.safetensors"
        assert env["DFL_ADVERTISE"] == svc["hostname"] == name
        assert f"shards:{out}:ro" in svc["volumes"]
        assert any(env["DFL_STATE_DIR"].startswith(m.split(":")[1] + "/")
                   for m in svc["volumes"] if m.startswith("state:"))
        assert svc["depends_on"] == {init_name: {"condition": "service_completed_successfully"}}
        assert "healthcheck" not in svc  # the image's HEALTHCHECK on /healthz applies
        (port,) = svc["ports"]
        host_ip, published, target = port.split(":")
        assert (host_ip, target) == ("127.0.0.1", SHARED["DFL_HTTP_PORT"])
        host_ports.append(published)
        # what `dfl-node status --all` dials from the host
        assert env["DFL_STATUS_URL"] == f"http://127.0.0.1:{published}"
        config = deployed_node_config({**SHARED, **env}, monkeypatch)
        assert (config.id, config.network.host, config.membership.mdns) == (nid, "0.0.0.0", True)
        # said explicitly (node.env): a private bridge
        assert config.network.insecure and config.network.open_to_network
    assert sorted(ids) == fleet_ids(count)  # dfl-node partition's folder names
    assert len(set(host_ports)) == len(host_ports)


# ----------------------------------------------------------------------------- the mutual-TLS override
def valid_override(path: Path, raw_compose: dict) -> tuple[dict, dict[str, dict]]:
    """An override file, resolved, and docker-compose.yml's nodes: the override valid for the Compose spec as written
    and resolved, every variable defaulted, giving every node, and only nodes, credentials, and holding no secret."""
    raw = yaml.safe_load(path.read_text())
    unset: list[str] = []
    resolved = interpolate(raw, unset)
    assert unset == [], f"variables without a default: {unset}"
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    for document in (raw, resolved):
        assert [e.message for e in validator.iter_errors(document)] == []
    _, _, nodes = split_services(interpolate(raw_compose, []))
    assert set(resolved["services"]) == set(nodes), "every node, and only nodes, get credentials"
    assert not any(marker in path.read_text() for marker in SECRET_MARKERS)
    return resolved, nodes


def test_compose_tls_override_is_valid_and_adds_only_tls(raw_compose: dict) -> None:
    resolved, _ = valid_override(COMPOSE_TLS, raw_compose)
    for name, svc in resolved["services"].items():
        assert set(svc) == {"environment", "secrets"}
        assert svc["environment"] == TLS_ENV
        for secret in svc["secrets"]:  # each node's own credentials, and the fleet's REST token
            where = "" if secret["target"] == HTTP_TOKEN else f"{name}/"
            assert resolved["secrets"][secret["source"]] == {"file": f"./certs/{where}{secret['target']}"}


def test_compose_tls_documented_certs_load_where_each_node_reads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = documented_commands(COMPOSE_TLS)
    setup = [c for c in steps if c.startswith(("dfl-node ", "for ", "sudo "))]
    assert len(setup) == 4 and all(c.startswith(("docker compose ", "CERTS_DIR=")) for c in steps if c not in setup)
    in_readme(steps)
    run_documented(setup, tmp_path)
    certs = tmp_path / "certs"
    uid, gid = re.findall(r"(?m)^USER (\d+):(\d+)\s*$", (DEPLOY / "Dockerfile").read_text())[-1]
    if os.geteuid() == 0:  # the image's user owns what Compose bind-mounts, or node.key (0600) is unreadable
        assert {(p.stat().st_uid, p.stat().st_gid) for p in certs.rglob("*")} == {(int(uid), int(gid))}
    assert (certs / "node-0" / NODE_KEY).stat().st_mode & 0o077 == 0

    compose = interpolate(yaml.safe_load(COMPOSE.read_text()), [])
    tls = yaml.safe_load(COMPOSE_TLS.read_text())
    _, _, nodes = split_services(compose)
    for name, svc in nodes.items():
        override = tls["services"][name]
        env = {**SHARED, **svc["environment"], **override["environment"]}
        config = deployed_node_config(env, monkeypatch)
        assert not config.network.insecure and not config.network.open_to_network
        # a relative secret target is mounted at /run/secrets/<target>; ${CERTS_DIR:-./certs} is ./certs here
        mounts = {Path("/run/secrets") / s["target"]: tmp_path / interpolate(tls["secrets"][s["source"]]["file"], [])
                  for s in override["secrets"]}
        material = load_tls(mounted(tls_of(config), mounts), config.id)
        assert material.node_id == name == config.id
        assert config.api.http_token_file == Path("/run/secrets") / HTTP_TOKEN and not config.api.open_to_network
        assert len(read_secret(mounts[config.api.http_token_file], "REST token", "http-token")) == 64


# ----------------------------------------------------------------------------- the swarm-key override
def test_compose_swarm_key_override_adds_only_the_key_and_its_documented_key_loads_where_nodes_read_it(
        raw_compose: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved, nodes = valid_override(COMPOSE_SWARM_KEY, raw_compose)

    steps = documented_commands(COMPOSE_SWARM_KEY)
    setup = [c for c in steps if c.startswith(("dfl-node ", "sudo "))]
    assert len(setup) == 3 and all(c.startswith("docker compose ") for c in steps if c not in setup)
    in_readme(steps)
    run_documented(setup, tmp_path)
    assert (tmp_path / "swarm-key" / "swarm.key").stat().st_mode & 0o077 == 0  # hence the chown
    for name, svc in resolved["services"].items():
        assert set(svc) == {"environment", "secrets"} and svc["environment"] == SWARM_KEY_ENV
        mounts = {Path("/run/secrets") / s["target"]: tmp_path / resolved["secrets"][s["source"]]["file"]
                  for s in svc["secrets"]}
        config = deployed_node_config({**SHARED, **nodes[name]["environment"], **svc["environment"]}, monkeypatch)
        assert not config.network.insecure and not config.network.open_to_network
        assert len(read_swarm_keys(mounts[config.network.swarm_key_file])) == 1
        assert len(read_secret(mounts[config.api.http_token_file], "REST token", "http-token")) == 64


@pytest.mark.skipif(shutil.which("docker") is None or subprocess.run(["docker", "compose", "version"],
                    capture_output=True).returncode != 0, reason="docker compose not installed")
def test_docker_compose_merges_the_tls_override(tmp_path: Path) -> None:
    argv = ["docker", "compose", "--project-directory", str(ROOT), "-f", str(COMPOSE), "-f", str(COMPOSE_TLS),
            "config", "--format", "json"]
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"} | {"CERTS_DIR": str(tmp_path)}
    merged = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True).stdout)
    plain = json.loads(subprocess.run(argv[:6] + argv[8:], env=env, capture_output=True, text=True, timeout=60,
                                      check=True).stdout)
    for name, svc in merged["services"].items():
        base = plain["services"][name]
        if "secrets" not in svc:
            assert name == "partition" and svc == base
            continue
        assert base["environment"]["DFL_INSECURE"] == "true"  # the plain fleet, from deploy/node.env
        assert svc["environment"] == {**base["environment"], **TLS_ENV}  # merged, not replaced
        files = {s["target"]: merged["secrets"][s["source"]]["file"] for s in svc["secrets"]}
        assert files == {**{f: str(tmp_path / name / f) for f in (CA_CERT, NODE_CERT, NODE_KEY)},
                         HTTP_TOKEN: str(tmp_path / HTTP_TOKEN)}
        assert {k: v for k, v in svc.items() if k not in ("environment", "secrets")} == \
            {k: v for k, v in base.items() if k != "environment"}
