"""The namespace testbed's topology: L3 and multicast across the bridge, isolation, cleanup on every exit.

Traffic stays inside the namespaces the tests create (no default route, nothing in the root namespace).
Each helper process is bounded by a timeout; readiness is a line on stdout, never a sleep.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dfl_node.testbed.namespaces import run_inside
from dfl_node.testbed.netns import NetnsTopology, cleanup_stale, list_namespaces, read_env_file

needs_root = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("ip")),
    reason="needs root, Linux and iproute2",
)
TIMEOUT_S = 10.0
GROUP, MPORT, TPORT = "239.77.7.7", 47777, 47778

RECEIVER = textwrap.dedent(f"""
    import socket, struct, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", {MPORT}))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 struct.pack("4s4s", socket.inet_aton("{GROUP}"), socket.inet_aton(sys.argv[1])))
    s.settimeout({TIMEOUT_S})
    print("ready", flush=True)
    data, (src, _) = s.recvfrom(100)
    print(data.decode(), src, flush=True)
""")
SENDER = textwrap.dedent(f"""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    for _ in range(3):  # no IP_MULTICAST_IF: the 224.0.0.0/4 route must pick veth0
        s.sendto(b"hello", ("{GROUP}", {MPORT}))
""")
SERVER = textwrap.dedent(f"""
    import socket, sys
    srv = socket.create_server((sys.argv[1], {TPORT}))
    srv.settimeout({TIMEOUT_S})
    print("ready", flush=True)
    conn, (peer, _) = srv.accept()
    conn.settimeout({TIMEOUT_S})
    conn.sendall(conn.recv(100).upper())
    print(peer, flush=True)
""")
CLIENT = textwrap.dedent(f"""
    import socket, sys
    c = socket.create_connection((sys.argv[1], {TPORT}), timeout={TIMEOUT_S})
    c.sendall(b"ping")
    print(c.recv(100).decode(), flush=True)
""")


def spawn(host, script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(host.wrap([sys.executable, "-c", script, *args]), stdout=subprocess.PIPE, text=True)


def wait_line(proc: subprocess.Popen[str]) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
    assert ready, "helper process did not answer in time"
    return proc.stdout.readline().strip()


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=TIMEOUT_S + 5)
    assert proc.returncode == 0, out
    return out.strip()


def ours(tag: str) -> list[str]:
    return [name for name in list_namespaces() if name.startswith(tag)]


def test_read_env_file(tmp_path: Path) -> None:
    env = tmp_path / "x.env"
    env.write_text("# comment\n\nA=1\nexport B = two words  # note\nC=\"q \\\" x\"\nD='$lit'\nE=\n")
    assert read_env_file(env) == {"A": "1", "B": "two words", "C": 'q " x', "D": "$lit", "E": ""}
    env.write_text("not a pair\n")
    with pytest.raises(ValueError, match=":1:"):
        read_env_file(env)


def echo(address: str) -> bytes:
    """:data:`CLIENT`'s exchange, as a function."""
    with socket.create_connection((address, TPORT), timeout=TIMEOUT_S) as connection:
        connection.sendall(b"ping")
        return connection.recv(100)


@needs_root
@pytest.mark.netns
def test_three_hosts_unicast_multicast_and_cleanup() -> None:
    with NetnsTopology(3, prefix="dfltest") as topo:
        h1, h2, h3 = topo.hosts
        assert set(ours(topo.tag)) == {topo.switch, h1.name, h2.name, h3.name}
        routes = subprocess.run(["ip", "-n", h1.name, "route"], capture_output=True, text=True, check=True).stdout
        assert "default" not in routes and "224.0.0.0/4 dev veth0" in routes  # nothing can leave

        server = spawn(h2, SERVER, h2.address)
        assert wait_line(server) == "ready"
        assert finish(spawn(h1, CLIENT, h2.address)) == "PING"
        assert finish(server) == h1.address

        # a function of this process in h1's namespace (how the testbeds poll their nodes): its thread alone
        server, own = spawn(h2, SERVER, h2.address), os.readlink("/proc/thread-self/ns/net")
        assert wait_line(server) == "ready"
        assert run_inside(h1.name, echo, h2.address) == b"PING"
        assert finish(server) == h1.address
        assert os.readlink("/proc/thread-self/ns/net") == own
        with pytest.raises(FileNotFoundError):
            run_inside(f"{topo.tag}-none", echo, h2.address)

        receivers = [spawn(h, RECEIVER, h.address) for h in (h2, h3)]
        assert [wait_line(r) for r in receivers] == ["ready", "ready"]
        finish(spawn(h1, SENDER))
        assert [finish(r) for r in receivers] == [f"hello {h1.address}"] * 2
    assert ours(topo.tag) == []
    topo.close()  # idempotent


@needs_root
@pytest.mark.netns
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_cleanup_when_the_body_raises(error: type[BaseException]) -> None:
    with pytest.raises(error), NetnsTopology(2, prefix="dfltest") as topo:
        # a live process would keep its namespace alive after `ip netns del`: it must be killed
        sleeper = subprocess.Popen(topo.hosts[0].wrap(["sleep", "60"]))
        raise error("boom")
    assert sleeper.wait(timeout=TIMEOUT_S) != 0
    assert ours(topo.tag) == []


@needs_root
@pytest.mark.netns
def test_cleanup_stale_removes_only_dead_runs() -> None:
    dead = "dflstale-4194999-abcdef-h1"  # pid above any pid_max: its run is gone
    live = f"dflstale-{os.getpid()}-abcdef-h1"
    try:
        for name in (dead, live):
            subprocess.run(["ip", "netns", "add", name], check=True, timeout=TIMEOUT_S)
        assert cleanup_stale("dflstale") == [dead]
        assert dead not in list_namespaces() and live in list_namespaces()
    finally:
        for name in (dead, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=TIMEOUT_S)
