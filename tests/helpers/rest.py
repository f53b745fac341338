"""A fake daemon as the REST app sees it: its status (:func:`make_status`), its history, and the app over them
(:func:`app_of`, :class:`FakeRestNode`); the ``node`` and ``client`` fixtures (``tests/conftest.py``) serve one."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from dfl_node.api.app import create_app
from dfl_node.records.fleet import FleetMember, FleetView
from dfl_node.records.history import HistoryEntry
from dfl_node.records.metrics import NodeMetrics
from dfl_node.records.peers import PeerInfo
from dfl_node.records.status import NodeStatus

NASTY_REASON = 'bad "fingerprint" \\ in C:\\models\nsecond line'


def make_status(**overrides) -> NodeStatus:
    """A busy node's status (peers, counters, a refusal reason that needs escaping), ``overrides`` changed."""
    fields = dict(
        id="node-a",
        swarm="swarm-1",
        algorithm="defkt",
        mode="round",
        round=7,
        role="receiver",
        peers=[
            PeerInfo(id="node-b", address="127.0.0.1:50052", http_port=8082, last_seen=1700000000.5, alive=True,
                     algorithm="defkt"),
            PeerInfo(id="node-c", address="10.0.0.3:50053", http_port=None, last_seen=1699999000.0, alive=False),
        ],
        local_accuracy=0.8125,
        global_accuracy=0.75,
        models_sent=3,
        models_received=4,
        bytes_sent=1234567,
        bytes_received=2345678,
        fusions=4,
        rounds_completed=6,
        busy_refusals=1,
        rejected={"swarm_mismatch": 2, NASTY_REASON: 1},
        boot_id="boot-123",
        uptime_s=42.5,
        grpc_address="127.0.0.1:50051",
        http_port=8081,
        param_sha256="ab" * 32,
        fusing=True,
        done=False,
    )
    fields.update(overrides)
    return NodeStatus(**fields)


HISTORY = [
    HistoryEntry(round=1, time=1.0, event="train", role="sender", peer=None, local_accuracy=0.5),
    HistoryEntry(round=2, time=2.0, event="fusion", role="receiver", peer="node-b", local_accuracy=0.6,
                 detail={"loss": 0.25, "epochs": 2, "kind": "mkt"}),
    HistoryEntry(round=3, time=3.0, event="eval", role="idle", peer=None, local_accuracy=0.7, global_accuracy=0.65),
]


class Served:
    """A fake node as the REST app sees it (a :class:`~dfl_node.api.served_node.ServedNode`): its status and history
    those of ``status`` and ``history``, its fleet itself alone, its metrics those of its status, and no model yet."""

    def __init__(self, status: Callable[[], NodeStatus], history: Callable[[], list[HistoryEntry]]) -> None:
        self._status, self._history = status, history
        self.metrics = NodeMetrics("fake", status)

    def status(self) -> NodeStatus:
        return self._status()

    def history(self) -> list[HistoryEntry]:
        return self._history()

    def fleet(self) -> FleetView:
        s = self._status()
        me = FleetMember(id=s.id, is_self=True, grpc_address=s.grpc_address, alive=True, round=s.round)
        return FleetView(node=s.id, mode=s.mode, members=[me])

    async def committed_model(self) -> None:
        return None


def app_of(status: Callable[[], NodeStatus], history: Callable[[], list[HistoryEntry]]) -> FastAPI:
    """The REST app of a fake node (:class:`Served`)."""
    return create_app(Served(status, history))


class FakeRestNode:
    """A fake daemon: the app only ever sees it through :class:`Served` (and metrics over its status)."""

    def __init__(self, status: NodeStatus) -> None:
        self.status = status
        self.history = list(HISTORY)
        self.status_calls = 0

    def app(self, status: Callable[[], NodeStatus] | None = None) -> FastAPI:
        return app_of(status or self.get_status, self.get_history)

    def get_status(self) -> NodeStatus:
        self.status_calls += 1
        return self.status

    def get_history(self) -> list[HistoryEntry]:
        return list(self.history)
