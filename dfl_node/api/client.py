"""The HTTP client of everything that asks nodes' REST APIs: ``dfl-node status`` and ``predict``, and the testbeds'
polls (:mod:`dfl_node.testbed.fetch`).

httpx builds a TLS context for every client it makes, loading the CA bundle: ~40 ms of CPU on a 2-core x86 machine
(several times that on a small device) for each status query, each ``--watch`` refresh and each poll of a testbed,
although a node serves its REST API in plain HTTP. One context, made the first time a client is, serves every
client of the process (an operator's ``https://`` URL, through a reverse proxy, is still verified with it).
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["rest_client"]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def rest_client(timeout: float, headers: dict[str, str] | None = None) -> httpx.Client:
    """A client for nodes' REST APIs: ``headers`` (the REST token: a fleet shares one) on every request, no proxy
    from the environment (nodes are on the operator's own network)."""
    return httpx.Client(timeout=timeout, trust_env=False, headers=headers, verify=_tls_context())
