"""The node as its REST API sees it: everything a route reads, in one protocol.

:func:`~dfl_node.api.app.create_app` is given one object of this shape rather than a callable per route, so a new
route touches this protocol and the route only. The daemon's :class:`~dfl_node.node.node.Node` satisfies it
structurally (nothing here imports it); tests give a fake of the same shape.
"""

from __future__ import annotations

from typing import Protocol

from dfl_node.learning.export import TrainedModel
from dfl_node.records.fleet import FleetView
from dfl_node.records.history import HistoryEntry
from dfl_node.records.metrics import NodeMetrics
from dfl_node.records.status import NodeStatus

__all__ = ["ServedNode"]


class ServedNode(Protocol):
    """What the REST routes read. Each method builds a fresh answer on every request, on the event loop that serves
    the app (the daemon's): it may read the node's state without locks, and must be quick and non-blocking."""

    @property
    def metrics(self) -> NodeMetrics:
        """The node's Prometheus registry (``/metrics``, and the model routes' counters)."""

    def status(self) -> NodeStatus:
        """``/status``: the node now."""

    def history(self) -> list[HistoryEntry]:
        """``/history``: its events (training, fusions, evaluations), oldest first."""

    def fleet(self) -> FleetView:
        """``/fleet``: the fleet as this node knows it (the dashboard's table)."""

    async def committed_model(self) -> TrainedModel | None:
        """``/model``, ``/model/info``, ``/predict``: its newest checkpoint's model; None before its first."""
