"""The Kubernetes manifests: the StatefulSet's pods run the shared node command line (kustomize's
configMapGenerator reads deploy/node.env itself) with static peers instead of mDNS, probes and state on
their volume; the mutual-TLS overlay (deploy-tls/) only mounts a Secret and names its files, and its
documented commands (kubectl with --dry-run=client) make a Secret that gives each pod its certificate.
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from dfl_node.learning.provision import fleet_ids
from dfl_node.net.tls import dns_names, load_tls
from dfl_node.testbed.netns import PER_NODE_KEYS
from tests.helpers.deploy import (
    DEPLOY,
    K8S_TLS,
    NODE_ENV,
    SECRET_MARKERS,
    SHARED,
    deployed_node_config,
    documented_commands,
    in_readme,
    mounted,
    run_documented,
    tls_of,
)

K8S_DISCOVERY = {"DFL_MDNS", "DFL_PEERS"}  # the one thing Kubernetes does differently: no multicast


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
        config = deployed_node_config({**SHARED, **{k: v for k, v in env.items() if k.startswith("DFL_")}}, monkeypatch)
        assert config.id == fleet_ids(replicas)[index] and config.network.advertise == f"{pod_name}.{service}"
        # node.env says it: the plain variant trusts its pod network
        assert not config.membership.mdns and config.network.insecure
        port = config.network.grpc_port
        assert config.membership.peers == [f"{sts['metadata']['name']}-{i}.{service}:{port}" for i in range(replicas)]
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
    built = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60,
                           check=True)
    docs = {d["kind"]: d for d in yaml.safe_load_all(built.stdout)}
    assert docs["ConfigMap"]["data"] == SHARED
    (node,) = docs["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    assert node["envFrom"][0]["configMapRef"]["name"] == docs["ConfigMap"]["metadata"]["name"]  # hashed name


# ----------------------------------------------------------------------------- the mutual-TLS overlay
def kustomize(folder: Path) -> dict[tuple[str, str], dict]:
    built = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60,
                           check=True)
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
    assert mode & 0o040 and not mode & 0o007
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    (mount,) = [m for m in node["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert not [m for c in pod["initContainers"] for m in c["volumeMounts"] if m["name"] == volume["name"]]
    names = [e["name"] for e in node["env"]]
    tls_vars = ["DFL_TLS_CA", "DFL_TLS_CERT", "DFL_TLS_KEY"]
    assert [n for n in names if n.startswith("DFL_TLS")] == tls_vars
    assert {"name": "DFL_INSECURE", "value": "false"} in node["env"]  # env beats node.env's true (envFrom)
    assert {"name": "DFL_HTTP_TOKEN_FILE", "value": f"{mount['mountPath']}/http.token"} in node["env"]
    assert min(names.index(n) for n in tls_vars) > names.index("DFL_ID")  # $(DFL_ID) is expanded only if defined before
    # without the additions, the overlay's StatefulSet is the base's
    stripped = copy.deepcopy(sts)
    spec = stripped["spec"]["template"]["spec"]
    spec["volumes"].remove(volume)
    spec["containers"][0]["volumeMounts"].remove(mount)
    added = [*tls_vars, "DFL_INSECURE", "DFL_HTTP_TOKEN_FILE"]
    spec["containers"][0]["env"] = [e for e in spec["containers"][0]["env"] if e["name"] not in added]
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
        config = deployed_node_config({**SHARED, **{k: v for k, v in env.items() if k.startswith("DFL_")}}, monkeypatch)
        assert not config.network.insecure
        files = tls_of(config)
        token = config.api.http_token_file
        assert token is not None and not config.api.open_to_network
        mounts = {path: volume / path.relative_to(mount) for path in (files.ca, files.cert, files.key, token)}
        used |= {p.name for p in mounts.values()}
        configs.append((config, load_tls(mounted(files, mounts), config.id)))
    assert used == set(secret["data"]), "every key of the Secret is read by a pod, and every file a pod reads exists"
    # static peers: each address a node dials is a DNS name of that peer's certificate
    by_address = {f"{c.network.advertise}:{c.network.grpc_port}": x509.load_pem_x509_certificate(m.cert)
                  for c, m in configs}
    for config, _ in configs:
        for peer in config.membership.peers:
            assert peer.rsplit(":", 1)[0] in dns_names(by_address[peer]), peer
