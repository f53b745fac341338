"""The daemon's homes agree on one node command line, and each file is valid for its tool.

- docker-compose.yml validates against the official Compose Specification JSON schema, vendored as
  tests/data/compose-spec.json from github.com/compose-spec/compose-spec, schema/compose-spec.json at
  commit 00655e2222608fa6eaecdf12ac5195889ca2244a (74133 bytes).
- deploy/node.env is THE shared node command line: Compose (env_file), Kubernetes (kustomize
  configMapGenerator) and the namespace testbed read that one file; systemd installs a copy of it.
- Every DFL_* key anywhere in deploy/ or the compose file is a field of NodeConfig, and each home's
  full environment for a node is a valid NodeConfig.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from dfl_node.config import load_config
from dfl_node.node.config import NodeConfig
from dfl_node.learning.fleet import fleet_ids
from dfl_node.testbed.netns import PER_NODE_KEYS, NetnsHost, node_environment, read_env_file

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
NODE_ENV = DEPLOY / "node.env"
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
FIELDS = {f"DFL_{name.upper()}" for name in NodeConfig.model_fields}
K8S_DISCOVERY = {"DFL_MDNS", "DFL_PEERS"}  # the one thing Kubernetes does differently: no multicast
SHARED = read_env_file(NODE_ENV)


def node_config(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> NodeConfig:
    """What `dfl-node start` would make of exactly this environment."""
    for key in [k for k in os.environ if k.startswith("DFL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = load_config(NodeConfig)
    assert config.advertised_host  # 0.0.0.0 needs an advertised address
    return config


# ----------------------------------------------------------------------------- Compose
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
        assert set(env) == {*PER_NODE_KEYS, "DFL_STATUS_URL"}, "nodes set only per-node values; the rest is deploy/node.env"
        nid = env["DFL_ID"]
        ids.append(nid)
        assert env["DFL_DATA"] == f"{out}/{nid}" and env["DFL_TEST_DATA"] == f"{out}/test.safetensors"
        assert env["DFL_ADVERTISE"] == svc["hostname"] == name
        assert f"shards:{out}:ro" in svc["volumes"]
        assert any(env["DFL_STATE_DIR"].startswith(m.split(":")[1] + "/") for m in svc["volumes"] if m.startswith("state:"))
        assert svc["depends_on"] == {init_name: {"condition": "service_completed_successfully"}}
        assert "healthcheck" not in svc  # the image's HEALTHCHECK on /healthz applies
        (port,) = svc["ports"]
        host_ip, published, target = port.split(":")
        assert (host_ip, target) == ("127.0.0.1", SHARED["DFL_HTTP_PORT"])
        host_ports.append(published)
        assert env["DFL_STATUS_URL"] == f"http://127.0.0.1:{published}"  # what `dfl-node status --all` dials from the host
        config = node_config({**SHARED, **env}, monkeypatch)
        assert (config.id, config.host, config.mdns) == (nid, "0.0.0.0", True)
    assert sorted(ids) == fleet_ids(count)  # dfl-node partition's folder names
    assert len(set(host_ports)) == len(host_ports)


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
    files = [COMPOSE, *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]
    for path in files:
        found = set(re.findall(r"\bDFL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
        assert found <= FIELDS, f"{path.relative_to(ROOT)} invents {sorted(found - FIELDS)}"


# ----------------------------------------------------------------------------- Kubernetes
def k8s() -> tuple[dict, dict, dict]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = [d for r in kustomization["resources"] for d in yaml.safe_load_all((DEPLOY / r).read_text())]
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    return kustomization, sts, svc


def expand(env: list[dict], known: dict[str, str]) -> dict[str, str]:
    """Kubernetes' $(VAR) expansion of a container's env list, downward-API values given in ``known``."""
    out = dict(known)
    for item in env:
        if "value" in item:
            out[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out[m.group(1)], item["value"])
    return out


def test_kubernetes_env_is_node_env(monkeypatch: pytest.MonkeyPatch) -> None:
    kustomization, sts, svc = k8s()
    (generator,) = kustomization["configMapGenerator"]
    assert [(DEPLOY / e).resolve() for e in generator["envs"]] == [NODE_ENV]  # the file itself, no copy
    pod = sts["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    assert node["envFrom"] == [{"configMapRef": {"name": generator["name"]}}]
    keys = {item["name"] for item in node["env"] if item["name"].startswith("DFL_")}
    assert keys - set(PER_NODE_KEYS) == K8S_DISCOVERY and set(PER_NODE_KEYS) <= keys
    replicas, service = sts["spec"]["replicas"], sts["spec"]["serviceName"]
    for index in range(replicas):
        pod_name = f"{sts['metadata']['name']}-{index}"
        env = expand(node["env"], {"POD_NAME": pod_name, "POD_INDEX": str(index)})
        config = node_config({**SHARED, **{k: v for k, v in env.items() if k.startswith("DFL_")}}, monkeypatch)
        assert config.id == fleet_ids(replicas)[index] and config.advertise == f"{pod_name}.{service}"
        assert not config.mdns
        assert config.peers == [f"{sts['metadata']['name']}-{i}.{service}:{config.grpc_port}" for i in range(replicas)]
    assert replicas == int(SHARED["DFL_MIN_PEERS"]) + 1


def test_statefulset_probes_state_volume_and_partition() -> None:
    _, sts, svc = k8s()
    pod = sts["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    ports = {p["name"]: str(p["containerPort"]) for p in node["ports"]}
    assert ports == {"grpc": SHARED["DFL_GRPC_PORT"], "http": SHARED["DFL_HTTP_PORT"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert node[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    (mount,) = [m["mountPath"] for m in node["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    env = expand(node["env"], {"POD_NAME": "dfl-node-0", "POD_INDEX": "0"})
    for key in ("DFL_STATE_DIR", "DFL_DATA", "DFL_TEST_DATA"):
        assert Path(env[key]).is_relative_to(mount), key
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the init container partitions into the same volume, for the same fleet
    (init,) = pod["initContainers"]
    init_env = expand(init["env"], {"POD_INDEX": "0"})
    assert "exec dfl-node partition" in init["args"][0] and int(init_env["NODES"]) == sts["spec"]["replicas"]
    assert Path(init_env["SHARDS"]) / env["DFL_ID"] == Path(env["DFL_DATA"])
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}[claim["metadata"]["name"]] == mount
    # headless Service behind the pods' DNS names
    assert svc["spec"]["clusterIP"] == "None" and svc["metadata"]["name"] == sts["spec"]["serviceName"]
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == set(ports)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) not installed")
def test_kustomize_build_puts_node_env_in_the_configmap() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=True)
    docs = {d["kind"]: d for d in yaml.safe_load_all(built.stdout)}
    assert docs["ConfigMap"]["data"] == SHARED
    (node,) = docs["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    assert node["envFrom"][0]["configMapRef"]["name"] == docs["ConfigMap"]["metadata"]["name"]  # hashed name


# ----------------------------------------------------------------------------- systemd
def unit_entries(path: Path) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def test_systemd_unit_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = DEPLOY / "systemd" / "dfl-node.service"
    service = unit_entries(unit)["Service"]
    values = dict(service)
    assert [v for k, v in service if k == "EnvironmentFile"] == ["/etc/dfl-node/node.env", "/etc/dfl-node/dfl-node.env"]
    assert values["User"] not in ("", "root") and values["ExecStart"].endswith("dfl-node start")
    assert values["Restart"] == "on-failure" and values["StateDirectory"] == "dfl-node"
    assert values["NoNewPrivileges"] == "yes" and values["ProtectSystem"] == "strict"
    assert {"AF_INET", "AF_NETLINK"} <= set(values["RestrictAddressFamilies"].split())
    device = read_env_file(DEPLOY / "systemd" / "dfl-node.env")
    assert set(device) <= FIELDS and set(device) & set(SHARED) == {"DFL_HOST"}  # a device names its own address
    config = node_config({**SHARED, **device}, monkeypatch)
    assert config.host != "0.0.0.0" and config.state_path.is_relative_to("/var/lib/dfl-node")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    text = (DEPLOY / "systemd" / "dfl-node.service").read_text()
    unit = tmp_path / "dfl-node.service"  # the real ExecStart only exists once installed
    unit.write_text(re.sub(r"(?m)^ExecStart=.*$", "ExecStart=/bin/true", text))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "Unknown" not in res.stderr and "ignoring" not in res.stderr, res.stderr


# ----------------------------------------------------------------------------- namespace testbed
def test_netns_testbed_uses_node_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    count = int(SHARED["DFL_MIN_PEERS"]) + 1
    for index in range(count):
        host = NetnsHost(f"dfl-x-h{index + 1}", f"10.77.0.{index + 1}")
        env = node_environment(SHARED, index, count, host, tmp_path / "shards", tmp_path / "state")
        assert {k: v for k, v in env.items() if k in SHARED} == SHARED and set(env) - set(SHARED) == set(PER_NODE_KEYS)
        config = node_config(env, monkeypatch)
        assert config.id == fleet_ids(count)[index] and config.advertised_host == host.address
    script = (DEPLOY / "netns" / "testbed.sh").read_text()
    assert "-m dfl_node.testbed.netns" in script and "docker" not in script
