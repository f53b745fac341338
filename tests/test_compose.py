"""`docker compose up`, for real: the image builds, 4 nodes find each other by mDNS, learn, and answer
`dfl-node status --all` through their published ports — the README's "docker-compose" commands; then
the same fleet with mutual TLS (``docker-compose.tls.yml``: certificates from the real ``dfl-node certs``
CLI, handed to the nodes as Compose secrets) and with a swarm key (``docker-compose.swarm-key.yml``), each of
which must learn exactly as well.

The Docker engine runs inside a network namespace of its own that holds only ``lo``: containers,
their bridge and the published ports all live there, so nothing can reach beyond this machine
whichever namespace pytest runs in (Docker's ``internal: true`` networks would also isolate, but
they disable published ports, which this test must check). No image registry is reachable, so the
image is built on the offline base of ``deploy/offline-base.sh`` (``.ci/install-docker`` makes it),
with no network at all. Needs root, ``dockerd``, the compose and buildx plugins and that tarball.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BASE_TAR = Path(os.environ.get("DFL_DOCKER_BASE", "/var/cache/dfl-node/offline-base.tar"))
BASE_IMAGE = "dfl-base:offline"
FLEET_TIMEOUT_S = 300.0

# pyproject's 300 s per test is too short for the first variant's image build on a busy 2-core machine
# (torch layers from scratch); the waits below bound each step, this only backs them up.
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(1500)]


@dataclass
class Engine:
    """A private Docker engine: its client environment and the namespace its published ports live in."""

    pid: int
    env: dict[str, str]

    def run(self, *argv: str | Path, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([str(a) for a in argv], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def in_netns(self, *argv: str) -> list[str]:
        """``argv`` run in the engine's network namespace (where 127.0.0.1:8080 is node-0's published port)."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", *argv]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a network namespace and a Docker engine)"
    for tool in ("dockerd", "docker", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run .ci/install-docker"
    for plugin in ("compose", "buildx"):
        if subprocess.run(["docker", plugin, "version"], capture_output=True).returncode != 0:
            return f"the docker {plugin} plugin is missing: run .ci/install-docker"
    if not BASE_TAR.is_file():
        return f"{BASE_TAR} is missing: run .ci/install-docker (or deploy/offline-base.sh {BASE_TAR})"
    return None


def _stop_engine(process: subprocess.Popen, root: Path) -> None:
    process.send_signal(signal.SIGTERM)  # dockerd stops its containers and containerd, then exits
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    subprocess.run(["umount", "-R", str(root / "data")], capture_output=True)  # dockerd bind-mounts its root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    root = Path(tempfile.mkdtemp(prefix="dfl-docker-", dir="/var/tmp"))  # images need GBs, not a tmpfs
    sock = root / "docker.sock"
    argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec dockerd "$@"', "dockerd",
            "--data-root", str(root / "data"), "--exec-root", str(root / "exec"), "--pidfile", str(root / "pid"),
            "-H", f"unix://{sock}"]
    with (root / "dockerd.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    engine = Engine(process.pid, {**os.environ, "DOCKER_HOST": f"unix://{sock}", "BASE_IMAGE": BASE_IMAGE})
    try:
        deadline = time.monotonic() + 60
        while engine.run("docker", "info", check=False, timeout=30).returncode != 0:
            assert process.poll() is None, (root / "dockerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "dockerd did not answer in 60 s"
            time.sleep(0.5)
        engine.run("docker", "import", BASE_TAR, BASE_IMAGE, timeout=300)
        yield engine
    finally:
        _stop_engine(process, root)


def fleet_status(engine: Engine, *token: str) -> list[dict]:
    """`dfl-node status --all --json`, from inside the engine's namespace, through node-0's published port
    (``token``: its ``--http-token-file`` argument)."""
    done = subprocess.run(engine.in_netns(sys.executable, "-m", "dfl_node", "status", "http://127.0.0.1:8080",
                                          "--all", "--json", *token), capture_output=True, text=True, timeout=30)
    return json.loads(done.stdout) if done.returncode == 0 else []


CERTS = [sys.executable, "-m", "dfl_node", "certs"]
IMAGE_USER = ":".join(re.findall(r"(?m)^USER (\d+):(\d+)\s*$", (REPO / "deploy/Dockerfile").read_text())[-1])


@contextlib.contextmanager
def credentials(folder: str, steps: list[list[str]]) -> Iterator[Path]:
    """An override's header, run in a temporary folder: ``steps`` (the real CLI, then the chown to the image's user:
    file secrets keep the host's owner and mode); yields the ``folder`` they filled."""
    root = Path(tempfile.mkdtemp(prefix="dfl-credentials-"))
    try:
        for argv in steps:
            done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{argv} exited {done.returncode}: {done.stderr}"
        yield root / folder
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tls_certs() -> Iterator[Path]:
    """docker-compose.tls.yml's header: a swarm CA, node-0…3's certificates and the REST token."""
    nodes = [f"certs/node-{i}" for i in range(4)]
    with credentials("certs", [[*CERTS, "init", "--out", "swarm-ca"],
                               *([*CERTS, "issue", Path(n).name, "--ca", "swarm-ca", "--out", n] for n in nodes),
                               [*CERTS, "http-token", "certs/http.token"],
                               ["chown", "-R", IMAGE_USER, *nodes, "certs/http.token"]]) as certs:
        assert (certs / "node-0/node.key").stat().st_mode & 0o077 == 0  # only its owner reads it: hence the chown
        yield certs


@pytest.fixture
def swarm_key_dir() -> Iterator[Path]:
    """docker-compose.swarm-key.yml's header: the swarm key and the REST token."""
    with credentials("swarm-key", [[*CERTS, "swarm-key", "swarm-key/swarm.key"],
                                   [*CERTS, "http-token", "swarm-key/http.token"],
                                   ["chown", "-R", IMAGE_USER, "swarm-key"]]) as folder:
        yield folder


@pytest.mark.parametrize("auth", ["none", "mtls", "swarm-key"], ids=["plain", "mtls", "swarm-key"])
def test_compose_up_fleet_discovers_by_mdns_learns_and_reports_through_published_ports(
        engine: Engine, auth: str, request: pytest.FixtureRequest) -> None:
    compose_file = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    node_envs = [svc["environment"] for name, svc in compose_file["services"].items() if name.startswith("node-")]
    shared = dict(line.split("=", 1) for line in (REPO / "deploy/node.env").read_text().splitlines()
                  if line and not line.startswith("#"))
    assert all("DFL_PEERS" not in env for env in [*node_envs, shared]) and shared["DFL_MDNS"] == "true"
    rounds = int(shared["DFL_ROUNDS"])

    compose = ["docker", "compose", "--project-directory", str(REPO), "-f", str(REPO / "docker-compose.yml")]
    token: list[str] = []
    # the image built by the plain variant is reused: only the secrets and their settings differ
    if auth == "mtls":
        compose += ["-f", str(REPO / "docker-compose.tls.yml")]
        certs = request.getfixturevalue("tls_certs")
        engine = replace(engine, env={**engine.env, "CERTS_DIR": str(certs)})
        token = ["--http-token-file", str(certs / "http.token")]
    elif auth == "swarm-key":
        compose += ["-f", str(REPO / "docker-compose.swarm-key.yml")]
        folder = request.getfixturevalue("swarm_key_dir")
        engine = replace(engine, env={**engine.env, "SWARM_KEY_DIR": str(folder)})
        token = ["--http-token-file", str(folder / "http.token")]
    try:
        engine.run(*compose, "up", "--build", "--detach", timeout=900)
        deadline, statuses = time.monotonic() + FLEET_TIMEOUT_S, []
        while not (len(statuses) == 4 and all(s.get("done") for s in statuses)):
            assert time.monotonic() < deadline, f"fleet not done in {FLEET_TIMEOUT_S:.0f} s: {statuses}"
            time.sleep(2)
            statuses = fleet_status(engine, *token)
        table = subprocess.run(engine.in_netns(sys.executable, "-m", "dfl_node", "status", "http://127.0.0.1:8080",
                                               "--all", "--wide", *token), capture_output=True, text=True, timeout=30,
                               env={**os.environ, "COLUMNS": "160"})
        print(table.stdout)  # the wide table: every node by the URL of its published port
        if auth != "none":  # file secrets are bind mounts: the host's owner and mode (the headers' chown)
            secret = "/run/secrets/node.key" if auth == "mtls" else "/run/secrets/swarm.key"
            key = engine.run(*compose, "exec", "-T", "node-0", "stat", "-c", "%u:%g %a", secret)
            assert key.stdout.split() == ["10001:10001", "600"], key.stdout
            refused = fleet_status(engine)  # the REST API beyond loopback: nothing but /healthz without the token
            assert refused == [], refused
    except BaseException:
        print(engine.run(*compose, "logs", "--no-color", "--tail", "40", check=False).stdout[-8000:])
        raise
    finally:
        engine.run(*compose, "down", "--volumes", "--timeout", "20", timeout=300, check=False)

    assert sorted(s["id"] for s in statuses) == ["node-0", "node-1", "node-2", "node-3"]
    for s in statuses:
        # No static peers were given: every peer in the table was found by mDNS and answered Hello.
        others = {"node-0", "node-1", "node-2", "node-3"} - {s["id"]}
        assert sorted(p["id"] for p in s["peers"] if p["alive"]) == sorted(others)
        assert {p["status_url"] for p in s["peers"]} <= {f"http://127.0.0.1:{8080 + i}" for i in range(4)}
        assert s["round"] == rounds and s["rejected"] == {}
        assert s["authentication"] == auth
    assert sum(s["fusions"] for s in statuses) == rounds  # Def-KT, Q = 1: one fusion per round, none lost
    assert sum(s["global_accuracy"] for s in statuses) / 4 > 0.8, "node.env's settings must learn"
    assert table.returncode == 0 and table.stdout.count("http://127.0.0.1:808") == 4
