"""Static peers (``--peer``) that do not answer are said, not accepted in silence.

A real ``dfl-node start --peer nosuchhost.invalid:50051 --peer 127.0.0.1:PORT --no-mdns`` (nothing listens on
PORT yet) must log, at WARNING, why each gets no answer (the name does not resolve; the port refuses
connections) — once, not at every heartbeat — list both in ``/status`` (``unreachable_peers``), keep
retrying, and drop an address from that list once a node answers there.

Resolving ``nosuchhost.invalid`` would send a DNS query off the machine, so the module runs only in a
network namespace with no route out::

    unshare -n sh -c 'ip link set lo up && exec python -m pytest tests/test_static_peers.py -q'
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import socket
import sys
from pathlib import Path

import httpx
import pytest

from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.testbed.launcher import free_port, node_env
from tests.helpers.nodes import quiet_node_config, running

NOWHERE = "nosuchhost.invalid:50051"  # .invalid never resolves (RFC 2606)
WITHIN = 15.0  # seconds: every wait of this module is for a log line that should come within a heartbeat or two


def _no_route_out() -> bool:
    """Whether this network namespace has no route to the outside (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 53))  # TEST-NET-1: routable only through a default route
        except OSError as exc:
            return exc.errno == errno.ENETUNREACH
    return False


pytestmark = pytest.mark.skipif(not _no_route_out(), reason="would send a DNS query off the machine: run inside "
                                "`unshare -n sh -c 'ip link set lo up && exec python -m pytest …'`")


class Stderr:
    """A process's stderr, line by line as it comes; :meth:`wait_for` waits for a line matching a pattern."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self._stream = stream
        self._grew = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self._stream.readline():
            async with self._grew:
                self.lines.append(line.decode(errors="replace").rstrip("\n"))
                self._grew.notify_all()

    def matching(self, pattern: str) -> list[str]:
        return [line for line in self.lines if re.search(pattern, line)]

    async def wait_for(self, pattern: str) -> str:
        async with self._grew:
            try:
                await asyncio.wait_for(self._grew.wait_for(lambda: self.matching(pattern)), WITHIN)
            except TimeoutError:
                pytest.fail(f"no line matching {pattern!r} within {WITHIN} s; stderr:\n" + "\n".join(self.lines[-40:]))
        return self.matching(pattern)[0]


async def _unreachable(http_port: int) -> list[str]:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        return (await http.get(f"http://127.0.0.1:{http_port}/status")).json()["unreachable_peers"]


async def test_an_unanswered_static_peer_is_logged_listed_and_retried(fleet_shards: Path, tmp_path: Path) -> None:
    late = f"127.0.0.1:{free_port()}"  # a node starts there later
    config = quiet_node_config(fleet_shards, tmp_path / "a", http_port=free_port(), heartbeat=0.3, min_peers=2)
    learning = {*SharedSettings.model_fields, *AlgorithmOptions.model_fields, "peers", "mdns"}
    settings = {k: v for k, v in config.flat(exclude_none=True).items() if k not in learning}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    env |= node_env(config.learning, config.per_algorithm, **settings)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dfl_node", "start", "--peer", NOWHERE, "--peer", late, "--no-mdns",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    stderr = Stderr(proc.stderr)
    try:
        await stderr.wait_for(rf"WARNING .*static peer {re.escape(NOWHERE)} does not resolve")
        await stderr.wait_for(rf"WARNING .*static peer {re.escape(late)} refuses connections")
        await stderr.wait_for(r"serving gRPC")
        assert await _unreachable(config.api.http_port) == sorted([NOWHERE, late])

        b = quiet_node_config(fleet_shards, tmp_path / "b", id="node-1", data=fleet_shards / "node-1",
                              grpc_port=int(late.rsplit(":", 1)[1]))
        async with running(b):
            await stderr.wait_for(rf"static peer {re.escape(late)} answers now")
            assert await _unreachable(config.api.http_port) == [NOWHERE]  # still retried, still listed
        # Heartbeats every 0.3 s failed all along; the log said so once per address (then once a minute).
        assert len(stderr.matching(re.escape(NOWHERE))) == 1, stderr.matching(re.escape(NOWHERE))
        assert len(stderr.matching(rf"{re.escape(late)} refuses")) == 1
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), WITHIN)
        await stderr.task
