"""A node's Prometheus metrics, with ``prometheus_client``: its histograms, and its status as metrics.

Each node owns a :class:`NodeMetrics`: one registry (the simulator runs many nodes in one process, so
never the global one) holding

- the histograms the node observes as it works (role, training, fusion and transfer durations, model
  sizes): :meth:`NodeMetrics.observe`;
- a collector over the node's status snapshot (:class:`StatusCollector`): its counters, round, peers,
  headline figures (:func:`figure_metric`), read fresh at every scrape, so they can never disagree with
  ``/status``; its refusals by reason, every known reason (:mod:`dfl_node.peering.reasons`) from 0, so a
  healthy node's count reads 0, not nothing;
- the ``process_*`` metrics (resident memory, CPU, open fds, start time) once the node serves REST as its
  own process (:meth:`NodeMetrics.add_process_metrics`): what an IoT operator watches first.

Names follow Prometheus' conventions: base units in the name (``_seconds``, ``_bytes``, ``_ratio``),
``_total`` on counters, and every sample carries a ``node`` label (the node id).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from dfl_node.peering.reasons import REASONS
from dfl_node.records.formatting import Figure, figure
from dfl_node.records.status import NodeStatus

__all__ = ["CONTENT_TYPE", "COUNTER_METRICS", "EXPOSITION_VERSION", "NodeMetrics", "StatusCollector", "figure_metric"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
# The exposition format's version, as the Content-Type header names it (prometheus_client 0.26: 1.0.0)
EXPOSITION_VERSION = CONTENT_TYPE.partition("version=")[2].partition(";")[0]

# One counter per status counter: (metric name without _total, help).
COUNTER_METRICS = {
    "models_sent": ("dfl_models_sent", "Models (or model segments) sent to peers."),
    "models_received": ("dfl_models_received", "Models (or model segments) received from peers."),
    "bytes_sent": ("dfl_sent_bytes", "Model payload bytes sent to peers."),
    "bytes_received": ("dfl_received_bytes", "Model payload bytes received from peers."),
    "fusions": ("dfl_fusions", "Fusions performed by this node."),
    "rounds_completed": ("dfl_rounds_completed", "Rounds (async: exchanges) this node completed a role in."),
    "busy_refusals": ("dfl_busy_refusals", "Requests refused because this node was busy with another role."),
    "senders_abandoned": ("dfl_senders_abandoned", "Senders an aggregator left out: their transfer never came in "
                                                   "time."),
    "groups_abandoned": ("dfl_groups_abandoned", "Round mode: groups skipped because their live members refused "
                                                 "their roles for a round_timeout."),
    "probes_sent": ("dfl_probes_sent", "Client-selection probes sent to candidate receivers."),
    "probes_unanswered": ("dfl_probes_unanswered", "Client-selection probes that got no valid answer in time."),
    "probes_answered": ("dfl_probes_answered", "Client-selection probes answered as a candidate."),
    "transfers_cut": ("dfl_transfers_cut", "Model streams a link cut mid-way, at either end (resumed where they "
                                           "could be)."),
    "bytes_resent": ("dfl_resent_bytes", "Bytes sent again because a model stream was cut."),
    "groups_replanned": ("dfl_groups_replanned", "Round mode: groups that failed group_attempts times with their "
                                                 "members alive, planned around by the holder."),
    "rounds_held": ("dfl_rounds_held", "Round mode: rounds this node played as the round token's holder."),
}

Timed = Literal["role", "train", "fusion", "transfer", "model_size", "predict"]
PredictOutcome = Literal["ok", "invalid", "too_large"]

# Buckets: a digits MLP step takes milliseconds, a paper CNN's fusion on a Raspberry Pi minutes.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300, 600)
_BYTES = tuple(float(4**k * 1024) for k in range(1, 11))  # 4 KiB … 1 GiB, ×4
_REQUEST_SECONDS = (0.0005, 0.001, 0.0025, *_SECONDS[:11])  # /predict: one sample of an MLP takes a millisecond


def figure_metric(headline: Figure, scope: Literal["local", "global"]) -> str:
    """The gauge of a node's ``scope`` figure: ``dfl_{scope}_{metric}``, ``_ratio`` where the metric is a fraction
    (``dfl_global_accuracy_ratio``, ``dfl_global_auc_ratio``, ``dfl_global_rmse``).

    A metric name of its own per task's metric, not one gauge with a ``metric`` label: Prometheus names a metric
    by what it measures, in its unit, so that the series of one name can be compared, averaged and given one
    axis (an RMSE is in the targets' unit and better lower, an accuracy a fraction better higher: one panel or
    ``avg()`` over both means nothing); so a classification fleet's gauges keep their names and its dashboards
    their queries, and a query names the figure it means. A plugin's metric is named by its own name (characters
    a metric name cannot hold as ``_``), with no unit suffix: nothing says what its unit is."""
    return f"dfl_{scope}_{re.sub(r'[^a-zA-Z0-9_]', '_', headline.metric)}" + ("_ratio" if headline.ratio else "")


class StatusCollector(Collector):
    """The node's status snapshot as metrics, built afresh at every scrape."""

    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        node = [s.id]

        def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, help_text, labels=["node"])
            family.add_metric(node, value)
            return family

        info = GaugeMetricFamily("dfl_info", "Static information about the node (value is always 1).",
                                 labels=["node", "swarm", "algorithm", "mode", "version", "boot_id"])
        info.add_metric([s.id, s.swarm, s.algorithm, s.mode, s.version, s.boot_id], 1)
        yield info
        yield gauge("dfl_round", "Current round of the node (async mode: exchanges it took part in).", s.round)
        for field, (name, help_text) in COUNTER_METRICS.items():
            counter = CounterMetricFamily(name, help_text, labels=["node"])
            counter.add_metric(node, getattr(s, field))
            yield counter
        rejected = CounterMetricFamily("dfl_rejected", "Rejected transfers or handshakes, by reason.",
                                       labels=["node", "reason"])
        for reason, count in sorted({**dict.fromkeys(REASONS, 0), **s.rejected}.items()):  # known reasons from 0
            rejected.add_metric([s.id, reason], count)
        yield rejected
        yield gauge("dfl_peers_alive", "Peers in the peer table that are alive.", sum(p.alive for p in s.peers))
        yield gauge("dfl_peers_known", "Peers in the peer table, alive or not.", len(s.peers))
        headline = figure(s.metric)
        if s.local_accuracy is not None:  # absent, not 0, until the node has evaluated
            yield gauge(figure_metric(headline, "local"), f"{headline.title} of the node's model on its local "
                        "validation split.", s.local_accuracy)
        if s.global_accuracy is not None:
            yield gauge(figure_metric(headline, "global"), f"{headline.title} of the node's model on the global "
                        "test set.", s.global_accuracy)
        if s.privacy is not None:  # absent without differential privacy
            yield gauge("dfl_privacy_epsilon", f"Differential privacy: ε the node spent on its data, at δ "
                        f"{s.privacy.delta:g}.", s.privacy.epsilon)
            yield gauge("dfl_privacy_exhausted", "Differential privacy: 1 once the budget stopped training on the "
                        "node's data.", s.privacy.exhausted)
        yield gauge("dfl_fusing", "1 while the node is fusing a model.", s.fusing)
        yield gauge("dfl_holding", "Round mode: 1 while the node holds the round token.", s.holding)
        yield gauge("dfl_done", "1 once the node reached its round/time budget.", s.done)
        yield gauge("dfl_work_seconds", "Seconds of computation the node's last role took (its deadlines follow it).",
                    s.work_s)
        reach = GaugeMetricFamily("dfl_reachability", "1 for how peers reach the node: direct, relayed (behind NAT, "
                                  "through the member named by relay), unreachable or unknown.",
                                  labels=["node", "state", "relay"])
        reach.add_metric([s.id, s.reachability, s.relay or ""], 1)
        yield reach
        yield gauge("dfl_relay_slots", "Members this node relays now (their peers cannot dial them).", s.relaying.slots)
        for field, help_text in (("connections", "Connections this node carried as a relay."),
                                 ("bytes", "Bytes this node carried as a relay, both ways."),
                                 ("refused", "Relay reservations this node refused: no slot left.")):
            counter = CounterMetricFamily(f"dfl_relay_{field}", help_text, labels=["node"])
            counter.add_metric(node, getattr(s.relaying, field))
            yield counter
        links = {(p.id, direction): rate for p in s.peers if p.link is not None
                 for direction, rate in (("sent", p.link.sent_bytes_per_s), ("received", p.link.received_bytes_per_s))
                 if rate is not None}
        throughput = GaugeMetricFamily("dfl_link_throughput_bytes_per_second", "Throughput of the newest model "
                                       "transfers with each peer, by direction (smoothed).",
                                       labels=["node", "peer", "direction"])
        for (peer, direction), rate in sorted(links.items()):
            throughput.add_metric([s.id, peer, direction], rate)
        yield throughput
        for direction, cap in (("upload", s.max_upload), ("download", s.max_download)):
            if cap:
                yield gauge(f"dfl_max_{direction}_bytes_per_second", f"The node's {direction} cap for model "
                            "transfers (--max-" + direction + ").", cap)


class _WithNodeLabel(Collector):
    """Another collector's metrics with the ``node`` label added, as every dfl-node metric carries it."""

    def __init__(self, inner: Collector, node_id: str) -> None:
        self.inner, self.node_id = inner, node_id

    def collect(self) -> Iterator[Metric]:
        for metric in self.inner.collect():
            metric.samples = [s._replace(labels={**s.labels, "node": self.node_id}) for s in metric.samples]
            yield metric


class NodeMetrics:
    """One node's registry: its histograms, its status collector, and (as a process) the process metrics."""

    def __init__(self, node_id: str, status: Callable[[], NodeStatus]) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry()  # no auto-describe: the status is read at scrapes only
        self.registry.register(StatusCollector(status))

        def histogram(name: str, help_text: str, extra: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, ["node", *extra], registry=self.registry, buckets=buckets)

        self._histograms: dict[Timed, Histogram] = {
            "role": histogram("dfl_role_duration_seconds", "A sender or aggregator role, from taken to done (the "
                              "node's part of a round, its checkpoint included).", ("role",), _SECONDS),
            "train": histogram("dfl_train_duration_seconds", "Local training before a send or a fusion.", (),
                               _SECONDS),
            "fusion": histogram("dfl_fusion_duration_seconds", "Fusing received models (e.g. mutual knowledge "
                                "transfer).", (), _SECONDS),
            "transfer": histogram("dfl_transfer_duration_seconds", "Streaming one model to or from a peer, until "
                                  "the receiving side holds it whole.", ("direction",), _SECONDS),
            "model_size": histogram("dfl_model_size_bytes", "Size on the wire of one model (or segment) sent or "
                                    "received.", ("direction",), _BYTES),
            "predict": histogram("dfl_predict_duration_seconds", "A /predict request answered, from its body read to "
                                 "its answer (validation and inference).", (), _REQUEST_SECONDS),
        }
        self._predictions = Counter("dfl_predict_requests", "/predict requests, by outcome (ok; invalid: 422; "
                                    "too_large: 413).", ["node", "outcome"], registry=self.registry)
        self._predicted = Counter("dfl_predicted_samples", "Samples /predict answered.", ["node"],
                                  registry=self.registry)

    def observe(self, kind: Timed, value: float, **labels: str) -> None:
        """Record one observation: ``role`` takes ``role=``; ``transfer`` and ``model_size`` take
        ``direction="sent"`` or ``"received"``."""
        self._histograms[kind].labels(node=self.node_id, **labels).observe(value)

    def predicted(self, outcome: PredictOutcome, samples: int = 0) -> None:
        """Count one /predict request and the samples it answered."""
        self._predictions.labels(node=self.node_id, outcome=outcome).inc()
        if samples:
            self._predicted.labels(node=self.node_id).inc(samples)

    def add_process_metrics(self) -> None:
        """The ``process_*`` metrics of this process: only for a node that is its own process (a daemon)."""
        self.registry.register(_WithNodeLabel(ProcessCollector(registry=None), self.node_id))

    def render(self) -> bytes:
        """The exposition text (format :data:`EXPOSITION_VERSION`) of everything in the registry."""
        return generate_latest(self.registry)
