"""Scheduled probes, discovery and the S3 archive (docs/metrics.md, "Probes")."""

from __future__ import annotations

from agent.models.figures.schema import Figure, PerPeer, probe_bits_per_second, probe_success

PROBE_SUCCESS = Figure(
    "burstwatch_probe_success", "gauge", "probes",
    "1 when the last probe of this peer and direction completed, 0 when it failed (refused, busy, timed out, ...).",
    labels=("peer", "direction"),
    doc="1 when the last probe completed, 0 when it failed",
    cloudwatch=(
        PerPeer("ProbeSuccess", "None", "Minimum", False,
                "1 when the peer's latest probe succeeded",
                probe_success),
    ))
PROBE_THROUGHPUT_BYTES_PER_SECOND = Figure(
    "burstwatch_probe_throughput_bytes_per_second", "gauge", "probes",
    "Payload rate the receiver measured in the last successful probe (iperf3 end.sum_received).",
    labels=("peer", "direction"),
    doc="payload rate the receiver measured (iperf3 `end.sum_received`)",
    cloudwatch=(
        PerPeer("ProbeThroughputBitsPerSecond", "Bits/Second", "Average", True,
                "each probe's throughput, in the period the probe ran, 0 when it failed (only when probes run: "
                "`[probe] peers`)",
                probe_bits_per_second),
    ))
PROBE_EXPECTED_BYTES_PER_SECOND = Figure(
    "burstwatch_probe_expected_bytes_per_second", "gauge", "probes",
    "What the pair should get: the lower of the two sizes' allowance (peak with credits, baseline without; the "
    "peer's size from discovery, else ours).",
    labels=("peer", "direction"),
    doc="what the pair should get: the lower of our current allowance (peak while the direction's bucket holds "
        "credit, baseline once empty) and the peer's size's peak (from discovery; our own size's when unknown — the "
        "peer's credit is invisible from here)")
PROBE_THROUGHPUT_RATIO = Figure(
    "burstwatch_probe_throughput_ratio", "gauge", "probes",
    "Last probe's throughput as a fraction of burstwatch_probe_expected_bytes_per_second.",
    labels=("peer", "direction"),
    doc="throughput ÷ expected (0..1, above 1 when the catalogue undersells the size)")
PROBE_RETRANSMITS = Figure(
    "burstwatch_probe_retransmits", "gauge", "probes",
    "TCP retransmits during the last successful probe (sender side, all streams).",
    labels=("peer", "direction"),
    doc="TCP retransmits during the last successful probe (sender side)")
PROBE_RTT_SECONDS = Figure(
    "burstwatch_probe_rtt_seconds", "gauge", "probes",
    "Mean smoothed RTT over the streams of the last successful probe (TCP_INFO).",
    labels=("peer", "direction"),
    doc="mean smoothed RTT of the streams (TCP_INFO)")
PROBE_DURATION_SECONDS = Figure(
    "burstwatch_probe_duration_seconds", "gauge", "probes",
    "Wall time the last probe took, failures included.",
    labels=("peer", "direction"),
    doc="wall time the last probe took")
PROBE_LAST_RUN_TIMESTAMP_SECONDS = Figure(
    "burstwatch_probe_last_run_timestamp_seconds", "gauge", "probes",
    "Unix time the last probe started.",
    labels=("peer", "direction"),
    doc="Unix time the last probe started")
PROBE_LAST_BYTES = Figure(
    "burstwatch_probe_last_bytes", "gauge", "probes",
    "Payload bytes the last probe moved.",
    labels=("peer", "direction"),
    doc="payload bytes the last probe moved")
PROBE_RUNS_TOTAL = Figure(
    "burstwatch_probe_runs_total", "counter", "probes",
    "Probes run, by peer, direction and result (success or failure).",
    labels=("peer", "direction", "result"),
    doc="probes run, `result` = success or failure")
PROBE_SKIPPED_TOTAL = Figure(
    "burstwatch_probe_skipped_total", "counter", "probes",
    "Probes that were due but did not start, by reason: credit_floor, would_cross_floor, budget, busy, peer_backoff "
    "(one per peer and direction), no_peers (one per round).",
    labels=("reason",),
    doc="due probes that did not start, by the reasons above (all reasons always present)")
PROBE_BYTES_TOTAL = Figure(
    "burstwatch_probe_bytes_total", "counter", "probes",
    "Payload bytes moved by scheduled probes, by direction (out: we sent; in: the peer sent).",
    labels=("direction",),
    doc="payload bytes moved by scheduled probes")
PROBE_BUDGET_USED_BYTES = Figure(
    "burstwatch_probe_budget_used_bytes", "gauge", "probes",
    "Probe bytes in the last hour (sliding window).",
    doc="probe bytes in the last hour")
PROBE_BUDGET_BYTES = Figure(
    "burstwatch_probe_budget_bytes", "gauge", "probes",
    "Hourly probe byte budget ([probe] hourly_budget_bytes).",
    doc="the hourly budget")
PROBE_ROUNDS_TOTAL = Figure(
    "burstwatch_probe_rounds_total", "counter", "probes",
    "Scheduling rounds begun since start.",
    doc="rounds begun since start")
PROBE_NEXT_ROUND_TIMESTAMP_SECONDS = Figure(
    "burstwatch_probe_next_round_timestamp_seconds", "gauge", "probes",
    "Unix time the next round is due.",
    doc="Unix time the next round is due")
PROBE_RUNNING = Figure(
    "burstwatch_probe_running", "gauge", "probes",
    "1 while a probe is in flight.",
    doc="1 while a probe is in flight")
PROBE_PEERS = Figure(
    "burstwatch_probe_peers", "gauge", "probes",
    "Peers in the schedule, by source (config or discovered).",
    labels=("source",),
    doc="peers in the schedule by source (`config`, `discovered`)")
PROBE_PEER_INFO = Figure(
    "burstwatch_probe_peer_info", "gauge", "probes",
    "1 per peer in the schedule, with its source and instance type (empty when unknown).",
    labels=("peer", "source", "instance_type"),
    doc="1 per peer; the type comes from discovery (empty when unknown)")
PROBE_DISCOVERY_SUCCESS = Figure(
    "burstwatch_probe_discovery_success", "gauge", "probes",
    "1 when the last peer discovery (EC2 tag or the fleet bucket's registry) succeeded; on failure the last good "
    "list is kept.",
    doc="1 when the last discovery worked (DescribeInstances with `discover_tag`, S3 with `registry`); on failure "
        "the last good list is kept")
PROBE_DISCOVERIES_TOTAL = Figure(
    "burstwatch_probe_discoveries_total", "counter", "probes",
    "Peer discoveries run, by result (success or failure): one DescribeInstances page, or the registry's S3 "
    "listing.",
    labels=("result",),
    doc="peer discoveries run, `result` = success or failure: each is one DescribeInstances page (`discover_tag`) "
        "or one S3 listing of the registry (`registry`); docs/fleet.md, \"Peer discovery\"")
PROBE_DISCOVERY_LAST_SUCCESS_TIMESTAMP_SECONDS = Figure(
    "burstwatch_probe_discovery_last_success_timestamp_seconds", "gauge", "probes",
    "Unix time of the last successful tag discovery.",
    doc="time of the last good discovery")
PROBE_ARCHIVE_UPLOADED_TOTAL = Figure(
    "burstwatch_probe_archive_uploaded_total", "counter", "probes",
    "Probe documents uploaded to S3.",
    doc="documents uploaded to S3 (only with the archive on)")
PROBE_ARCHIVE_FAILED_TOTAL = Figure(
    "burstwatch_probe_archive_failed_total", "counter", "probes",
    "S3 uploads that failed after botocore's retries (the object stays in the backlog and is tried again).",
    doc="uploads that failed after botocore's retries; the document stays queued")
PROBE_ARCHIVE_DROPPED_TOTAL = Figure(
    "burstwatch_probe_archive_dropped_total", "counter", "probes",
    "Probe documents dropped because the backlog was full (the oldest goes first).",
    doc="documents dropped because the backlog was full (oldest first)")
PROBE_ARCHIVE_BACKLOG = Figure(
    "burstwatch_probe_archive_backlog", "gauge", "probes",
    "Probe documents waiting to be uploaded.",
    doc="documents waiting to be uploaded")
PROBE_ARCHIVE_LAST_SUCCESS_TIMESTAMP_SECONDS = Figure(
    "burstwatch_probe_archive_last_success_timestamp_seconds", "gauge", "probes",
    "Unix time of the last successful upload (0 before the first).",
    doc="time of the last successful upload")
