"""The contract between a node and the monitoring files in deploy/: the metric names a node exposes at
GET /metrics, each with the label node="<node id>". tests/test_metrics.py checks that a node really exposes them;
tests/test_deploy_monitoring.py, that the dashboard asks for nothing else."""

from __future__ import annotations

GAUGES = {
    "dfl_info",  # {node, swarm, algorithm, mode, version, boot_id} 1
    "dfl_round", "dfl_peers_alive", "dfl_peers_known", "dfl_fusing", "dfl_done", "dfl_holding",
    "dfl_local_accuracy_ratio", "dfl_global_accuracy_ratio",  # 0..1, absent until the node has evaluated
}
COUNTERS = {
    "dfl_models_sent_total", "dfl_models_received_total", "dfl_sent_bytes_total", "dfl_received_bytes_total",
    "dfl_fusions_total", "dfl_rounds_completed_total", "dfl_busy_refusals_total", "dfl_senders_abandoned_total",
    "dfl_groups_abandoned_total", "dfl_probes_sent_total", "dfl_probes_unanswered_total",
    "dfl_probes_answered_total",
    "dfl_rejected_total",  # {reason}
}
HISTOGRAMS = {  # as _bucket, _sum and _count
    "dfl_role_duration_seconds",  # {role="sender|aggregator"}
    "dfl_train_duration_seconds", "dfl_fusion_duration_seconds",
    "dfl_transfer_duration_seconds", "dfl_model_size_bytes",  # {direction="sent|received"}
}
PROCESS_GAUGES = {  # prometheus_client's ProcessCollector
    "process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds",
    "process_virtual_memory_bytes", "process_max_fds",
}
PROCESS_COUNTERS = {"process_cpu_seconds_total"}
KNOWN = GAUGES | COUNTERS | HISTOGRAMS | PROCESS_GAUGES | PROCESS_COUNTERS
