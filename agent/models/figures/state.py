"""Writes under state_dir and the spools (docs/metrics.md, "State directory and spools")."""

from __future__ import annotations

from agent.models.figures.schema import Figure

STATE_WRITE_ERRORS_TOTAL = Figure(
    "burstwatch_state_write_errors_total", "counter", "state",
    "Writes under state_dir that failed (read-only or full filesystem, permissions), by file: a state file's name "
    "or spool/<name>. The daemon keeps running; the first error of a file is logged.",
    labels=("file",),
    doc="writes under `state_dir` that failed (full or read-only filesystem, permissions), by file: `credits.json`, "
        "`learned-buckets.json`, `spool/cloudwatch`, `spool/probe-archive`, … The daemon keeps sampling; the first "
        "failure of each file is logged at ERROR, the rest only counted until a write works again. Alert on "
        "`increase(...[15m]) > 0`")
SPOOL_RECORDS = Figure(
    "burstwatch_spool_records", "gauge", "state",
    "Records waiting in the spool on disk (CloudWatch: one per flush; probe archive: one per object).",
    labels=("spool",),
    doc="records waiting on disk: CloudWatch one per flush, the probe archive one per document (only with a spool "
        "in use)")
SPOOL_BYTES = Figure(
    "burstwatch_spool_bytes", "gauge", "state",
    "Bytes the spool holds on disk.",
    labels=("spool",),
    doc="bytes the spool holds on disk")
SPOOL_DROPPED_RECORDS_TOTAL = Figure(
    "burstwatch_spool_dropped_records_total", "counter", "state",
    "Spool records given up: full (the oldest, to stay within the spool's bounds), corrupt (damaged file found at "
    "start).",
    labels=("spool", "reason"),
    doc="records given up: `full` (the oldest, to stay within `spool_max_*`), `corrupt` (a damaged file found at "
        "start)")
SPOOL_REPLAYED_RECORDS_TOTAL = Figure(
    "burstwatch_spool_replayed_records_total", "counter", "state",
    "Records an earlier run left in the spool, found at start and sent first.",
    labels=("spool",),
    doc="records an earlier run left, found at start and sent first")
