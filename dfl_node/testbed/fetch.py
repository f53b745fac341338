"""GET JSON from several nodes' REST APIs; also runnable inside a network namespace.

``python -m dfl_node.testbed.fetch TIMEOUT URL…`` prints a JSON list (null for a node that does not
answer). The testbed runs it with ``ip netns exec`` to reach nodes whose addresses exist only
inside their namespaces. Deliberately light: no torch import.
"""

from __future__ import annotations

import json
import sys

import httpx

from dfl_node.api.client import rest_client


def fetch_all(urls: list[str], timeout: float) -> list[object | None]:
    values: list[object | None] = []
    with rest_client(timeout) as client:
        for url in urls:
            try:
                values.append(client.get(url).json())
            except (httpx.HTTPError, ValueError):
                values.append(None)
    return values


if __name__ == "__main__":
    print(json.dumps(fetch_all(sys.argv[2:], float(sys.argv[1]))))
