"""Discovery over real zeroconf on loopback.

Run inside a private network namespace with only ``lo``::

    unshare -n sh -c 'ip link set lo up; exec python -m pytest tests/test_discovery.py -q'

Every discovery here is built with ``bind_host="127.0.0.1"``, so the module is
also safe (nothing leaves the machine) when run in the root namespace; nothing
is skipped in either case. Synchronisation is by events with timeouts, never
by sleeping.

The pure record-level tests (TXT round trip, names, malformed records,
``parse_peer``, ``mdns_interfaces``) need no sockets and are in
``test_announcement.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from zeroconf.asyncio import AsyncZeroconf

from dfl_node.net import discovery
from dfl_node.net.announcement import Announcement, fingerprint_matches
from dfl_node.net.discovery import MdnsDiscovery
from tests.helpers.discovery import BIND, ann, nid

FIND_TIMEOUT = 10.0
REPO = Path(__file__).resolve().parents[1]


class Recorder:
    """Collects on_found/on_lost calls of one node; lets a test wait for a condition."""

    def __init__(self, me: Announcement) -> None:
        self.me = me
        self.found: list[Announcement] = []
        self.lost: list[str] = []
        self._changed = asyncio.Event()

    def on_found(self, a: Announcement) -> None:
        self.found.append(a)
        self._changed.set()

    def on_lost(self, node_id: str) -> None:
        self.lost.append(node_id)
        self._changed.set()

    def latest(self, node_id: str) -> Announcement | None:
        return next((a for a in reversed(self.found) if a.node_id == node_id), None)

    async def wait(self, cond: Callable[[], bool], what: str, timeout: float = FIND_TIMEOUT) -> None:
        async def loop() -> None:
            while not cond():
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(loop(), timeout)
        except TimeoutError:
            pytest.fail(f"{self.me.node_id}: timed out after {timeout}s waiting for {what}; "
                        f"found={[(a.node_id, a.boot_id[:8]) for a in self.found]} lost={self.lost}")


def _multicast_ifs(d: MdnsDiscovery) -> set[str]:
    """Multicast interface and bound address of every sending socket of a running discovery."""
    senders = d.zeroconf.zeroconf.engine.senders
    assert senders, "no sending socket"
    return {
        socket.inet_ntoa(t.sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4))
        for t in senders
    } | {t.sock.getsockname()[0] for t in senders}


@pytest.fixture
async def swarm():
    """Factory: start(announcement) -> (discovery, recorder); stops all at teardown."""
    running: list[MdnsDiscovery] = []

    async def start(me: Announcement) -> tuple[MdnsDiscovery, Recorder]:
        rec = Recorder(me)
        d = MdnsDiscovery(me, on_found=rec.on_found, on_lost=rec.on_lost, bind_host=BIND)
        running.append(d)
        await d.start()
        # The safety rule, checked on the live sockets: loopback only.
        assert _multicast_ifs(d) == {BIND}
        return d, rec

    yield start
    await asyncio.gather(*(d.stop() for d in running))


class DebugLogWatch(logging.Handler):
    """Signals when a discovery logs a given debug message (used to prove a negative)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.event.set()

    async def wait_for(self, needle: str, timeout: float = FIND_TIMEOUT) -> None:
        async def loop() -> None:
            while not any(needle in m for m in self.messages):
                self.event.clear()
                await self.event.wait()

        try:
            await asyncio.wait_for(loop(), timeout)
        except TimeoutError:
            pytest.fail(f"no log line containing {needle!r}; got {self.messages}")


@pytest.fixture
def debug_log():
    logger = logging.getLogger("dfl_node.net.discovery")
    watch = DebugLogWatch()
    old = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(watch)
    yield watch
    logger.removeHandler(watch)
    logger.setLevel(old)


# --------------------------------------------------------------------------- #
# Real zeroconf
# --------------------------------------------------------------------------- #


async def test_three_nodes_find_each_other_then_goodbye(swarm) -> None:
    mes = [ann(n, port=p) for n, p in (("node-a", 50051), ("node-b", 50052), ("node-c", 50053))]
    nodes = await asyncio.gather(*(swarm(m) for m in mes))
    recs = [r for _, r in nodes]

    for rec in recs:
        others = {m.node_id for m in mes} - {rec.me.node_id}
        await rec.wait(lambda rec=rec, others=others: others <= {a.node_id for a in rec.found},
                       f"peers {sorted(others)}")
    for rec in recs:
        assert rec.me.node_id not in {a.node_id for a in rec.found}, "a node reported itself"
        for m in mes:
            if m.node_id == rec.me.node_id:
                continue
            got = rec.latest(m.node_id)
            assert got == m, f"{rec.me.node_id} sees {got}, expected {m}"
            assert got.grpc_address == f"127.0.0.1:{m.grpc_port}"
        assert rec.lost == []

    # stop() says goodbye: the two others lose node-c.
    await nodes[2][0].stop()
    await nodes[2][0].stop()  # idempotent
    for rec in recs[:2]:
        await rec.wait(lambda rec=rec: nid("node-c") in rec.lost, "goodbye of node-c", timeout=5.0)
        assert rec.lost == [nid("node-c")]
    assert set(nodes[0][0].peers()) == {nid("node-b")} and set(nodes[1][0].peers()) == {nid("node-a")}


async def test_other_swarm_is_not_reported(swarm, debug_log) -> None:
    (_, a), (_, x), (_, b) = await asyncio.gather(
        swarm(ann("alpha", swarm="s1")),
        swarm(ann("xeno", swarm="s2")),
        swarm(ann("beta", swarm="s1", port=50052)),
    )
    # Each side has resolved the other's record and dropped it for its swarm...
    s1, s2 = nid("s1"), nid("s2")
    await debug_log.wait_for(f"{a.me.node_id}: ignoring {x.me.node_id} of swarm {s2!r}")
    await debug_log.wait_for(f"{x.me.node_id}: ignoring {a.me.node_id} of swarm {s1!r}")
    await debug_log.wait_for(f"{x.me.node_id}: ignoring {b.me.node_id} of swarm {s1!r}")
    # ...while same-swarm discovery works in the same window.
    await a.wait(lambda: any(f.node_id == nid("beta") for f in a.found), nid("beta"))
    await b.wait(lambda: any(f.node_id == nid("alpha") for f in b.found), nid("alpha"))
    await debug_log.wait_for(f"{b.me.node_id}: ignoring {x.me.node_id} of swarm {s2!r}")
    assert nid("xeno") not in {f.node_id for f in a.found + b.found}
    assert x.found == [] and x.lost == []


async def test_graceful_restart_with_new_boot_id(swarm) -> None:
    old = ann("restarter", port=50060)
    (_, a), (d_old, _) = await asyncio.gather(swarm(ann("watcher")), swarm(old))
    await a.wait(lambda: a.latest(nid("restarter")) == old, "restarter (first boot)")

    await d_old.stop()
    await a.wait(lambda: a.lost == [nid("restarter")], "goodbye")

    new = ann("restarter", port=50061)  # new boot id, new port
    assert new.boot_id != old.boot_id
    await swarm(new)
    await a.wait(lambda: a.latest(nid("restarter")) == new, "restarter (second boot)")
    assert [f.boot_id for f in a.found if f.node_id == nid("restarter")] == [old.boot_id, new.boot_id]


_CHILD = """
import asyncio, sys
from dfl_node.net.discovery import Announcement, MdnsDiscovery
async def main():
    node_id, swarm, boot_id = sys.argv[1:4]
    me = Announcement(node_id=node_id, swarm=swarm, host="127.0.0.1", grpc_port=50070,
                      http_port=0, algorithm="defkt", fingerprint="ab" * 40,
                      protocol_version=1, boot_id=boot_id)
    d = MdnsDiscovery(me, on_found=lambda a: None, on_lost=lambda n: None, bind_host="127.0.0.1")
    await d.start()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def test_crash_restart_is_reported_as_update(swarm) -> None:
    """A SIGKILLed node sends no goodbye; its restart (same id, new boot id) is an update."""
    _, a = await swarm(ann("observer"))
    boot1 = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, nid("phoenix"), nid("s1"), boot1, stdout=subprocess.PIPE, env=env, cwd=REPO
    )
    try:
        line = await asyncio.wait_for(child.stdout.readline(), FIND_TIMEOUT)
        assert line.strip() == b"ready"
        await a.wait(lambda: a.latest(nid("phoenix")) is not None, "phoenix (first boot)")
        first = a.latest(nid("phoenix"))
        assert (first.boot_id, first.grpc_port, first.http_port) == (boot1, 50070, 0)
        # 80 chars: announced as a 16-char prefix.
        assert first.fingerprint == "ab" * 8 and fingerprint_matches(first.fingerprint, "ab" * 40)
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()

    again = ann("phoenix", port=50071)
    await swarm(again)
    await a.wait(lambda: a.latest(nid("phoenix")).boot_id == again.boot_id, "phoenix (second boot)")
    assert a.latest(nid("phoenix")) == again
    assert a.lost == []  # no goodbye was ever sent; liveness is the daemon's job


async def test_update_reannounces_changed_txt(swarm) -> None:
    me = ann("changer", port=50080)
    (_, a), (d, _) = await asyncio.gather(swarm(ann("listener")), swarm(me))
    await a.wait(lambda: a.latest(nid("changer")) == me, nid("changer"))
    changed = ann("changer", port=50080, boot=me.boot_id, algorithm="fullavg", fingerprint="f" * 64)
    await d.update(changed)
    await a.wait(lambda: a.latest(nid("changer")) == changed, "updated TXT of changer")
    assert [f.algorithm for f in a.found if f.node_id == nid("changer")] == ["defkt", "fullavg"]
    with pytest.raises(ValueError):
        await d.update(ann("someone-else"))


async def test_stop_is_safe_before_start_and_after_failed_start(monkeypatch) -> None:
    rec = Recorder(ann("fragile"))
    idle = MdnsDiscovery(rec.me, on_found=rec.on_found, on_lost=rec.on_lost, bind_host=BIND)
    await idle.stop()  # never started: nothing to do

    made: list[AsyncZeroconf] = []

    async def failing_register(self, info, *args, **kwargs):
        made.append(self)
        raise RuntimeError("registration failed")

    # Fails after the real zeroconf and browser exist (as a name conflict would).
    monkeypatch.setattr(AsyncZeroconf, "async_register_service", failing_register)
    d = MdnsDiscovery(rec.me, on_found=rec.on_found, on_lost=rec.on_lost, bind_host=BIND)
    with pytest.raises(RuntimeError, match="registration failed"):
        await d.start()
    assert d.zeroconf is None  # start() cleaned up after itself...
    assert len(made) == 1 and made[0].zeroconf.done  # ...and closed the sockets
    await d.stop()
    await d.stop()
    with pytest.raises(RuntimeError):
        await d.start()  # one-shot object


async def test_a_peer_missed_by_the_first_queries_is_found_by_a_later_one(swarm, monkeypatch) -> None:
    """zeroconf's browser asks 4 times in its first ~14 s, then only to refresh the records it holds: a peer whose
    every answer was lost until then (a lossy link at start) was never found again. Our queries go on
    (``MdnsDiscovery._requery``; here every 20 s rather than from 30 s doubling, to keep the test short). The loss
    is played on node-a once zeroconf's own series is over: node-b's records leave its cache and its table."""
    monkeypatch.setattr(discovery, "REQUERY_FIRST_S", 20.0)
    monkeypatch.setattr(discovery, "REQUERY_MAX_S", 20.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    (a, rec), _ = await swarm(ann("node-a", port=50051)), await swarm(ann("node-b", port=50052))
    await rec.wait(lambda: nid("node-b") in {f.node_id for f in rec.found}, "node-b")
    await asyncio.sleep(max(0.0, started + 15.0 - loop.time()))  # past zeroconf's 4 queries; ours comes at 20 s
    zc = a.zeroconf.zeroconf
    forgotten = [r for name in list(zc.cache.names()) for r in zc.cache.entries_with_name(name)
                 if "node-b" in name or "node-b" in getattr(r, "alias", "")]  # its PTR is named by the service type
    zc.cache.async_remove_records(forgotten)
    a._peers.clear()
    await rec.wait(lambda: [f.node_id for f in rec.found].count(nid("node-b")) == 2, "node-b found again")
