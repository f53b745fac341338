"""The REST API's bearer token (``--http-token-file``): every route but ``/healthz`` answers 401 without it.

The token is the whole check: compared in constant time with the ``Authorization: Bearer …`` header, never echoed,
never logged. ``/healthz`` stays open because a container's or a load balancer's liveness probe has no secret, and
says only that the process serves. A browser that opens the dashboard (``/``) without the token gets the page with
its 401: the page holds no node data, asks the operator for the token once and sends it with every request it makes.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

OPEN_PATHS = frozenset({"/healthz"})
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="dfl-node"'}
REFUSED = "this node's REST API needs its token: send 'Authorization: Bearer TOKEN' (the node's --http-token-file)"


def require_token(app: FastAPI, token: bytes, page: Callable[[], str]) -> None:
    """Refuse every request to ``app`` but ``/healthz`` that does not carry ``token``; the dashboard's ``page``
    comes with its 401, so that a browser can ask for the token."""
    expected = b"Bearer " + token

    @app.middleware("http")
    async def check_token(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = request.headers.get("authorization", "").encode("latin-1")
        if request.url.path in OPEN_PATHS or hmac.compare_digest(given, expected):
            return await call_next(request)
        if request.url.path == "/" and request.method == "GET":
            return HTMLResponse(page(), status_code=401, headers=CHALLENGE)
        return JSONResponse({"detail": REFUSED}, status_code=401, headers=CHALLENGE)
