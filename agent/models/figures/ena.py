"""ENA driver counters and the checks' verdicts and evidence (docs/metrics.md, "ENA driver counters and checks")."""

from __future__ import annotations

from agent.models.figures.schema import Figure, PerChecks, count_status

ENA_ALLOWANCE_EXCEEDED_TOTAL = Figure(
    "burstwatch_ena_allowance_exceeded_total", "counter", "ena",
    "Packets queued or dropped because the instance exceeded an allowance (ENA ethtool *_allowance_exceeded), by "
    "kind: bw_in, bw_out (aggregate bandwidth), pps, conntrack (new connections), linklocal (DNS/IMDS/NTP). "
    "Accounted across driver resets.",
    labels=("interface", "allowance"),
    doc="packets queued or dropped for exceeding an allowance: `allowance` `bw_in`, `bw_out`, `pps`, `conntrack`, "
        "`linklocal`; safe across driver resets; absent on drivers without the counters (< 2.2.10)")
ENA_CONNTRACK_ALLOWANCE_AVAILABLE = Figure(
    "burstwatch_ena_conntrack_allowance_available", "gauge", "ena",
    "Tracked connections the instance can still open before reaching its allowance (ENA "
    "conntrack_allowance_available).",
    labels=("interface",),
    doc="tracked connections still available (Nitro, driver ≥ 2.8.1 with the device capability)")
ENA_SRD_MODE = Figure(
    "burstwatch_ena_srd_mode", "gauge", "ena",
    "ENA Express mode bitmap (ena_srd_mode): bit 0 enabled, bit 1 UDP, bit 2 UDP ordering bypass.",
    labels=("interface",),
    doc="ENA Express mode bitmap (bit0 on, bit1 UDP, bit2 UDP ordering bypass)")
ENA_SRD_ENABLED = Figure(
    "burstwatch_ena_srd_enabled", "gauge", "ena",
    "1 when ENA Express is on (ena_srd_mode bit 0).",
    labels=("interface",),
    doc="1 when ENA Express is on")
ENA_SRD_RESOURCE_UTILIZATION_RATIO = Figure(
    "burstwatch_ena_srd_resource_utilization_ratio", "gauge", "ena",
    "ENA Express resource utilization (0..1; the driver reports a percentage).",
    labels=("interface",),
    doc="ENA Express resource utilization (0..1)")
ENA_SRD_TX_PACKETS_TOTAL = Figure(
    "burstwatch_ena_srd_tx_packets_total", "counter", "ena",
    "Packets sent over ENA Express (SRD).",
    labels=("interface",),
    doc="packets sent over ENA Express")
ENA_SRD_ELIGIBLE_TX_PACKETS_TOTAL = Figure(
    "burstwatch_ena_srd_eligible_tx_packets_total", "counter", "ena",
    "Packets that were eligible for ENA Express.",
    labels=("interface",),
    doc="packets eligible for ENA Express")
ENA_SRD_RX_PACKETS_TOTAL = Figure(
    "burstwatch_ena_srd_rx_packets_total", "counter", "ena",
    "Packets received over ENA Express (SRD).",
    labels=("interface",),
    doc="packets received over ENA Express")
ENA_STAT_RESETS_TOTAL = Figure(
    "burstwatch_ena_stat_resets_total", "counter", "ena",
    "Decreases of ENA counters handled as a reset (driver reset, interface re-created).",
    labels=("interface",),
    doc="ENA counter decreases handled as resets")
DRIVER_INFO = Figure(
    "burstwatch_driver_info", "gauge", "ena",
    "The interface's driver and version (ethtool -i); in_tree tells the kernel's ena from the out-of-tree 2.x.yg "
    "one.",
    labels=("interface", "driver", "version", "in_tree"),
    doc="`ethtool -i`: `in_tree` is `true` (kernel release as version), `false` (out-of-tree `2.x.yg`) or `unknown`")
ETHTOOL_STAT = Figure(
    "burstwatch_ethtool_stat", "gauge", "ena",
    "Raw value of an ethtool statistic listed in [metrics] ethtool_include (kind unknown: use rate() only on "
    "counters).",
    labels=("interface", "stat"),
    doc="raw value of each statistic listed in `[metrics] ethtool_include`")
CHECK_STATUS = Figure(
    "burstwatch_check_status", "gauge", "ena",
    "1 for the latest verdict (status: ok, warn, fail, skip) per check and interface (the peer for path_mtu, \"\" "
    "for instance-wide checks), 0 for the other statuses.",
    labels=("check", "interface", "status"),
    doc="1 for the check's current verdict (`ok`, `warn`, `fail`, `skip`), 0 for the other three; `interface` is "
        "the peer for `path_mtu` and empty for `imds`",
    cloudwatch=(
        PerChecks("FailedChecks", "Count", "Maximum", True,
                  "checks (ENA, driver, queues, MTU) whose verdict is `fail`; details in `burstwatch check`",
                  count_status("fail")),
        PerChecks("WarnedChecks", "Count", "Maximum", False,
                  "checks whose verdict is `warn`",
                  count_status("warn")),
    ))
CHECK_LAST_RUN_TIMESTAMP_SECONDS = Figure(
    "burstwatch_check_last_run_timestamp_seconds", "gauge", "ena",
    "Unix time the check last ran.",
    labels=("check",),
    doc="when the check last ran")
CHECK_DURATION_SECONDS = Figure(
    "burstwatch_check_duration_seconds", "gauge", "ena",
    "How long the check's last run took.",
    labels=("check",),
    doc="how long its last run took")
CHECK_RUNS_TOTAL = Figure(
    "burstwatch_check_runs_total", "counter", "ena",
    "Check rounds completed.",
    doc="check rounds completed (the daemon runs them in a child process: every 300 s, path MTU every 3600 s)")
INTERFACE_MTU_BYTES = Figure(
    "burstwatch_interface_mtu_bytes", "gauge", "ena",
    "Interface MTU, as the mtu check saw it.",
    labels=("interface",),
    doc="interface MTU")
PATH_MTU_BYTES = Figure(
    "burstwatch_path_mtu_bytes", "gauge", "ena",
    "Largest packet that reaches the peer with DF set (measured by the path_mtu check).",
    labels=("peer",),
    doc="measured path MTU to a configured peer")
PATH_MTU_BLACK_HOLE = Figure(
    "burstwatch_path_mtu_black_hole", "gauge", "ena",
    "1 when larger packets to the peer vanish without ICMP \"fragmentation needed\" (an MTU black hole).",
    labels=("peer",),
    doc="1 when large packets vanish without an ICMP answer (an MTU black hole)")
INTERFACE_QUEUES = Figure(
    "burstwatch_interface_queues", "gauge", "ena",
    "ENA queues: in_use, the driver's maximum, and the count expected for this type and vCPUs.",
    labels=("interface", "kind"),
    doc="ENA queue counts: `kind` `in_use`, `maximum`, `expected`")
INTERFACE_RING_ENTRIES = Figure(
    "burstwatch_interface_ring_entries", "gauge", "ena",
    "Descriptor ring sizes: current and maximum.",
    labels=("interface", "ring", "setting"),
    doc="ring sizes, `setting` `current` / `maximum`")
