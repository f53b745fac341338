"""The node's REST API: health, status, history, the fleet it sees, Prometheus metrics, dashboard, and its
trained model put to use (``/model``, ``/predict``: :mod:`dfl_node.api.serving`).

The app knows nothing about the daemon: it is given a :class:`~dfl_node.api.served_node.ServedNode`, whose methods
build a fresh snapshot on every request, and whose metrics registry it serves. Endpoints are ``async def`` on purpose,
so those methods run on the event loop that serves the app (the daemon's loop when uvicorn runs inside the daemon)
rather than in a worker thread — they may read the daemon's state without locks, and must be quick and non-blocking.

Nothing here changes the node: every route is ``GET`` (other methods get 405) but ``POST /predict``, which
computes an answer from the model and leaves it as it was. With a token (``--http-token-file``) every route but
``/healthz`` needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import TypeVar

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from dfl_node import __version__
from dfl_node.api.served_node import ServedNode
from dfl_node.api.serving import add_model_routes
from dfl_node.api.token import require_token
from dfl_node.records.fleet import FleetView
from dfl_node.records.history import HistoryEntry
from dfl_node.records.metrics import CONTENT_TYPE, EXPOSITION_VERSION
from dfl_node.records.status import NodeStatus

__all__ = ["create_app", "dashboard_html"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@lru_cache(maxsize=1)
def dashboard_html() -> str:
    """The dashboard page shipped as package data (``dfl_node/api/static/dashboard.html``)."""
    return (resources.files("dfl_node.api") / "static" / "dashboard.html").read_text(encoding="utf-8")


def create_app(node: ServedNode, token: bytes | None = None) -> FastAPI:
    """A FastAPI app serving ``node``: its status, history, fleet and metrics, and its committed model (``/model``,
    ``/predict``); with ``token``, only to requests that carry it (:mod:`dfl_node.api.token`)."""
    metrics = node.metrics
    app = FastAPI(
        title="dfl-node",
        version=__version__,
        description="Status of a decentralized federated learning node: health, status, history, the fleet it "
        "sees, Prometheus metrics and a dashboard; its trained model and predictions from it.",
    )

    def _provided(what: str, provider: Callable[[], T]) -> T:
        try:
            return provider()
        except Exception as exc:  # a provider's bug must not take the API down
            log.exception("%s provider failed", what)
            raise HTTPException(status_code=503, detail=f"{what} unavailable: {exc}") from exc

    @app.get("/healthz", summary="Liveness probe")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/status", response_model=NodeStatus, summary="Current status of the node")
    async def get_status() -> NodeStatus:
        return _provided("status", node.status)

    @app.get("/history", response_model=list[HistoryEntry], summary="Event history (training, fusions, evaluations)")
    async def get_history(
        since: int | None = Query(default=None, description="only entries with round >= since"),
    ) -> list[HistoryEntry]:
        entries = _provided("history", node.history)
        if since is not None:
            entries = [e for e in entries if e.round >= since]
        return entries

    @app.get("/fleet", response_model=FleetView, summary="The fleet as this node knows it (the dashboard's table)")
    async def get_fleet() -> FleetView:
        return _provided("fleet", node.fleet)

    @app.get(
        "/metrics",
        summary=f"Prometheus metrics (text exposition format {EXPOSITION_VERSION})",
        response_class=Response,
        responses={200: {"description": f"Prometheus text exposition format {EXPOSITION_VERSION}: {CONTENT_TYPE}",
                         "content": {CONTENT_TYPE.partition(";")[0]: {}}}},
    )
    async def get_metrics() -> Response:
        return Response(content=_provided("metrics", metrics.render), media_type=CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse, summary="Dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html())

    add_model_routes(app, node.committed_model, metrics)
    if token is not None:
        require_token(app, token, dashboard_html)

    return app
