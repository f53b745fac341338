"""The daemon's homes agree on one node command line, and each file is valid for its tool.

- docker-compose.yml validates against the official Compose Specification JSON schema, vendored as
  tests/data/compose-spec.json from github.com/compose-spec/compose-spec, schema/compose-spec.json at
  commit 00655e2222608fa6eaecdf12ac5195889ca2244a (74133 bytes).
- deploy/node.env is THE shared node command line: Compose (env_file), Kubernetes (kustomize
  configMapGenerator) and the namespace testbed read that one file; systemd installs a copy of it.
- Every DFL_* key anywhere in deploy/ or the compose files is a field of NodeConfig, and each home's
  full environment for a node is a valid NodeConfig.
- The mutual-TLS variants (docker-compose.tls.yml, the deploy-tls/ kustomize overlay, the systemd
  drop-in deploy/systemd/dfl-node-tls.conf): their documented commands are run (kubectl with
  --dry-run=client), the files they make are placed where each home mounts them, and every node's
  configuration then loads its certificate with the node's own checks (dfl_node.net.tls.load_tls).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from cryptography import x509

from dfl_node.config import load_config
from dfl_node.node.config import NodeConfig
from dfl_node.learning.fleet import fleet_ids
from dfl_node.net.certs import CA_CERT, NODE_CERT, NODE_KEY
from dfl_node.net.tls import TlsFiles, dns_names, load_tls, tls_files
from dfl_node.testbed.netns import PER_NODE_KEYS, NetnsHost, node_environment, read_env_file

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
K8S_TLS = ROOT / "deploy-tls"
SYSTEMD_TLS = DEPLOY / "systemd" / "dfl-node-tls.conf"
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
    files = [COMPOSE, COMPOSE_TLS, *sorted(p for d in (DEPLOY, K8S_TLS) for p in d.rglob("*") if p.is_file())]
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


# ----------------------------------------------------------------------------- mutual TLS variants
SECRET_MARKERS = ("PRIVATE KEY", "BEGIN CERTIFICATE")  # PEM; no credentials live in this repository


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
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
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
    files = tls_files(config.tls_dir, config.tls_ca, config.tls_cert, config.tls_key)
    assert files is not None, "TLS is not configured"
    return files


# Compose
def test_compose_tls_override_is_valid_and_adds_only_tls(raw_compose: dict) -> None:
    raw = yaml.safe_load(COMPOSE_TLS.read_text())
    unset: list[str] = []
    resolved = interpolate(raw, unset)
    assert unset == [], f"variables without a default: {unset}"
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    for document in (raw, resolved):
        assert [e.message for e in validator.iter_errors(document)] == []
    _, _, nodes = split_services(interpolate(raw_compose, []))
    assert set(resolved["services"]) == set(nodes), "every node, and only nodes, get credentials"
    for name, svc in resolved["services"].items():
        assert set(svc) == {"environment", "secrets"}
        assert set(svc["environment"]) == {"DFL_TLS_DIR"}
        for secret in svc["secrets"]:
            assert resolved["secrets"][secret["source"]] == {"file": f"./certs/{name}/{secret['target']}"}
    assert not any(marker in COMPOSE_TLS.read_text() for marker in SECRET_MARKERS)


def test_compose_tls_documented_certs_load_where_each_node_reads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = documented_commands(COMPOSE_TLS)
    setup = [c for c in steps if c.startswith(("dfl-node ", "for ", "sudo "))]
    assert len(setup) == 3 and all(c.startswith(("docker compose ", "CERTS_DIR=")) for c in steps if c not in setup)
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
        config = node_config(env, monkeypatch)
        # a relative secret target is mounted at /run/secrets/<target>; ${CERTS_DIR:-./certs} is ./certs here
        mounts = {Path("/run/secrets") / s["target"]: tmp_path / interpolate(tls["secrets"][s["source"]]["file"], [])
                  for s in override["secrets"]}
        material = load_tls(mounted(tls_of(config), mounts), config.id)
        assert material.node_id == name == config.id


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
        assert svc["environment"] == {**base["environment"], "DFL_TLS_DIR": "/run/secrets"}  # merged, not replaced
        files = {s["target"]: merged["secrets"][s["source"]]["file"] for s in svc["secrets"]}
        assert files == {f: str(tmp_path / name / f) for f in (CA_CERT, NODE_CERT, NODE_KEY)}
        assert {k: v for k, v in svc.items() if k not in ("environment", "secrets")} == \
            {k: v for k, v in base.items() if k != "environment"}


def test_certificates_stay_out_of_git_and_the_image() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {"/certs/", "/swarm-ca/", "/tls/"} <= set(ignored)  # where the documented commands write keys
    docker_ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert docker_ignore[0] == "*" and not [line for line in docker_ignore if "cert" in line or "swarm" in line or "tls" in line]
    for path in [COMPOSE, COMPOSE_TLS, *(p for d in (DEPLOY, K8S_TLS) for p in d.rglob("*") if p.is_file())]:
        assert not any(marker in path.read_text(errors="replace") for marker in SECRET_MARKERS), path


# Kubernetes
def kustomize(folder: Path) -> dict[tuple[str, str], dict]:
    built = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=True)
    assert not any(marker in built.stdout for marker in SECRET_MARKERS)
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout)}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) not installed")
def test_kustomize_tls_overlay_mounts_the_secret_and_sets_the_tls_files() -> None:
    base, overlay = kustomize(DEPLOY), kustomize(K8S_TLS)
    assert overlay.keys() == base.keys() and not [k for k in overlay if k[0] == "Secret"]  # the operator makes it
    sts_key = next(k for k in overlay if k[0] == "StatefulSet")
    assert all(overlay[k] == base[k] for k in overlay if k != sts_key)
    sts, pod = overlay[sts_key], overlay[sts_key]["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "dfl-node-tls"
    mode = volume["secret"]["defaultMode"]
    assert mode & 0o040 and not mode & 0o007 and pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    (mount,) = [m for m in node["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert not [m for c in pod["initContainers"] for m in c["volumeMounts"] if m["name"] == volume["name"]]
    names = [e["name"] for e in node["env"]]
    tls_vars = ["DFL_TLS_CA", "DFL_TLS_CERT", "DFL_TLS_KEY"]
    assert [n for n in names if n.startswith("DFL_TLS")] == tls_vars
    assert min(names.index(n) for n in tls_vars) > names.index("DFL_ID")  # $(DFL_ID) is expanded only if defined before
    # without the additions, the overlay's StatefulSet is the base's
    stripped = copy.deepcopy(sts)
    spec = stripped["spec"]["template"]["spec"]
    spec["volumes"].remove(volume)
    spec["containers"][0]["volumeMounts"].remove(mount)
    spec["containers"][0]["env"] = [e for e in spec["containers"][0]["env"] if e["name"] not in tls_vars]
    assert stripped == base[sts_key]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubernetes_documented_secret_gives_each_pod_its_certificate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = documented_commands(K8S_TLS / "kustomization.yaml")
    assert steps[-1] == "kubectl apply -k deploy-tls/" and any(c.startswith("kubectl create secret") for c in steps)
    in_readme(steps)
    secret = yaml.safe_load(run_documented(steps[:-1], tmp_path))
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "dfl-node-tls"
    # the Secret volume: one file per key
    volume = tmp_path / "volume"
    volume.mkdir()
    for key, data in secret["data"].items():
        (volume / key).write_bytes(base64.b64decode(data))

    overlay = kustomize(K8S_TLS)
    (sts,) = [d for k, d in overlay.items() if k[0] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    (mount,) = [m["mountPath"] for m in node["volumeMounts"] if m["name"] == "tls"]
    configs, used = [], set()
    for index in range(sts["spec"]["replicas"]):
        env = expand(node["env"], {"POD_NAME": f"{sts['metadata']['name']}-{index}", "POD_INDEX": str(index)})
        config = node_config({**SHARED, **{k: v for k, v in env.items() if k.startswith("DFL_")}}, monkeypatch)
        files = tls_of(config)
        mounts = {path: volume / path.relative_to(mount) for path in (files.ca, files.cert, files.key)}
        used |= {p.name for p in mounts.values()}
        configs.append((config, load_tls(mounted(files, mounts), config.id)))
    assert used == set(secret["data"]), "every key of the Secret is read by a pod, and every file a pod reads exists"
    # static peers: each address a node dials is a DNS name of that peer's certificate
    by_address = {f"{c.advertise}:{c.grpc_port}": x509.load_pem_x509_certificate(m.cert) for c, m in configs}
    for config, _ in configs:
        for peer in config.peers:
            assert peer.rsplit(":", 1)[0] in dns_names(by_address[peer]), peer


# systemd
def test_systemd_tls_dropin_hands_the_node_its_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (service,) = unit_entries(SYSTEMD_TLS).values()
    credentials = dict(value.split(":", 1) for key, value in service if key == "LoadCredential")
    assert set(credentials) == {CA_CERT, NODE_CERT, NODE_KEY}  # the names --tls-dir reads
    assert all(Path(source).parent == Path("/etc/dfl-node/tls") for source in credentials.values())
    environment = [value for key, value in service if key == "Environment"]
    assert [key for key, _ in service] == ["LoadCredential"] * 3 + ["Environment"]
    (assignment,) = environment
    name, _, value = assignment.partition("=")
    assert name == "DFL_TLS_DIR"
    # what systemd does at start: copy each source into /run/credentials/<unit> under its credential name
    device = read_env_file(DEPLOY / "systemd" / "dfl-node.env")
    assert not [key for key in device if key.startswith("DFL_TLS")]  # an EnvironmentFile= would override the drop-in
    etc = tmp_path / "etc"
    subprocess.run([sys.executable, "-m", "dfl_node", "certs", "init", "--out", str(tmp_path / "ca")], check=True,
                   capture_output=True, timeout=60)
    subprocess.run([sys.executable, "-m", "dfl_node", "certs", "issue", device["DFL_ID"], "--ca", str(tmp_path / "ca"),
                    "--out", str(etc), "--ip", device["DFL_HOST"]], check=True, capture_output=True, timeout=60)
    run = Path(value.replace("%n", "dfl-node.service").replace("%d", "/run/credentials/dfl-node.service"))
    assert run == Path("/run/credentials/dfl-node.service")  # systemd's credentials directory for a system service
    creds = tmp_path / "credentials"
    creds.mkdir()
    for credential, source in credentials.items():
        shutil.copy(etc / Path(source).name, creds / credential)
    config = node_config({**SHARED, **device, name: str(creds)}, monkeypatch)
    assert load_tls(tls_of(config), config.id).node_id == device["DFL_ID"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_with_the_tls_dropin(tmp_path: Path) -> None:
    text = (DEPLOY / "systemd" / "dfl-node.service").read_text()
    (tmp_path / "dfl-node.service").write_text(re.sub(r"(?m)^ExecStart=.*$", "ExecStart=/bin/true", text))
    dropins = tmp_path / "dfl-node.service.d"
    dropins.mkdir()
    dropin = dropins / SYSTEMD_TLS.name

    def verify() -> subprocess.CompletedProcess:  # drop-ins are read from the unit search path only
        return subprocess.run(["systemd-analyze", "verify", "dfl-node.service"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"})

    dropin.write_text(SYSTEMD_TLS.read_text() + "LoadCredential=bad/name:/x\n")  # the control: a broken drop-in
    assert "ignoring" in verify().stderr, "systemd-analyze did not read the drop-in"
    shutil.copy(SYSTEMD_TLS, dropin)
    res = verify()
    assert res.returncode == 0 and "Unknown" not in res.stderr and "ignoring" not in res.stderr, res.stderr
