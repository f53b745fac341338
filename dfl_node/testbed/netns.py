"""A multi-host testbed without Docker: N Linux network namespaces on a bridge, one daemon in each.

Layout::

    <tag>-sw    br0 (bridge, mcast_snooping 0) with ports p1..pN     the "switch"
    <tag>-h<i>  lo + veth0 = <subnet>.<i>/24, route 224.0.0.0/4 dev veth0

Multicast snooping is off so the bridge floods mDNS to every port, and the multicast route lets
mDNS leave a host namespace that has no default route.

Nothing is created in the root namespace and no namespace has a default route, so no traffic can
leave the machine. ``<tag>`` is ``<prefix>-<pid>-<random>``: parallel runs never clash, and
:func:`cleanup_stale` tells a crashed run's leftovers (its pid is dead) from a live run's.
Needs root and iproute2. ``python -m dfl_node.testbed.netns N`` (or ``deploy/netns/testbed.sh N``)
partitions a dataset, starts one ``dfl-node start`` per namespace and tears everything down on
exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from dfl_node.learning.provision import fleet_ids
from dfl_node.testbed.launcher import NodeProcess
from dfl_node.testbed.namespaces import inside

__all__ = ["PER_NODE_KEYS", "NetnsHost", "NetnsTopology", "cleanup_stale", "delete_namespace", "list_namespaces",
           "main", "node_environment", "read_env_file"]

IP_TIMEOUT_S = 10.0
KILL_GRACE_S = 3.0
# Derived from the node index by every consumer (compose, Kubernetes, this testbed); all other
# DFL_* settings come from deploy/node.env.
PER_NODE_KEYS = ("DFL_ID", "DFL_DATA", "DFL_TEST_DATA", "DFL_ADVERTISE", "DFL_STATE_DIR")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")
# a run's namespaces: sw, h1 … (one bridge); rt, s1, s1h1, s1m … (several sites: :mod:`.sites`)
_STALE = re.compile(r"^(?P<prefix>.+)-(?P<pid>\d+)-[0-9a-f]{6}-(?:sw|h\d+|rt|s\d+(?:h\d+|m)?)$")
# Runs the dfl-node CLI with this interpreter (no PATH lookup: sudo often resets PATH).


# --------------------------------------------------------------------------- env files
def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines and ``#`` comments skipped, ``export`` allowed, quotes removed."""
    env: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        env[key] = _value(value.strip(), f"{path}:{number}")
    return env


def _value(text: str, where: str) -> str:
    if not text or text[0] not in "'\"":
        return re.split(r"\s+#", text, maxsplit=1)[0]  # unquoted: ' # comment' ends the value
    quote, out, i = text[0], [], 1
    while i < len(text) and text[i] != quote:
        if quote == '"' and text[i] == "\\" and i + 1 < len(text):
            i += 1
            out.append({"n": "\n", "t": "\t"}.get(text[i], text[i]))
        else:
            out.append(text[i])
        i += 1
    rest = text[i + 1 :].strip()
    if i >= len(text) or (rest and not rest.startswith("#")):
        raise ValueError(f"{where}: bad quoting in {text!r}")
    return "".join(out)


# --------------------------------------------------------------------------- namespaces
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def list_namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _namespace_pids(name: str) -> list[int]:
    res = _ip("netns", "pids", name, check=False)
    return [int(pid) for pid in res.stdout.split()] if res.returncode == 0 else []


def delete_namespace(name: str) -> None:
    """Kill what still runs in the namespace (by PID: TERM, then KILL), then delete it.

    A namespace with live processes would outlive ``ip netns del``.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _namespace_pids(name)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + KILL_GRACE_S
        while pids and time.monotonic() < deadline and (pids := _namespace_pids(name)):
            time.sleep(0.05)
        if not pids:
            break
    _ip("netns", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def cleanup_stale(prefix: str = "dfl") -> list[str]:
    """Delete namespaces left by crashed runs with this prefix (those whose creating pid is dead)."""
    removed = []
    for name in list_namespaces():
        match = _STALE.match(name)
        if match and match["prefix"] == prefix and not _alive(int(match["pid"])):
            delete_namespace(name)
            removed.append(name)
    return removed


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """A second Ctrl-C must not abort the teardown halfway (main thread only: signal's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@dataclass(frozen=True)
class NetnsHost:
    name: str
    address: str

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return inside(self.name, argv)


class NetnsTopology:
    """``count`` hosts on one bridge; a context manager that always tears down what it built."""

    def __init__(self, count: int, prefix: str = "dfl", subnet: str = "10.77.0") -> None:
        if not 1 <= count <= 250:
            raise ValueError("count must be 1..250")
        if not _NAME.match(prefix):
            raise ValueError(f"prefix {prefix!r}: letters, digits, '_' and '.' only")
        if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet):
            raise ValueError(f"subnet {subnet!r}: three octets, e.g. 10.77.0")
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.tag}-sw"
        self.hosts = [NetnsHost(f"{self.tag}-h{i}", f"{subnet}.{i}") for i in range(1, count + 1)]
        self._created: list[str] = []

    def __enter__(self) -> Self:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_namespace(self, name: str) -> None:
        self._created.append(name)  # first: an interrupt right after the add still cleans it up
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts, 1):
            self._add_namespace(host.name)
            _ip("link", "add", "veth0", "netns", host.name,
                "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "veth0")
            _ip("-n", host.name, "link", "set", "veth0", "up")
            _ip("-n", host.name, "route", "add", "224.0.0.0/4", "dev", "veth0")  # multicast without a default route

    # ------------------------------------------------------------------- faults (tests/test_network_partitions.py)
    def port(self, index: int) -> str:
        """The switch port of host ``index`` (0-based), in the switch namespace."""
        return f"p{index + 1}"

    def partition(self, *groups: list[int]) -> None:
        """Cut the switch into islands: each group of host indices after the first gets a bridge of its own.

        Hosts not named stay on ``br0`` with the first group. The links stay up, so nothing inside a host
        changes: packets to the other side simply vanish, as behind a failed switch. :meth:`heal` undoes it.
        """
        for k, group in enumerate(groups[1:], 1):
            bridge = f"br{k}"
            if _ip("-n", self.switch, "link", "show", bridge, check=False).returncode != 0:
                _ip("-n", self.switch, "link", "add", bridge, "type", "bridge", "mcast_snooping", "0")
                _ip("-n", self.switch, "link", "set", bridge, "up")
            for index in group:
                _ip("-n", self.switch, "link", "set", self.port(index), "master", bridge)

    def heal(self) -> None:
        """Every port back on ``br0`` and the extra bridges removed (idempotent; :meth:`close` removes them too)."""
        for i in range(len(self.hosts)):
            _ip("-n", self.switch, "link", "set", self.port(i), "master", "br0")
        for line in _ip("-n", self.switch, "-o", "link", "show", "type", "bridge").stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name != "br0":
                _ip("-n", self.switch, "link", "del", name, check=False)

    def shape(self, index: int, *qdisc: str) -> None:
        """``tc qdisc replace … root <qdisc>`` on both ends of host ``index``'s link (its veth0 and its switch
        port), so both directions are shaped; RuntimeError with tc's message if the kernel lacks the qdisc."""
        for namespace, dev in ((self.hosts[index].name, "veth0"), (self.switch, self.port(index))):
            res = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", dev, "root",
                                  *qdisc], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
            if res.returncode != 0:
                self.unshape(index)
                raise RuntimeError(f"tc qdisc {' '.join(qdisc)}: {res.stderr.strip() or res.returncode}")

    def unshape(self, index: int) -> None:
        """Both ends of host ``index``'s link back to the default qdisc (idempotent)."""
        for namespace, dev in ((self.hosts[index].name, "veth0"), (self.switch, self.port(index))):
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, text=True, timeout=IP_TIMEOUT_S)

    def close(self) -> None:
        """Idempotent: hosts first, then the switch."""
        with _signals_ignored():
            while self._created:
                delete_namespace(self._created[-1])
                self._created.pop()


# --------------------------------------------------------------------------- the testbed
def node_environment(
    shared: dict[str, str], index: int, count: int, host: NetnsHost, shards: Path, state: Path
) -> dict[str, str]:
    """The shared settings plus the per-node values (:data:`PER_NODE_KEYS`) of node ``index``."""
    nid = fleet_ids(count)[index]
    per_node = {
        "DFL_ID": nid,
        "DFL_DATA": str(shards / nid),
        "DFL_TEST_DATA": str(shards / "test.safetensors"),
        "DFL_ADVERTISE": host.address,
        "DFL_STATE_DIR": str(state / nid),
    }
    return {**shared, **per_node}


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dfl_node.testbed.netns", description=__doc__.split("\n\n")[0])
    p.add_argument("nodes", type=int, nargs="?", default=4, help="number of nodes (default 4)")
    p.add_argument("--env", type=Path, default=Path("deploy/node.env"), help="shared node settings")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--partition", default="iid", choices=["iid", "shards", "classes", "dirichlet", "unbalanced"])
    p.add_argument("--zeta", type=int, default=2)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0, help="partition seed")
    p.add_argument("--data-dir", type=Path, help="dataset files (not needed for digits)")
    p.add_argument("--workdir", type=Path, help="shards, state and logs (default: a new temp folder)")
    p.add_argument("--prefix", default="dfl", help="namespace name prefix")
    p.add_argument("--subnet", default="10.77.0")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 2:
        raise SystemExit("need at least 2 nodes")
    shared = read_env_file(args.env)
    overrides = {k: v for k, v in os.environ.items() if k.startswith("DFL_") and k not in PER_NODE_KEYS}
    shared.update(overrides)  # environment > file, as for the daemon itself
    if int(shared.get("DFL_MIN_PEERS", "1")) > args.nodes - 1:
        shared["DFL_MIN_PEERS"] = str(args.nodes - 1)
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="dfl-testbed-"))).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"testbed: {args.nodes} nodes, work dir {work}, overrides {sorted(overrides) or 'none'}", flush=True)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    stale = cleanup_stale(args.prefix)
    if stale:
        print(f"removed stale namespaces: {' '.join(stale)}", flush=True)

    partition = [sys.executable, "-m", "dfl_node", "partition", "--dataset", args.dataset, "--nodes", str(args.nodes),
                 "--partition", args.partition, "--zeta", str(args.zeta), "--beta", str(args.beta),
                 "--seed", str(args.seed), "--out", str(work / "shards")]
    if args.data_dir:
        partition += ["--data-dir", str(args.data_dir)]

    nodes: list[NodeProcess] = []
    try:
        subprocess.run(partition, check=True)
        with NetnsTopology(args.nodes, args.prefix, args.subnet) as topo:
            try:
                for i, host in enumerate(topo.hosts):
                    env = node_environment(shared, i, args.nodes, host, work / "shards", work / "state")
                    node = NodeProcess(env["DFL_ID"], host.address, int(env.get("DFL_GRPC_PORT", "50051")),
                                       int(env.get("DFL_HTTP_PORT", "8080")), Path(env["DFL_STATE_DIR"]),
                                       work / "logs" / f"{env['DFL_ID']}.log", env, host.name)
                    node.start()
                    nodes.append(node)
                    print(f"{node.id}: ip netns exec {host.name} dfl-node status {node.url}", flush=True)
                print("running (nodes keep serving after their last round); Ctrl-C stops them and removes the "
                      "namespaces", flush=True)
                codes = [n.process.wait() for n in nodes if n.process is not None]  # each one started above
            finally:
                for node in nodes:  # gracefully first; the teardown then kills anything left, by pid
                    node.stop(timeout=KILL_GRACE_S)
    except KeyboardInterrupt:
        print("interrupted: nodes stopped, namespaces removed", flush=True)
        return 130
    print(f"exit codes {codes}; logs in {work / 'logs'}", flush=True)
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
