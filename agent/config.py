"""burstwatch's TOML configuration: every key, its default, range, check and doc, as dataclasses; load it.

Values are checked in agent/config_checks.py; TOML is read into these dataclasses by agent/config_loader.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from agent.config_allowances import AllowancesConfig
from agent.config_checks import (
    Validator,
    check_abs_path,
    check_aggregation_dimensions,
    check_bcrypt_users,
    check_cidrs,
    check_client_auth_type,
    check_directions,
    check_hostport,
    check_log_level,
    check_peers,
    check_per_instance,
    check_shaping,
    check_tag,
    check_tls_version,
    check_url,
)
from agent.config_loader import ConfigError, build, describe_fields, read_toml, reload_decisions

DEFAULT_CONFIG_PATH = "/etc/burstwatch/burstwatch.toml"
DEFAULT_STATE_DIR = "/var/lib/burstwatch"
# 9786 sits in Prometheus' exporter range (9100-9999) and is not used by node, blackbox,
# iperf3, cloudwatch, snmp or any other widely deployed exporter (docs/configuration.md).
DEFAULT_METRICS_PORT = 9786
# iperf3's own default port, so a stock `iperf3 -c HOST` reaches the responder.
DEFAULT_RESPONDER_PORT = 5201
# [cloudwatch] flush_interval's default at standard resolution (see the key).
DEFAULT_FLUSH_INTERVAL = 900.0
DEFAULT_METRICS_SOCKET = "/run/burstwatch/metrics.sock"   # in the unit's RuntimeDirectory=burstwatch



def _opt(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
         check: Validator | None = None, factory: Callable[[], Any] | None = None, restart: bool = False) -> Any:
    """A config key: default, one-line doc for docs/configuration.md, range and custom check. `restart`:
    a new value on SIGHUP waits for the next restart (on a section: every key in it); without it a reload
    applies the key (the one place that decides: agent/config_loader.py, "reloads")."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "check": check, "restart": restart}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)



@dataclass(frozen=True)
class MetricsConfig:
    listen: str = _opt(f"0.0.0.0:{DEFAULT_METRICS_PORT}", "host:port of the /metrics endpoint",
                       check=check_hostport, restart=True)
    # The file mode is the access control (docs/security.md); sun_path holds 107 bytes and a NUL (unix(7)).
    socket: str = _opt(DEFAULT_METRICS_SOCKET, "local Unix socket serving /metrics without TLS or basic auth, for "
                       "`burstwatch status`; mode 0660 (\"\": none). The default's directory comes from "
                       "systemd's RuntimeDirectory= (without it, no socket); another path's is made 0750",
                       check=lambda v: f"{v!r} is longer than the 107 bytes of a Unix socket path"
                       if len(v.encode()) > 107 else None, restart=True)
    ethtool_include: list[str] = _opt(None, "extra ethtool statistic names to export "
                                      "(beyond the ENA allowance and ENA Express ones)", factory=list)
    header_timeout: float = _opt(10.0, "seconds a client has to finish the TLS handshake and send its request "
                                 "headers; also how long a kept-alive connection may idle", lo=0.1, hi=60.0)
    max_connections: int = _opt(256, "open connections at most; past it the one that has waited longest "
                                "without sending a request is closed", lo=4, hi=4096)
    tls_cert_file: Optional[str] = _opt(None, "PEM certificate (chain) to serve HTTPS with, absolute path "
                                        "(exporter-toolkit cert_file; default: plain HTTP)", check=check_abs_path)
    tls_key_file: Optional[str] = _opt(None, "PEM private key of tls_cert_file, absolute path",
                                       check=check_abs_path)
    tls_client_ca_file: Optional[str] = _opt(None, "PEM CA certificates that client certificates must chain "
                                             "to, absolute path", check=check_abs_path)
    tls_client_auth_type: Optional[str] = _opt(None, "NoClientCert, VerifyClientCertIfGiven or "
                                               "RequireAndVerifyClientCert (default: the last when "
                                               "tls_client_ca_file is set, else NoClientCert)",
                                               check=check_client_auth_type)
    tls_min_version: str = _opt("TLS12", "oldest TLS version accepted: TLS12 or TLS13", check=check_tls_version)
    basic_auth_users: dict[str, str] = _opt(None, "user name = bcrypt hash; when set, every request needs "
                                            "one of them (exporter-toolkit basic_auth_users)", factory=dict,
                                            check=check_bcrypt_users)

    @property
    def effective_client_auth_type(self) -> str:
        if self.tls_client_auth_type is not None:
            return self.tls_client_auth_type
        return "RequireAndVerifyClientCert" if self.tls_client_ca_file else "NoClientCert"

    def cross_check(self) -> str | None:
        """A problem between this table's keys, as a message naming the key; None when they agree."""
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            missing, given = ("tls_key_file", "tls_cert_file") if self.tls_cert_file else \
                ("tls_cert_file", "tls_key_file")
            return f"key 'metrics.{missing}' is required when metrics.{given} is set"
        if not self.tls_cert_file:
            for key in ("tls_client_ca_file", "tls_client_auth_type"):
                if getattr(self, key) is not None:
                    return f"key 'metrics.{key}' needs TLS: set metrics.tls_cert_file and metrics.tls_key_file"
            return None
        auth = self.effective_client_auth_type
        if auth != "NoClientCert" and not self.tls_client_ca_file:
            return f"key 'metrics.tls_client_auth_type' = {auth!r} needs metrics.tls_client_ca_file"
        if auth == "NoClientCert" and self.tls_client_ca_file:
            return ("key 'metrics.tls_client_ca_file' is set but metrics.tls_client_auth_type is 'NoClientCert', "
                    "which ignores it")
        return None


@dataclass(frozen=True)
class BandwidthConfig:
    baseline_gbps: Optional[float] = _opt(None, "baseline bandwidth per direction, Gbit/s "
                                          "(overrides the catalogue)", lo=0.001, hi=3200.0)
    peak_gbps: Optional[float] = _opt(None, "peak (burst) bandwidth per direction, Gbit/s",
                                      lo=0.001, hi=3200.0)
    burst_bucket_gbit: Optional[float] = _opt(None, "burst credit bucket per direction, Gbit "
                                              "(1 Gbit = 1 Gbit/s for 1 s)", lo=0.0, hi=10_000_000.0)


@dataclass(frozen=True)
class InstanceConfig:
    type: Optional[str] = _opt(None, "instance type, e.g. m5.large (overrides IMDS)")
    # Both are used once, by discovery at start (and the endpoint by the CloudWatch publisher built then).
    describe_api: bool = _opt(True, "refresh this type's bandwidth with ec2:DescribeInstanceTypes when allowed "
                              "(cached a week under state_dir)", restart=True)
    ec2_endpoint_url: Optional[str] = _opt(None, "EC2 API endpoint (default: AWS; a VPC endpoint or a test server)",
                                           check=check_url, restart=True)
    bandwidth: BandwidthConfig = _opt(None, "per-direction bandwidth overrides", factory=BandwidthConfig)


@dataclass(frozen=True)
class ImdsConfig:
    enabled: bool = _opt(True, "ask the instance metadata service who this instance is")
    endpoint: str = _opt("http://169.254.169.254", "IMDS base URL (IPv6: http://[fd00:ec2::254])",
                         check=check_url)
    timeout: float = _opt(1.0, "connect/read timeout per IMDS request, seconds", lo=0.05, hi=30.0)
    retries: int = _opt(2, "retries per IMDS request after the first attempt", lo=0, hi=10)
    allow_imdsv1: bool = _opt(False, "fall back to IMDSv1 when no token can be had")


@dataclass(frozen=True)
class CreditsConfig:
    shaping_source: str = _opt("auto", "where the shaping signal comes from: auto (ethtool, else tc), "
                               "ethtool, tc or none", check=check_shaping, restart=True)
    tc_in_interface: Optional[str] = _opt(None, "interface whose root qdisc shapes inbound traffic "
                                          "(an IFB device), for shaping_source = tc", restart=True)
    tc_out_interface: Optional[str] = _opt(None, "interface whose root qdisc shapes outbound traffic "
                                           "(default: the monitored interface)", restart=True)
    learn: bool = _opt(True, "correct the bucket size from observed exhaustions")
    trust_configured_bucket: bool = _opt(True, "keep instance.bandwidth.burst_bucket_gbit fixed; false makes it "
                                         "a starting estimate that learning may correct")
    # The state is also saved whenever the estimate has moved by 1 % of the bucket (agent/sampling/credits.py),
    # so a crash loses at most about that at any time scale; this is the idle heartbeat.
    save_interval: float = _opt(5.0, "longest seconds between state saves; the state is also saved whenever the "
                                "estimate has moved by 1 % of the bucket since the last save (at most once per "
                                "sample)", lo=0.5, hi=3600.0)
    # 60 s: a fifth of the shortest EC2 drain measured; bursty traffic gets four of its own cycles, up to the
    # drain's age (docs/credits.md, "forecast_window default: 60 s", "The window rule").
    forecast_window: float = _opt(60.0, "the shortest window (seconds) the trend forecast "
                                  "(burstwatch_credit_exhaustion_trend_seconds) fits the net spend rate over: "
                                  "steady traffic's; bursty traffic's is four of its own cycles, at most the "
                                  "drain's age and 60 times this (docs/credits.md, \"The window rule\")",
                                  lo=0.5, hi=3600.0)


@dataclass(frozen=True)
class CloudWatchConfig:
    enabled: bool = _opt(False, "publish custom metrics to CloudWatch")
    namespace: str = _opt("Burstwatch", "CloudWatch namespace (must not start with AWS/)",
                          check=lambda v: "must not start with 'AWS/'" if v.startswith("AWS/") else None)
    region: Optional[str] = _opt(None, "AWS region (default: from IMDS)")
    endpoint_url: Optional[str] = _opt(None, "CloudWatch endpoint (default: AWS)", check=check_url)
    period: int = _opt(60, "aggregation period, seconds (below 60 = high resolution)", lo=1, hi=3600)
    # 900 s: at 100,000 instances the steady calls take 111/s of PutMetricData's 500 TPS per account and
    # Region, leaving room for the alarm flushes (docs/cloudwatch.md, "Requests at fleet scale").
    flush_interval: Optional[float] = _opt(None, "seconds between PutMetricData calls in steady state, each "
                                           "instance at its own phase (default: 900 at period >= 60, else "
                                           "max(period, 10)); a period in which an alarm's condition holds on "
                                           "this instance, or stops holding, is sent at once", lo=1.0, hi=3600.0)
    include: list[str] = _opt(None, "metric names to publish beyond the default set", factory=list)
    dimensions: dict[str, str] = _opt(None, "extra dimensions added to every datum", factory=dict)
    aggregation_dimensions: Optional[list[list[str]]] = _opt(
        None, "dimension sets of the metrics every instance publishes to, without InstanceId, as the CloudWatch "
        "agent's: e.g. [[\"AutoScalingGroupName\"], [\"InstanceType\"]]; [[]] is one set for the whole "
        "namespace, [] none (default: the Auto Scaling group when the instance has one, else the instance type)",
        check=check_aggregation_dimensions)
    # 600 s: a person's time to act (docs/alerting.md, "Tuning"); the lab runs at its own time scale.
    alarm_horizon: float = _opt(600.0, "seconds: the credit-exhaustion alarms fire when the sooner forecast is "
                                "under this, and an instance counts as draining", lo=1.0, hi=86400.0)
    per_instance: str = _opt("when_draining", "metrics with the InstanceId dimension: always, when_draining (only "
                             "in the clock hours in which an alarm's condition holds on this instance: credits "
                             "running out within the alarm horizon, low, or shaped) or never",
                             check=check_per_instance)
    backlog: int = _opt(10000, "datapoints kept while CloudWatch is unreachable", lo=0, hi=1_000_000)
    spool: bool = _opt(True, "keep the backlog on disk too (state_dir/spool/cloudwatch), so a restart or a "
                       "crash during an outage loses nothing (replayed in order at start)")
    spool_max_batches: int = _opt(1440, "most flushes kept in the spool, one file each (a day of 60 s "
                                  "periods); the oldest go first", lo=1, hi=1_000_000)
    spool_max_bytes: int = _opt(16 * 2**20, "most bytes the spool keeps on disk; the oldest go first",
                                lo=4096, hi=2**34)

    @property
    def steady_flush_interval(self) -> float:
        """Seconds between steady-state flushes: the key, else 900 s at standard resolution, else
        max(period, 10) (high resolution is asked for to see data soon)."""
        if self.flush_interval is not None:
            return float(self.flush_interval)
        return DEFAULT_FLUSH_INTERVAL if self.period >= 60 else max(float(self.period), 10.0)


def _bytes_or_auto(value: Union[int, str]) -> Optional[str]:
    """A budget is a number of bytes or "auto" (sized to this instance)."""
    return None if isinstance(value, int) or value == "auto" else f"{value!r} is neither bytes nor 'auto'"


@dataclass(frozen=True)
class ResponderConfig:
    enabled: bool = _opt(True, "run the iperf3-compatible probe server inside the daemon")
    listen: str = _opt(f"0.0.0.0:{DEFAULT_RESPONDER_PORT}", "host:port of the responder",
                       check=check_hostport, restart=True)
    allow: Optional[list[str]] = _opt(None, "CIDRs allowed to run tests (default: the VPC's CIDRs "
                                      "from IMDS, else loopback only); an IPv6 entry with a scope id "
                                      "(fe80::%eth0/64) matches only peers on that interface", check=check_cidrs)
    max_pending: int = _opt(64, "connections that have not yet sent their cookie, all sources together; past "
                            "it new connections wait in the listen backlog", lo=1, hi=1024)
    max_pending_per_source: int = _opt(4, "the same for each source address; past it a source's new "
                                       "connections are closed", lo=1, hi=1024)
    max_duration: float = _opt(30.0, "longest test a client may ask for, seconds", lo=1.0, hi=3600.0)
    max_streams: int = _opt(8, "most parallel streams per test (a --bidir test's count both ways)", lo=1, hi=128)
    max_bytes: int = _opt(10 * 1024**3, "most bytes one test may move (each way, for a --bidir test)", lo=1,
                          hi=2**50)
    max_tests_per_hour: int = _opt(12, "tests per source address per hour", lo=1, hi=100000)
    credit_floor: float = _opt(0.5, "refuse a test (as busy) when a bucket it would drain (-R: out, --bidir: "
                               "both, else in) holds less than this fraction, or would after the test's expected bytes "
                               "(the rule and default of [probe] credit_floor)", lo=0.0, hi=1.0)
    # "auto" sizes the budget to this instance (agent/models/serving_budget.py): a share of its own hourly
    # refill, so it follows the profile (a reload, the fleet's consensus) and a large size is not held to a
    # small one's figure (docs/probes.md, "Credit guard").
    hourly_budget_bytes: Union[int, str] = _opt("auto", "most bytes served per direction in any sliding hour, "
                                                "all sources together; past it tests are refused as busy (0: "
                                                "serve none). auto: hourly_budget_share of this size's hourly "
                                                "refill, baseline x 3600 s (docs/probes.md)", lo=0, hi=2**50,
                                                check=_bytes_or_auto)
    hourly_budget_per_source_bytes: Union[int, str] = _opt("auto", "the same budget for each source address "
                                                           "(auto: 3/4 of the total budget in force)", lo=0,
                                                           hi=2**50, check=_bytes_or_auto)
    # Half of the 2 % cost line of docs/probe-scheduling.md ("What probes cost"): own probes and served
    # tests together stay on it (agent.models.probe_cost.COST_LINE; tests/models/test_serving_budget.py
    # holds the two together).
    hourly_budget_share: float = _opt(0.01, "the share of this size's hourly refill per direction the auto "
                                      "budget serves (on a size without a burst bucket: of what its link moves "
                                      "in an hour, a fairness limit)", lo=0.0, hi=1.0)


@dataclass(frozen=True)
class ProbeArchiveConfig:
    enabled: bool = _opt(False, "upload each probe's iperf3 JSON, gzipped, to S3 for Athena")
    bucket: Optional[str] = _opt(None, "S3 bucket of the probe archive (required when enabled)")
    prefix: str = _opt("", "key prefix: objects go to <prefix>d=YYYY-MM-DD/<type>-<unix-ts>[-<id>].json.gz")
    region: Optional[str] = _opt(None, "the bucket's region (default: the instance's, from IMDS)")
    endpoint_url: Optional[str] = _opt(None, "S3 endpoint (default: AWS)", check=check_url)
    backlog: int = _opt(500, "probe documents kept in memory while S3 is unreachable (oldest dropped first)",
                        lo=1, hi=100000)
    spool: bool = _opt(True, "keep the backlog on disk too (state_dir/spool/probe-archive), so a restart or a "
                       "crash during an outage loses nothing (replayed in order at start)")
    spool_max_objects: int = _opt(500, "most documents kept in the spool; the oldest go first", lo=1, hi=100000)
    spool_max_bytes: int = _opt(64 * 2**20, "most bytes the spool keeps on disk; the oldest go first",
                                lo=4096, hi=2**34)


@dataclass(frozen=True)
class ProbeConfig:
    peers: list[str] = _opt(None, "peers to probe: host or host:port", factory=list, check=check_peers)
    interval: float = _opt(900.0, "seconds between scheduling rounds", lo=10.0, hi=86400.0)
    peers_per_round: int = _opt(1, "most peers probed per round", lo=1, hi=100)
    duration: float = _opt(5.0, "seconds per probe", lo=1.0, hi=600.0)
    streams: int = _opt(4, "parallel TCP streams per probe", lo=1, hi=128)
    # A probe at the peak spends burst credits (and its peer's); one paced at the baseline checks that the
    # network delivers the baseline without spending any. The default keeps the schedule under 2 % of the
    # hourly refill per direction, prober and responder together (docs/probe-scheduling.md, "What probes cost").
    rate: str = _opt("baseline", "what a probe may send: baseline (paced at this instance's baseline, split "
                     "over the streams, never above a discovered peer's: no burst credits spent; uncapped "
                     "while the baseline is unknown) or peak (as fast as the path allows: spends credits)",
                     check=lambda v: None if v in ("baseline", "peak") else f"{v!r} is not one of baseline, peak")
    credit_floor: float = _opt(0.5, "skip probes when either bucket is below this fraction", lo=0.0, hi=1.0)
    hourly_budget_bytes: int = _opt(50 * 10**9, "most probe bytes in any sliding hour, own probes in both "
                                    "directions (0: no probes), counted at the probe's rate cap; the default "
                                    "fits the default schedule on sizes of up to 10 Gbit/s baseline, and "
                                    "rate = peak on a 10 Gbit/s-peak size: 8 probes x 5 s x 1.25 GB/s",
                                    lo=0, hi=2**50)
    directions: list[str] = _opt(None, "directions probed per peer: out (we send), in (the peer sends, "
                                 "iperf3 -R)", factory=lambda: ["out", "in"], check=check_directions)
    discover_tag: Optional[str] = _opt(None, "EC2 tag KEY or KEY=VALUE: running instances carrying it in this "
                                       "VPC and Availability Zone are probed too (needs ec2:DescribeInstances; "
                                       "one page of 1,000: up to ~7,000 instances per account and Region)",
                                       check=check_tag, restart=True)
    # The fleet's S3 bucket as a registry: no EC2 calls, one LIST per discovery whatever the fleet's size
    # (docs/fleet.md, "Peer discovery").
    registry: bool = _opt(False, "register this agent under the [fleet] bucket's <prefix>agents/az=<zone>/ and "
                          "probe agents found there in the same zone (one S3 LIST per discovery; needs "
                          "fleet.bucket)", restart=True)
    # Each discovery is one DescribeInstances page (or one S3 LIST) per agent, and EC2's Describe* bucket
    # refills at 20/s for the whole account: hourly, +/- 20 %, keeps 7,200 agents within 10 % of it
    # (docs/fleet.md, "Peer discovery"). Lab: 2.
    discover_interval: float = _opt(3600.0, "seconds between peer discoveries (+/- 20 % jitter); lab: 2", lo=1.0,
                                    hi=86400.0, restart=True)
    # A probe measures this instance's own path; crossing an AZ changes the path and costs $0.01/GB each
    # way (docs/probes.md, "Same-AZ peers").
    cross_az_share: float = _opt(0.0, "share of probes sent to discovered peers in other Availability Zones "
                                 "(0: none; each is billed as inter-AZ transfer)", lo=0.0, hi=1.0, restart=True)
    discover_endpoint_url: Optional[str] = _opt(None, "EC2 endpoint for discovery (default: AWS)",
                                                check=check_url, restart=True)
    archive: ProbeArchiveConfig = _opt(None, "", factory=ProbeArchiveConfig, restart=True)


@dataclass(frozen=True)
class FleetConfig:
    """Learned bucket sizes shared through S3 (docs/fleet.md). Every key needs a restart."""

    enabled: bool = _opt(False, "publish the buckets this agent learns to S3 and adopt the fleet's consensus")
    bucket: Optional[str] = _opt(None, "S3 bucket shared by the fleet (required when enabled)")
    prefix: str = _opt("burstwatch/", "key prefix: objects go to <prefix>learned/type=<type>/<instance-id>-"
                       "<unix-ts>.json")
    region: Optional[str] = _opt(None, "the bucket's region (default: the instance's, from IMDS)")
    endpoint_url: Optional[str] = _opt(None, "S3 endpoint (default: AWS)", check=check_url)
    # A bucket is a property of the instance type and changes rarely, if ever; every 3 h bounds a fleet of
    # 100,000 agents to ~0.8 M LIST requests a month each page (docs/fleet.md, "Fleet arithmetic").
    # Lab value: 2 s.
    refresh_interval: float = _opt(10800.0, "seconds between reads of the fleet's learned buckets for this "
                                   "type (also read at start); lab: 2", lo=1.0, hi=7 * 86400.0)
    min_instances: int = _opt(3, "distinct instances that must agree (after outliers are dropped) before "
                              "the fleet's median is adopted", lo=1, hi=1000)
    max_objects: int = _opt(1000, "most object keys listed per read (one LIST page): a random sample of the "
                            "type's partition when it holds more", lo=1, hi=100000)
    max_age_days: float = _opt(90.0, "objects older than this are left out of the consensus", lo=0.001,
                               hi=3650.0)
    # One exhaustion a day per direction is typical for a busy node; at most one object per this interval
    # (the latest value wins) keeps the PUTs per instance bounded. Lab value: 0.
    publish_interval: float = _opt(86400.0, "least seconds between two published objects (the latest learned "
                                   "value waits); lab: 0", lo=0.0, hi=30 * 86400.0)
    spool_max_objects: int = _opt(100, "learned objects kept in state_dir/spool/fleet while S3 is unreachable",
                                  lo=1, hi=100000)


@dataclass(frozen=True)
class Config:
    sample_interval: float = _opt(1.0, "seconds between counter samples", lo=0.1, hi=60.0)
    rate_window: Optional[float] = _opt(None, "seconds of samples the reported rate averages over "
                                        "(default: max(1, sample_interval))", lo=0.1, hi=600.0)
    state_dir: str = _opt(DEFAULT_STATE_DIR, "where credit state and caches are kept", restart=True)
    interfaces: Optional[list[str]] = _opt(None, "interfaces to monitor (default: the instance's ENIs "
                                           "from IMDS, else the default-route interfaces)")
    log_level: str = _opt("info", "debug, info, warning or error (--log-level overrides)",
                          check=check_log_level)
    metrics: MetricsConfig = _opt(None, "", factory=MetricsConfig)
    instance: InstanceConfig = _opt(None, "", factory=InstanceConfig)
    imds: ImdsConfig = _opt(None, "", factory=ImdsConfig, restart=True)
    credits: CreditsConfig = _opt(None, "", factory=CreditsConfig)
    allowances: AllowancesConfig = _opt(None, "", factory=AllowancesConfig)
    cloudwatch: CloudWatchConfig = _opt(None, "", factory=CloudWatchConfig, restart=True)
    responder: ResponderConfig = _opt(None, "", factory=ResponderConfig)
    probe: ProbeConfig = _opt(None, "", factory=ProbeConfig)
    fleet: FleetConfig = _opt(None, "", factory=FleetConfig, restart=True)

    @property
    def effective_rate_window(self) -> float:
        return self.rate_window if self.rate_window is not None else max(1.0, self.sample_interval)

def _cross_check(cfg: Config, where: str) -> None:
    problem = cfg.metrics.cross_check()
    if problem:
        raise ConfigError(f"{where}: {problem}")
    if cfg.probe.archive.enabled and not cfg.probe.archive.bucket:
        raise ConfigError(f"{where}: key 'probe.archive.bucket' is required when probe.archive.enabled = true")
    if cfg.fleet.enabled and not cfg.fleet.bucket:
        raise ConfigError(f"{where}: key 'fleet.bucket' is required when fleet.enabled = true")
    if cfg.probe.registry and not cfg.fleet.bucket:
        raise ConfigError(f"{where}: key 'fleet.bucket' is required when probe.registry = true")
    bw = cfg.instance.bandwidth
    if bw.baseline_gbps is not None and bw.peak_gbps is not None and bw.peak_gbps < bw.baseline_gbps:
        raise ConfigError(f"{where}: key 'instance.bandwidth.peak_gbps' = {bw.peak_gbps!r} is below "
                          f"baseline_gbps = {bw.baseline_gbps!r}")
    if cfg.rate_window is not None and cfg.rate_window < cfg.sample_interval:
        raise ConfigError(f"{where}: key 'rate_window' = {cfg.rate_window!r} is shorter than "
                          f"sample_interval = {cfg.sample_interval!r}")
    if cfg.interfaces is not None and not all(cfg.interfaces):
        raise ConfigError(f"{where}: key 'interfaces' holds an empty interface name")


def parse(text: str, where: str = "<config>") -> Config:
    """Parse TOML text into a validated Config; raises ConfigError naming `where` and the key."""
    cfg: Config = build(Config, read_toml(text, where), "", where)
    _cross_check(cfg, where)
    return cfg


def load(path: str | Path | None) -> Config:
    """Load the config file; a missing file at the default path means all defaults."""
    if path is None:
        path = DEFAULT_CONFIG_PATH
        if not Path(path).exists():
            return Config()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    return parse(text, str(p))


def describe_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(key, type description, default, doc) for every key, in declaration order; docs are tested
    against this list so docs/configuration.md cannot drift from the code."""
    return describe_fields(cls, prefix)


def reload_keys() -> dict[str, bool]:
    """Every key -> True when a change waits for a restart, False when SIGHUP applies it."""
    return reload_decisions(Config)
