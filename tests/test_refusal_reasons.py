"""The refusal reasons a node counts: one catalogue the code cannot outgrow, exported at 0 in /metrics
before the first refusal, and /metrics' OpenAPI description naming the exposition format its header says."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from dfl_node.algorithms.defences import REASONS as DEFENCE_REASONS
from dfl_node.algorithms.step_guard import REASONS as GUARD_REASONS
from dfl_node.hashes import OFFERED_HASHES
from dfl_node.node.membership.compatibility import REASONS as HELLO_REASONS
from dfl_node.peering.errors import UNCOUNTED_REFUSALS
from dfl_node.peering.reasons import REASONS
from dfl_node.records.metrics import NodeMetrics
from tests.helpers.rest import make_status

PACKAGE = Path(__file__).resolve().parent.parent / "dfl_node"
# Where the code names a reason it counts (or answers, and the answering network counts) as a string literal.
COUNTED = [re.compile(p) for p in (
    r'TransferRejected\(\s*"(\w+)"', r'_reject\(\s*"(\w+)"', r'on_rejected\(\s*"(\w+)"', r'rejected\["(\w+)"\]',
    r'PeerUnauthenticated\(\s*"(\w+)"', r'ProbeReply\(ok=False, reason="(\w+)"', r'Ack\(ok=False, reason="(\w+)"',
)]
# An Ack a node makes for itself when it has no address to call, or a member's answer to a dial-back (never counted);
# a relay's answer to a reservation, counted as its own load (/status relaying.refused, dfl_relay_refused_total), not
# as a refused transfer or Hello.
NOT_REFUSALS = {"unreachable", "busy", "no_slot"}


def counted_in_code() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        found.update(match for pattern in COUNTED for match in pattern.findall(text))
    return found


def test_every_reason_the_code_counts_is_in_the_catalogue() -> None:
    found = counted_in_code() | set(HELLO_REASONS) | set(DEFENCE_REASONS) | set(GUARD_REASONS)
    found |= {f"bad_{h}" for h in OFFERED_HASHES}
    assert len(found) > 40  # the patterns still find the code's reasons
    missing = found - set(REASONS) - (UNCOUNTED_REFUSALS - {"bad_probe"}) - NOT_REFUSALS
    assert not missing, f"count these in dfl_node/peering/reasons.py: {sorted(missing)}"


def test_metrics_export_every_known_reason_from_zero() -> None:
    text = NodeMetrics("node-a", lambda: make_status(rejected={"norm_bound": 3})).render().decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "dfl_rejected"]
    counts = {s.labels["reason"]: s.value for s in family.samples if s.name == "dfl_rejected_total"}
    assert counts == {**dict.fromkeys(REASONS, 0.0), "norm_bound": 3.0}


async def test_the_openapi_description_names_the_format_the_header_says(client: httpx.AsyncClient) -> None:
    header = (await client.get("/metrics")).headers["content-type"]
    version = re.search(r"version=([\d.]+)", header)
    assert version is not None
    operation = (await client.get("/openapi.json")).json()["paths"]["/metrics"]["get"]
    assert operation["summary"] == f"Prometheus metrics (text exposition format {version[1]})"
    assert list(operation["responses"]["200"]["content"]) == [header.partition(";")[0]]
    assert version[1] in operation["responses"]["200"]["description"]
