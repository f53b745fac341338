"""Peers refused at Hello, as a node keeps them (in-process node, real gRPC and HTTP on loopback): a flood of
Hellos from strangers with new ids, each incompatible, stays bounded in ``/status`` and in the log, is counted
Hello by Hello, and the node keeps serving."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.helpers.hostile import Target, stranger_hello

STRANGERS = 50


async def test_a_flood_of_refused_strangers_is_bounded_in_status_and_in_the_log(
        target: Target, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "dfl_node.node.membership.refusals")
    for i in range(STRANGERS):
        reply = await target.stub.Hello(stranger_hello(target, node_id=f"stranger-{i:02d}", fingerprint="0" * 64,
                                                       sample_shape=[5]), timeout=5)
        assert (reply.accepted, reply.reason) == (False, "sample_shape_mismatch")
    async with httpx.AsyncClient(trust_env=False) as http:
        status = (await http.get(f"{target.url}/status")).json()
    assert status["rejected"] == {"sample_shape_mismatch": STRANGERS}  # every Hello counted
    kept = [r["id"] for r in status["refused_peers"]]
    assert kept == [f"stranger-{i:02d}" for i in range(STRANGERS - 32, STRANGERS)]  # the newest 32
    lines = [r.getMessage() for r in caplog.records if "at hello" in r.getMessage()]
    assert len(lines) == 10 and all("refused stranger-" in line for line in lines)  # 10 a minute, then silence
    ok = await target.stub.Hello(stranger_hello(target), timeout=5)
    assert ok.accepted
