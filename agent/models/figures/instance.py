"""The instance: identity, bandwidth profile, IMDS health (docs/metrics.md, "Instance and profile")."""

from __future__ import annotations

from agent.models.figures.schema import Figure, StatusForm

INSTANCE_INFO = Figure(
    "burstwatch_instance_info", "info", "instance",
    "Who this instance is (from IMDS; instance_type may come from [instance] type). Empty labels are unknown.",
    labels=("instance_id", "instance_type", "region", "availability_zone", "availability_zone_id", "on_ec2"),
    doc="identity (IMDS; `instance_type` may come from config); empty label = unknown; on Kubernetes also "
        "`node`, the node's name from the downward API (`BURSTWATCH_NODE_NAME`, docs/kubernetes.md)")
INSTANCE_DISCOVERY_INFO = Figure(
    "burstwatch_instance_discovery_info", "info", "instance",
    "Where discovery got its answers: imds (v2, v1, off, unreachable, disabled, error), instance_type_source "
    "(config, imds, none), type_data_source (api, catalogue, none) and api (fresh, cached, stale_cache, denied, "
    "unreachable, no_credentials, unknown_type, error, skipped).",
    labels=("imds", "instance_type_source", "type_data_source", "api"),
    doc="where each answer came from (e.g. `api=\"fresh\"`, `\"cached\"`, `\"denied\"`, `\"skipped\"`)")
INSTANCE_DISCOVERY_DURATION_SECONDS = Figure(
    "burstwatch_instance_discovery_duration_seconds", "gauge", "instance",
    "How long start-up discovery (IMDS, sysfs, DescribeInstanceTypes) took.",
    doc="how long start-up discovery took")
BANDWIDTH_BASELINE_BYTES_PER_SECOND = Figure(
    "burstwatch_bandwidth_baseline_bytes_per_second", "gauge", "instance",
    "Baseline bandwidth per direction (network card 0); source: config, api, catalogue.",
    labels=("direction", "source"),
    doc="baseline bandwidth (network card 0); `source`: `config`, `api`, `catalogue`; absent when unknown",
    status=(StatusForm("baseline_bytes_per_second"), StatusForm("baseline_source", "source")))
BANDWIDTH_PEAK_BYTES_PER_SECOND = Figure(
    "burstwatch_bandwidth_peak_bytes_per_second", "gauge", "instance",
    "Peak (burst) bandwidth per direction (network card 0); source: config, api, catalogue.",
    labels=("direction", "source"),
    doc="peak bandwidth (network card 0)",
    status=(StatusForm("peak_bytes_per_second"), StatusForm("peak_source", "source")))
BANDWIDTH_BURSTABLE = Figure(
    "burstwatch_bandwidth_burstable", "gauge", "instance",
    "1 when the size bursts above its baseline with a credit bucket; 0 when baseline = peak (never exhausts) or "
    "unknown.",
    labels=("direction",),
    doc="1 when the size bursts with a credit bucket; 0 when baseline = peak (never exhausts) or unknown")
NETWORK_CARD_BASELINE_BYTES_PER_SECOND = Figure(
    "burstwatch_network_card_baseline_bytes_per_second", "gauge", "instance",
    "Baseline bandwidth of each network card per direction, from the type's data (api or catalogue).",
    labels=("network_card", "direction", "source"),
    doc="baseline per network card")
NETWORK_CARD_PEAK_BYTES_PER_SECOND = Figure(
    "burstwatch_network_card_peak_bytes_per_second", "gauge", "instance",
    "Peak bandwidth of each network card per direction, from the type's data (api or catalogue).",
    labels=("network_card", "direction", "source"),
    doc="peak per network card")
INTERFACE_INFO = Figure(
    "burstwatch_interface_info", "info", "instance",
    "Each monitored interface's ENI as IMDS describes it (eni_id, device_index, network_card, mac): join any "
    "interface series with * on (interface) group_left (eni_id). Empty labels are unknown.",
    labels=("interface", "eni_id", "device_index", "network_card", "mac"),
    doc="the ENI behind each interface present in this network namespace (IMDS `interface-id`, "
        "`device-number`, `network-card-index`, `mac`); join with `* on (instance, interface) group_left (eni_id)`; "
        "absent off EC2 and when IMDS is off")
IMDS_REQUESTS_TOTAL = Figure(
    "burstwatch_imds_requests_total", "counter", "instance",
    "IMDS HTTP attempts by request (token, metadata) and result (ok, not_found, unauthorized, forbidden, timeout, "
    "refused, error).",
    labels=("request", "result"),
    doc="IMDS attempts: `request` `token`/`metadata`; `result` `ok`, `not_found`, `unauthorized`, `forbidden`, "
        "`timeout`, `refused`, `error`")
IMDS_UP = Figure(
    "burstwatch_imds_up", "gauge", "instance",
    "1 when the last IMDS request got an answer (200 or 404), else 0.",
    doc="1 when the last IMDS request got an answer; absent when IMDS is off in config")
