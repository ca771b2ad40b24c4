"""Interfaces and sampling: counters, rates, collector health (docs/metrics.md, "Interfaces and sampling")."""

from __future__ import annotations

from agent.models.figures.schema import Figure

INTERFACE_BYTES_TOTAL = Figure(
    "burstwatch_interface_bytes_total", "counter", "sampling",
    "Bytes that crossed the interface, by direction; accounted across counter resets and wraps.",
    labels=("interface", "direction"),
    doc="bytes that crossed the interface, accounted across counter resets and 32-bit wraps")
INTERFACE_PACKETS_TOTAL = Figure(
    "burstwatch_interface_packets_total", "counter", "sampling",
    "Packets that crossed the interface.",
    labels=("interface", "direction"),
    doc="packets")
INTERFACE_ERRORS_TOTAL = Figure(
    "burstwatch_interface_errors_total", "counter", "sampling",
    "Receive/transmit errors.",
    labels=("interface", "direction"),
    doc="receive/transmit errors")
INTERFACE_DROPS_TOTAL = Figure(
    "burstwatch_interface_drops_total", "counter", "sampling",
    "Packets dropped by the kernel or driver.",
    labels=("interface", "direction"),
    doc="packets dropped by the kernel or driver")
INTERFACE_RESETS_TOTAL = Figure(
    "burstwatch_interface_resets_total", "counter", "sampling",
    "Counter decreases handled as a reset, 32-bit wrap or interface re-creation.",
    labels=("interface",),
    doc="counter decreases handled as a reset, 32-bit wrap or re-created interface")
INTERFACE_PRESENT = Figure(
    "burstwatch_interface_present", "gauge", "sampling",
    "1 when a monitored interface exists now.",
    labels=("interface",),
    doc="1 for each monitored interface that exists now")
INTERFACE_THROUGHPUT_BYTES_PER_SECOND = Figure(
    "burstwatch_interface_throughput_bytes_per_second", "gauge", "sampling",
    "Per-interface rate over the rate window.",
    labels=("interface", "direction"),
    doc="per-interface rate over `rate_window`")
COLLECTOR_SUCCESS = Figure(
    "burstwatch_collector_success", "gauge", "sampling",
    "1 when the collector's last run succeeded.",
    labels=("collector",),
    doc="1 when the collector's last run succeeded: one per sampling step (`netdev`, `ethtool`, `shaping`, "
        "`credits`, `allowances`)")
COLLECTOR_DURATION_SECONDS = Figure(
    "burstwatch_collector_duration_seconds", "gauge", "sampling",
    "Duration of the collector's last run.",
    labels=("collector",),
    doc="duration of the collector's last run")
SAMPLE_DURATION_SECONDS = Figure(
    "burstwatch_sample_duration_seconds", "gauge", "sampling",
    "Duration of the last sampling step.",
    doc="duration of the last sampling step")
SAMPLES_TOTAL = Figure(
    "burstwatch_samples_total", "counter", "sampling",
    "Sampling steps taken.",
    doc="sampling steps taken")
LAST_SAMPLE_TIMESTAMP_SECONDS = Figure(
    "burstwatch_last_sample_timestamp_seconds", "gauge", "sampling",
    "Unix time of the last sample.",
    doc="Unix time of the last sample (the time the credit forecasts are counted from)")
