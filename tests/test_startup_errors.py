"""Start-up is all-or-nothing: every operator mistake at ``dfl-node start`` is one line on
stderr and exit 1, and a failed start leaves nothing bound, announced, locked or written. A second
node with the same ``--id`` is caught by the Hello handshake; a restarted node resumes against the
rounds it is configured with now. A node that serves beyond loopback with no credentials starts only
with ``--insecure``, and then says so.

Tests that bind 0.0.0.0 must run in a private network namespace (``unshare -n``), as all daemon tests do.

The first node of a test runs in this process (its event loop keeps answering while the second,
a real ``dfl-node start``, is awaited as a subprocess).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import grpc
import httpx
import pytest
import zeroconf

from dfl_node.errors import OperatorError
from dfl_node.net.certs import new_secret
from dfl_node.net.discovery import MdnsDiscovery
from dfl_node.node.node import Node
from dfl_node.service.run import run_node
from dfl_node.service.wiring import Daemon
from dfl_node.settings.node import NodeConfig
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import quiet_node_config, running, start_cli

NOT_HERE = "192.0.2.20"  # TEST-NET-1 (RFC 5737): never an address of this machine


# ----------------------------------------------------------------------------- one line, exit 1


async def test_a_grpc_port_in_use_is_refused(fleet_shards: Path, tmp_path: Path) -> None:
    occupier = grpc.aio.server()  # gRPC's defaults, SO_REUSEPORT included: what another node holds
    port = occupier.add_insecure_port("127.0.0.1:0")
    await occupier.start()
    try:
        status, lines, text = await start_cli(quiet_node_config(fleet_shards, tmp_path / "state", grpc_port=port))
    finally:
        await occupier.stop(None)
    assert status == 1 and "serving" not in text
    assert lines == [f"error: gRPC port 127.0.0.1:{port} is already in use (another node? choose --grpc-port)"]


async def test_an_http_port_in_use_is_refused_before_anything_serves(fleet_shards: Path, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as occupier:
        port = occupier.getsockname()[1]
        config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=port, mdns=True)
        status, lines, text = await start_cli(config)
    assert status == 1 and "serving" not in text and "mDNS" not in text
    assert lines == [f"error: HTTP port 127.0.0.1:{port} is already in use (another node? choose --http-port)"]


async def test_a_host_that_is_not_on_this_machine_is_refused(fleet_shards: Path, tmp_path: Path) -> None:
    config = quiet_node_config(fleet_shards, tmp_path / "state", host=NOT_HERE, insecure=True)  # off loopback: said so
    status, lines, _ = await start_cli(config)
    assert status == 1
    assert lines == [f"error: cannot bind {NOT_HERE}:{config.network.grpc_port}: that address is not on this machine "
                     "(--host must be one of its addresses, or 0.0.0.0 with --advertise)"]


async def test_missing_shards_are_one_line(fleet_shards: Path, tmp_path: Path) -> None:
    status, lines, _ = await start_cli(quiet_node_config(fleet_shards, tmp_path / "state", data=tmp_path / "none"))
    assert status == 2  # input that cannot be used, as bad usage: nothing was started
    assert lines == [f"error: --data {tmp_path / 'none'}: no such file or folder"]


async def test_a_state_dir_holds_one_node(fleet_shards: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running(quiet_node_config(fleet_shards, state, evaluate=True)):  # evaluating w0 checkpoints it
        assert (state / "model.safetensors").is_file()
        second = quiet_node_config(fleet_shards, state, id="node-1", data=fleet_shards / "node-1")
        status, lines, text = await start_cli(second)
    assert status == 1
    assert lines == [f"error: state dir {state} is in use by another running node (pid {os.getpid()}); "
                     "give each node its own --state-dir"]
    # the lock comes before anything reads the state dir, so no "node-1 resuming at round 0
    # (checkpoint in …)" line from another node's checkpoint precedes the error
    assert "resuming" not in text and "checkpoint" not in text, text
    async with running(quiet_node_config(fleet_shards, state)) as again:  # released when the first node stopped
        assert again.ready.is_set()


# ----------------------------------------------------------------------------- duplicate ids


async def test_a_second_node_with_the_same_id_does_not_start(fleet_shards: Path, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    async with running(quiet_node_config(fleet_shards, tmp_path / "first")) as first:
        with caplog.at_level(logging.ERROR):
            status, lines, text = await start_cli(quiet_node_config(fleet_shards, tmp_path / "second", mdns=True,
                                                                    peers=[first.address]))
        assert first.tally.rejected == {"duplicate_id": 1}  # the running node reports the impostor's Hello…
        assert [r.levelno for r in caplog.records if "node-0" in r.getMessage()] == [logging.ERROR]
    assert status == 1 and "mDNS" not in text  # …and the impostor stops before it announces itself
    assert lines == [f"error: node id 'node-0' is already used by another running node at {first.address}; "
                     "give every node its own --id"]


async def test_a_duplicate_met_after_start_up_is_reported_once(fleet_shards: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    async with running(quiet_node_config(fleet_shards, tmp_path / "a")) as a, \
            running(quiet_node_config(fleet_shards, tmp_path / "b")) as b:
        probes, enough, hello = 0, asyncio.Event(), a.membership.table.hello

        async def counted(address: str, timeout: float):  # noqa: ANN202
            nonlocal probes
            reply = await hello(address, timeout)
            probes += address == b.address
            if probes >= 5:
                enough.set()
            return reply

        a.membership.table.hello = counted
        with caplog.at_level(logging.ERROR):
            a.membership.table.static = [*a.membership.table.static, b.address]  # a meets b only now, by probes
            await asyncio.wait_for(enough.wait(), 20)
    assert a.tally.rejected == b.tally.rejected == {"duplicate_id": 1}
    assert not a.membership.table.peers and not b.membership.table.peers
    assert len([r for r in caplog.records if r.levelno == logging.ERROR and "node-0" in r.getMessage()]) == 2


# ----------------------------------------------------------------------------- all or nothing


def _mdns_name_taken(monkeypatch: pytest.MonkeyPatch) -> socket.socket | None:
    async def taken(self: MdnsDiscovery) -> None:
        raise zeroconf.NonUniqueNameException

    monkeypatch.setattr(MdnsDiscovery, "start", taken)
    return None


def _http_port_taken(monkeypatch: pytest.MonkeyPatch) -> socket.socket | None:
    return socket.create_server(("127.0.0.1", 0))


@pytest.mark.parametrize(("occupy", "problem"), [
    (_http_port_taken, r"HTTP port 127\.0\.0\.1:\d+ is already in use"),
    (_mdns_name_taken, r"^node id 'node-0' is already announced on mDNS by another node; "
                       r"give every node its own --id$"),
])
async def test_a_failed_start_up_leaves_nothing_behind(fleet_shards: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture, occupy, problem: str) -> None:
    occupier = occupy(monkeypatch)
    http_port = occupier.getsockname()[1] if occupier else free_port()
    config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=http_port, mdns=True, evaluate=True)
    try:
        with caplog.at_level(logging.INFO), pytest.raises(OperatorError, match=problem):
            async with running(config):
                pass
    finally:
        if occupier:
            occupier.close()
    assert not [r.getMessage() for r in caplog.records if "serving" in r.getMessage()]
    assert not (tmp_path / "state" / "model.safetensors").exists()  # no checkpoint written
    with socket.create_server(("127.0.0.1", config.network.grpc_port)):
        pass  # the gRPC port is free again


# ----------------------------------------------------------------------------- resuming


@pytest.mark.parametrize(("mode", "rounds", "done"), [
    ("round", 100, False), ("round", 10, True), ("round", 5, True), ("round", 0, False), ("async", 0, False),
])
async def test_done_is_recomputed_from_the_rounds_configured_now(fleet_shards: Path, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 mode: str, rounds: int, done: bool) -> None:
    finished = Daemon.build(quiet_node_config(fleet_shards, tmp_path, mode=mode, rounds=10)).node
    finished.progress.finish(10)
    await finished.save()
    finished.learner.checkpoint.lock.release()  # a Node holds its state dir from construction; this one never runs
    with caplog.at_level(logging.INFO):
        again = Daemon.build(quiet_node_config(fleet_shards, tmp_path, mode=mode, rounds=rounds)).node
    assert again.progress.round == 10 and again.progress.done is done
    if mode == "round" and rounds:
        assert f"resuming at round 10 of {rounds}" in caplog.text


async def run_until_finished(daemons: list[Daemon]) -> list[Node]:
    stops = [asyncio.Event() for _ in daemons]
    tasks = [asyncio.create_task(run_node(d, stop)) for d, stop in zip(daemons, stops)]
    try:
        await asyncio.wait_for(asyncio.gather(*(d.node.scheduler.finished.wait() for d in daemons)), 60)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)
    return [d.node for d in daemons]


async def test_a_finished_fleet_resumes_when_given_more_rounds(fleet_shards: Path, tmp_path: Path) -> None:
    ports = [free_port(), free_port()]

    def fleet(rounds: int) -> list[Daemon]:
        return [Daemon.build(quiet_node_config(fleet_shards, tmp_path / f"node-{i}", id=f"node-{i}",
                                               data=fleet_shards / f"node-{i}", grpc_port=port,
                                               peers=[f"127.0.0.1:{p}" for p in ports if p != port], rounds=rounds))
                for i, port in enumerate(ports)]

    first = await run_until_finished(fleet(2))
    assert [(n.progress.round, n.progress.done) for n in first] == [(2, True)] * 2
    again = fleet(4)
    assert [(d.node.progress.round, d.node.progress.done) for d in again] == [(2, False)] * 2
    resumed = await run_until_finished(again)
    assert [(n.progress.round, n.progress.done) for n in resumed] == [(4, True)] * 2
    assert sum(n.tally.counters["models_sent"] for n in resumed) == 4  # two rounds before the restart, two after


# ----------------------------------------------------------------------------- beyond loopback without credentials
EVERYWHERE = {"host": "0.0.0.0", "advertise": "127.0.0.1"}
OPEN_REFUSED = ("Error: host 0.0.0.0 is reachable from the network but neither mutual TLS (--tls-dir) nor a swarm key "
                "(--swarm-key-file) is set, so anyone there could push a model into this node; give one, or "
                "--insecure (DFL_INSECURE=1) on a private network")


async def get_status(config: NodeConfig) -> dict:
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"http://{config.api.http_host}:{config.api.http_port}/status", timeout=5.0)
    reply.raise_for_status()
    return reply.json()


def insecure_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "INSECURE" in r.getMessage()]


async def test_serving_beyond_loopback_without_credentials_is_refused(fleet_shards: Path, tmp_path: Path) -> None:
    config = quiet_node_config(fleet_shards, tmp_path / "state", **EVERYWHERE, insecure=True)
    status, lines, text = await start_cli(config, DFL_INSECURE="false")  # the operator did not say it
    assert status == 2 and "serving" not in text
    assert [line for line in lines if line.lower().startswith("error")] == [OPEN_REFUSED]
    assert not (tmp_path / "state").exists()  # refused as a setting: nothing locked, bound or written


async def test_an_insecure_node_says_so_at_start_and_in_its_status(fleet_shards: Path, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    config = quiet_node_config(fleet_shards, tmp_path / "state", **EVERYWHERE, insecure=True, http_port=free_port())
    with caplog.at_level(logging.INFO):
        async with running(config):
            status = await get_status(config)
    assert status["insecure"] is True and status["authentication"] == "none"
    [warning] = insecure_warnings(caplog)
    assert "node-0 is INSECURE: it serves 0.0.0.0 with no authentication (--insecure)" in warning


async def test_a_swarm_key_serves_beyond_loopback_without_the_flag(fleet_shards: Path, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    key = new_secret(tmp_path / "swarm.key")
    config = quiet_node_config(fleet_shards, tmp_path / "state", **EVERYWHERE, swarm_key_file=key,
                               http_port=free_port())
    assert not config.network.insecure
    with caplog.at_level(logging.INFO):
        async with running(config):
            status = await get_status(config)
    assert status["insecure"] is False and status["authentication"] == "swarm-key"
    assert insecure_warnings(caplog) == []


async def test_loopback_needs_no_flag_and_is_not_insecure(fleet_shards: Path, tmp_path: Path) -> None:
    config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=free_port())
    assert (config.network.host, config.network.insecure) == ("127.0.0.1", False)
    async with running(config):
        assert (await get_status(config))["insecure"] is False
