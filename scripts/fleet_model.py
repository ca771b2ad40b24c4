"""Every AWS request one agent makes, per hour, from a config (the code's defaults, or the fleet run's lab
config), and each API's default quota with where it is published: the model behind docs/fleet.md's tables
(scripts/gen_fleet_arithmetic.py), checked against a real fleet by tests/e2e/test_fleet_run.py."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.checks import INTERVALS  # noqa: E402
from agent.config import Config  # noqa: E402
from agent.models import cw_cost  # noqa: E402
from agent.models.fleet import REPUBLISH_AGE  # noqa: E402
from agent.models.peer_registry import REGISTER_INTERVAL  # noqa: E402
from agent.readers.ec2api import CACHE_MAX_AGE  # noqa: E402

MONTH_HOURS = cw_cost.MONTH_HOURS
EC2_THROTTLING = "https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html"
CW_QUOTAS = "https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/cloudwatch_limits.html"
S3_PERFORMANCE = "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html"
# S3 Standard, us-east-1 (https://aws.amazon.com/s3/pricing/): PUT, COPY, POST, LIST per 1,000; GET per 1,000.
S3_WRITE_LIST_PRICE = 0.005 / 1000
S3_GET_PRICE = 0.0004 / 1000
# Peer discovery's share of EC2's Describe* bucket (the issue's line: the rest is the account's).
DISCOVERY_SHARE = 0.10


@dataclass(frozen=True)
class Quota:
    name: str
    per_second: float
    scope: str
    source: str


# The default quota each API draws on. EC2: each action has its own bucket; a paginated or filtered
# non-mutating call takes a token from a bucket of 100 refilled at 20/s per account and Region ("Request
# token bucket sizes and refill rates"). S3 has no per-account request quota: it serves 3,500 PUT and 5,500
# GET/LIST requests per second per partitioned prefix; the table assumes, at worst, one prefix per API.
EC2_DESCRIBE = Quota("EC2 non-mutating actions: bucket 100, refill 20/s", 20.0, "per action, account and Region",
                     EC2_THROTTLING)
QUOTAS = {
    "monitoring:PutMetricData": Quota("PutMetricData", cw_cost.PUT_METRIC_DATA_TPS, "per account and Region",
                                      CW_QUOTAS),
    "ec2:DescribeInstances": EC2_DESCRIBE,
    "ec2:DescribeTags": EC2_DESCRIBE,
    "ec2:DescribeInstanceTypes": EC2_DESCRIBE,
    "s3:PUT": Quota("S3 PUT/COPY/POST/DELETE", 3500.0, "per partitioned prefix", S3_PERFORMANCE),
    "s3:GET": Quota("S3 GET/HEAD (LIST counted here)", 5500.0, "per partitioned prefix", S3_PERFORMANCE),
}

# The APIs, named as the counting proxy names them (tests/support/counting_proxy.py), in the tables' order.
APIS = ("s3:ListObjectsV2 agents/", "s3:PutObject agents/", "s3:ListObjectsV2 learned/", "s3:GetObject learned/",
        "s3:PutObject learned/", "s3:ListObjectsV2 access-check/", "s3:PutObject access-check/",
        "s3:GetObject access-check/", "monitoring:PutMetricData", "ec2:DescribeInstances", "ec2:DescribeTags",
        "ec2:DescribeInstanceTypes")


def quota_of(api: str) -> Quota:
    if api.startswith("s3:"):
        return QUOTAS["s3:PUT" if api.startswith("s3:Put") else "s3:GET"]
    return QUOTAS[api]


def lifetime_hours() -> float:
    return cw_cost.DEFAULT_LIFETIME_HOURS


def learned_gets_per_hour(cfg: Config, n: int, puts_per_hour: float) -> float:
    """GETs of learned/ objects per agent-hour: the partition's new objects that land in the agent's window
    (all n agents one type; the partition holds what max_age_days keeps; docs/fleet.md, "Reading")."""
    f = cfg.fleet
    new = n * puts_per_hour
    held = new * f.max_age_days * 24
    return new * min(1.0, f.max_objects / held) if held else 0.0


def calls_per_agent_hour(cfg: Config, n: int = 1000, learned_puts_per_hour: Optional[float] = None,
                         groups: int = 1) -> dict[str, float]:
    """Requests per agent-hour by API for a fleet of `n` agents running `cfg`. Steady state: the calls made
    once per start (DescribeInstanceTypes, DescribeTags, the first registration) count once per instance
    lifetime (cw_cost.DEFAULT_LIFETIME_HOURS). `learned_puts_per_hour`: learned/ objects an agent publishes
    (default: a steady value republished every REPUBLISH_AGE)."""
    p, f, cw = cfg.probe, cfg.fleet, cfg.cloudwatch
    out = dict.fromkeys(APIS, 0.0)
    life = lifetime_hours()
    if p.registry:
        # One LIST per discovery (a zone's partition larger than the window: a random window, a second LIST
        # only when it wraps); with cross-AZ probes, the zones' LIST and another zone's window too.
        out["s3:ListObjectsV2 agents/"] = 3600.0 / p.discover_interval * (3 if p.cross_az_share > 0 else 1)
        out["s3:PutObject agents/"] = max(3600.0 / REGISTER_INTERVAL, 1 / life)
    elif p.discover_tag:
        out["ec2:DescribeInstances"] = 3600.0 / p.discover_interval
    if f.enabled:
        puts = 3600.0 / REPUBLISH_AGE if learned_puts_per_hour is None else learned_puts_per_hour
        out["s3:PutObject learned/"] = puts
        out["s3:ListObjectsV2 learned/"] = 3600.0 / f.refresh_interval
        out["s3:GetObject learned/"] = learned_gets_per_hour(cfg, n, puts)
        check = 3600.0 / INTERVALS["fleet_access"] + 1 / life      # its cadence, and once at start
        for api in ("s3:ListObjectsV2 access-check/", "s3:PutObject access-check/", "s3:GetObject access-check/"):
            out[api] = check
    if cw.enabled:
        c = cw_cost.cloudwatch_cost(n, groups, cw, peers=peers_per_hour(cfg), free_tier=False)
        out["monitoring:PutMetricData"] = c.calls / n / MONTH_HOURS
        out["ec2:DescribeTags"] = c.describe_tags_per_second / n * 3600
    if cfg.instance.describe_api:
        out["ec2:DescribeInstanceTypes"] = max(3600.0 / CACHE_MAX_AGE, 1 / life)
    return out


def peers_per_hour(cfg: Config) -> int:
    """Peers one agent probes in an hour (the per-peer CloudWatch series it writes)."""
    if not (cfg.probe.peers or cfg.probe.discover_tag or cfg.probe.registry):
        return 0
    return int(round(3600.0 / cfg.probe.interval * cfg.probe.peers_per_round))


def s3_dollars_per_hour(calls: dict[str, float]) -> float:
    """S3 request dollars per agent-hour: GETs at the GET price, PUTs and LISTs at the write/LIST price."""
    total = 0.0
    for api, n in calls.items():
        if api.startswith("s3:GetObject"):
            total += n * S3_GET_PRICE
        elif api.startswith("s3:"):
            total += n * S3_WRITE_LIST_PRICE
    return total


def fleet_config(**probe: object) -> Config:
    """The fleet the tables describe: the defaults with CloudWatch, the fleet bucket and probing through the
    registry on (`probe` overrides [probe] keys)."""
    import dataclasses

    base = Config()
    return dataclasses.replace(
        base, cloudwatch=dataclasses.replace(base.cloudwatch, enabled=True),
        fleet=dataclasses.replace(base.fleet, enabled=True, bucket="BUCKET"),
        probe=dataclasses.replace(base.probe, **{"registry": True, **probe}))
