"""The PPS and connection-tracking allowances, learned and forecast (docs/metrics.md, "Allowances")."""

from __future__ import annotations

from typing import Any, Optional

from agent.models.figures.schema import Figure, PerSample


def _conntrack_in_use_ratio(snap: Any) -> Optional[float]:
    """The sample's share of the conntrack table in use (None before a size is known)."""
    r = getattr(snap, "conntrack", None)
    return r.in_use_ratio if r is not None else None


def _pps_headroom_ratio(snap: Any) -> Optional[float]:
    """The sample's packets per second over the learned ceiling (None before a ceiling is known)."""
    r = getattr(snap, "pps", None)
    return r.headroom_ratio if r is not None else None


CONNTRACK_SIZE_ENTRIES = Figure(
    "burstwatch_conntrack_size_entries", "gauge", "allowances",
    "The connection-tracking allowance (tracked connections), learned: method max_available (the largest "
    "conntrack_allowance_available seen, a lower bound) or exceeded (in use + available when the table was full).",
    labels=("method",),
    doc="the conntrack table's size, learned: `method` `max_available` (a lower bound: the largest level seen) or "
        "`exceeded` (flows in use + available at a moment the table was full); kept in state_dir per instance type")
CONNTRACK_AVAILABLE_ENTRIES = Figure(
    "burstwatch_conntrack_available_entries", "gauge", "allowances",
    "Tracked connections still available to the instance: one ENI's level, the freshest, never a sum (or the "
    "lab's nft limit).",
    doc="`conntrack_allowance_available` of the ENI whose value changed last (until one does, the primary): the "
        "instance's table, counted once (allowances.md, \"Several ENIs, one table\"); Nitro, driver ≥ 2.8.1 with "
        "the device capability; absent otherwise")
CONNTRACK_IN_USE_RATIO = Figure(
    "burstwatch_conntrack_in_use_ratio", "gauge", "allowances",
    "Share of the learned conntrack size in use (0..1).",
    doc="(size - available) / size",
    cloudwatch=(
        # Off by default: one more metric per instance ($0.30 a month each, docs/cloudwatch.md, "Cost"), and
        # the exceeded counter, not this ratio, says drops happen; a fleet with conntrack-heavy hosts includes it.
        PerSample("ConntrackInUseRatio", "None", "Maximum", False,
                  "share of the learned connection-tracking size in use (0..1)", _conntrack_in_use_ratio),
    ))
CONNTRACK_FULL_SECONDS = Figure(
    "burstwatch_conntrack_full_seconds", "gauge", "allowances",
    "Forecast seconds until no tracked connection is available, at the trend over [allowances] window; +Inf when "
    "not filling, 0 when full and dropping.",
    doc="trend forecast of the seconds until `available` reaches 0; `+Inf` when not filling, 0 when full")
CONNTRACK_RUNNING_OUT = Figure(
    "burstwatch_conntrack_running_out", "gauge", "allowances",
    "1 when the table is full within [allowances] horizon at the trend and running_out_share of it is in use.",
    doc="1 when full within `[allowances] horizon` (600 s) and at least `running_out_share` (0.8) in use: the "
        "ConntrackRunningOut condition at the configured thresholds")
CONNTRACK_EXCEEDED_PACKETS_TOTAL = Figure(
    "burstwatch_conntrack_exceeded_packets_total", "counter", "allowances",
    "Packets dropped because no new connection could be tracked (conntrack_allowance_exceeded over the monitored "
    "interfaces, or the lab's nft limiter), since the agent started.",
    doc="`conntrack_allowance_exceeded` summed over the ENIs since the agent started (safe across driver resets)")
CONNTRACK_SIZE_LEARNED_TOTAL = Figure(
    "burstwatch_conntrack_size_learned_total", "counter", "allowances",
    "Moments the conntrack table was seen full and taught its size.",
    doc="moments the table was seen full and taught the size")
CONNTRACK_HOST_FLOWS = Figure(
    "burstwatch_conntrack_host_flows", "gauge", "allowances",
    "This host's connected TCP and UDP flows that can hold a tracked connection (not listeners, closed or "
    "loopback; this network namespace only), at the last read.",
    doc="this host's live TCP/UDP flows (procfs, every `[allowances] flows_interval`): an estimate of the table's "
        "use (containers in other namespaces and forwarded traffic are not seen)")
CONNTRACK_OWNER_FLOWS = Figure(
    "burstwatch_conntrack_owner_flows", "gauge", "allowances",
    "Flows of the busiest (protocol, direction, service port) groups, at most 10: direction out for flows this "
    "host opened (port = the remote one), in for flows to a local listener.",
    labels=("protocol", "direction", "port"),
    doc="who fills the table: the 10 busiest groups of flows by protocol, direction (`out`: opened from here, "
        "`port` the remote port; `in`: to a local listening port)")
PPS_PACKETS_PER_SECOND = Figure(
    "burstwatch_pps_packets_per_second", "gauge", "allowances",
    "Packets per second over the last sample, received plus sent on the monitored interfaces (the PPS allowance "
    "is bidirectional).",
    doc="packets per second, rx + tx over the monitored interfaces, the last sample")
PPS_CEILING_PACKETS_PER_SECOND = Figure(
    "burstwatch_pps_ceiling_packets_per_second", "gauge", "allowances",
    "The PPS allowance, learned from moments pps_allowance_exceeded rose without bandwidth shaping: source "
    "learned, restored (state_dir) or fleet.",
    labels=("source",),
    doc="the PPS ceiling learned from drop episodes bandwidth does not explain: `source` `learned`, `restored` "
        "(state_dir) or `fleet`; absent until learned")
PPS_HEADROOM_RATIO = Figure(
    "burstwatch_pps_headroom_ratio", "gauge", "allowances",
    "Packets per second over the learned PPS ceiling (1 = at the ceiling).",
    doc="packets per second / ceiling: 1 at the ceiling",
    cloudwatch=(
        # Off by default for the same reason as ConntrackInUseRatio; Maximum, as a ceiling is hit at peaks.
        PerSample("PpsHeadroomRatio", "None", "Maximum", False,
                  "packets per second over the learned PPS ceiling (1 = at the ceiling)", _pps_headroom_ratio),
    ))
PPS_NEAR_CEILING = Figure(
    "burstwatch_pps_near_ceiling", "gauge", "allowances",
    "1 when packets per second are at or above [allowances] near_ceiling_ratio of the learned ceiling.",
    doc="1 when at or above `near_ceiling_ratio` (0.9) of the ceiling")
PPS_EXCEEDED_PACKETS_TOTAL = Figure(
    "burstwatch_pps_exceeded_packets_total", "counter", "allowances",
    "Packets queued or dropped for exceeding the PPS allowance (pps_allowance_exceeded over the monitored "
    "interfaces, or the lab's nft limiter), since the agent started.",
    doc="`pps_allowance_exceeded` summed over the ENIs since the agent started")
PPS_CEILING_LEARNED_TOTAL = Figure(
    "burstwatch_pps_ceiling_learned_total", "counter", "allowances",
    "Drop episodes that taught the PPS ceiling.",
    doc="drop episodes (≥ 3 samples, bandwidth not explaining them) that taught the ceiling")
