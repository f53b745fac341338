"""Every reason a node counts a refusal under (``/status``'s ``rejected``, ``dfl_rejected_total{reason}``), with
what it means: one catalogue, so that ``/metrics`` exports each reason at 0 before its first refusal (a dashboard's
refusals panel then reads 0 on a healthy fleet, not "No data") and an operator can look a reason up.

``tests/test_refusal_reasons.py`` reads the code for the reasons it counts and fails on one missing here.
"""

from __future__ import annotations

REASONS: dict[str, str] = {
    # Hello: who the peer is (TLS: mTLS or the swarm key) and whether we can learn together
    # (node/membership/compatibility.py)
    "identity_mismatch": "a connection authenticated as one node speaks for another",
    "unauthenticated": "a peer's certificate names no node id",
    "tls_handshake": "a peer's certificate failed our checks, or ours its",
    "protocol_version": "a peer (or a transfer) speaks another protocol version",
    "swarm_mismatch": "a peer (or a transfer, a pull) is of another swarm",
    "unknown_algorithm": "a peer runs an algorithm not installed here",
    "algorithm_mismatch": "a peer runs another algorithm",
    "task_mismatch": "a peer learns another task (classification, regression, anomaly)",
    "wire_dtype_mismatch": "a peer (or a transfer) uses another wire dtype",
    "unknown_model": "a peer runs a model not installed here",
    "architecture_mismatch": "a peer runs another architecture, and our algorithm fuses identical ones only",
    "sample_shape_mismatch": "a peer's samples have another shape",
    "num_classes_mismatch": "a peer's data has another number of classes",
    "fingerprint_mismatch": "a peer's (or a transfer's) model has other tensors than we expect",
    "duplicate_id": "another process answers with our node id",
    "peer_table_full": "too many unconfirmed peers at once",
    "undecodable": "a request that is not the message its RPC takes",
    # the membership's probes (node/membership/swim.py, net/servicer.py)
    "too_many_updates": "a membership ping with more updates than its bound",
    # control messages (peering/control.py, net/envelopes.py)
    "unknown_control": "a control message of a kind not known (or not answered) here",
    "bad_control": "a control message whose body is not its kind's fields (not JSON, a wrong type, a missing object)",
    "control_too_large": "a control message's body over its bound (64 KiB)",
    # a transfer's stream (net/assembler.py, net/servicer.py)
    "truncated": "a transfer's stream ended early (from a node that is no member: a member's is kept to resume)",
    "bad_resume": "a stream that goes on from a place or a payload other than what is held of it",
    "idle_timeout": "a transfer's stream stalled",
    "unexpected_frame": "a frame out of a transfer's order",
    "header_too_large": "a transfer's header over its bound",
    "chunk_too_large": "a transfer's chunk over its bound",
    "too_large": "a transfer over the size bound",
    "trailing_data": "bytes after a transfer's declared payload",
    "bad_manifest": "a transfer's tensor manifest is inconsistent",
    "unknown_tensor": "a transfer names a tensor our model lacks",
    "shape_mismatch": "a transfer's tensor of another shape than ours",
    "dtype_not_allowed": "a transfer's tensor of a dtype not allowed",
    "bad_scale": "an int8 tensor's scale is not a finite positive number",
    "model_not_fusable": "a transfer of a model our algorithm cannot fuse",
    "hash_not_offered": "a transfer's digest of a hash we did not offer",
    "bad_sha256": "a transfer's payload does not match its sha256",
    "bad_blake3": "a transfer's payload does not match its BLAKE3 digest",
    # a round's roles (node/requests.py, node/exchange/collector.py, node/schedule/rounds.py)
    "stale_epoch": "a request of a round token's older epoch",
    "not_expected": "a transfer from a node that is no sender of our group",
    "too_late": "a transfer after its group's aggregation began",
    "duplicate": "a second transfer of the same sender and round",
    "over_memory": "a transfer over the aggregator's memory bound",
    "round_window": "a role for a round far ahead of the fleet's",
    "unknown_role": "an assignment of a role that does not exist",
    "seed_mismatch": "a round token of another seed",
    "async_mode": "a round-mode request to a node in async mode",
    "not_selecting": "a probe to a node whose algorithm selects no receivers",
    "bad_probe": "a malformed selection probe",
    "bad_probe_answer": "a candidate's answer to our probe is malformed",
    "algorithm": "a message our algorithm cannot fuse (purpose, segments, shapes)",
    # what a received model holds (node/exchange/arrival_checks.py, algorithms/defences.py)
    "non_finite": "a received model holds NaN or ±Inf",
    "low_accuracy": "a received model below --min-accuracy on our validation split",
    "sample_count": "a received sample count over --sample-cap times ours (fused with the capped count)",
    "norm_bound": "a received model farther from ours than --norm-bound times our model's norm",
    "relative_accuracy": "a received model more than --relative-gate below ours on our validation split",
    # what this node computed from them (algorithms/step_guard.py, algorithms/runner.py)
    "non_finite_result": "fusing a received model (or using a reply) left NaN or ±Inf in ours: undone, refused",
    "diverged": "our own training left NaN or ±Inf in our model: undone (a pull of it refused)",
}
