"""GET JSON from several nodes' REST APIs, with one client: the testbeds' polls (inside a node's network namespace
where there is one: :func:`dfl_node.testbed.launcher.fetch_json`)."""

from __future__ import annotations

import httpx

from dfl_node.api.client import rest_client


def fetch_all(urls: list[str], timeout: float) -> list[object | None]:
    """Each URL's JSON, None for a node that does not answer (or answers no JSON)."""
    values: list[object | None] = []
    with rest_client(timeout) as client:
        for url in urls:
            try:
                values.append(client.get(url).json())
            except (httpx.HTTPError, ValueError):
                values.append(None)
    return values
