"""The S3 registry of agents that probe peers find each other in: key layout, entries, cross-AZ cost (pure)."""

# Why a registry in S3 rather than DescribeInstances: EC2 throttles Describe* per account and Region with
# one token bucket that refills at 20 requests/s (docs/ec2-network-facts.md, "EC2 API request throttling"),
# shared with everything else the account runs; an S3 LIST draws on no EC2 bucket and S3 serves 5,500
# GET/LIST requests/s per prefix (docs/fleet.md, "Peer discovery").

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

REGISTRY_FORMAT = "burstwatch-agent/1"
# An agent rewrites its object this often (a heartbeat: the object's LastModified); an object not
# rewritten for STALE_AFTER belongs to an instance that is gone, and readers skip it (docs/fleet.md,
# "Peer discovery"). A lifecycle rule on agents/ expiring objects after 1 day (S3's shortest) removes them.
REGISTER_INTERVAL = 6 * 3600.0
STALE_AFTER = 2 * REGISTER_INTERVAL + 3600.0
# Keys listed per discovery (one LIST page): far more peers than the schedule visits between two
# discoveries (4 an hour by default), and a small page keeps a LIST quick.
WINDOW_KEYS = 100
# Inter-AZ data transfer in the same Region: $0.01/GB in each direction, so $0.02 per GB that crosses
# (docs/ec2-network-facts.md, "Data transfer between Availability Zones").
CROSS_AZ_DOLLARS_PER_GB = 0.02
MONTH_HOURS = 730.0

_SAFE = re.compile(r"[^A-Za-z0-9.-]")     # "_" separates the key's fields, so it is never inside one
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


@dataclass(frozen=True)
class AgentEntry:
    """One registered agent as a listing shows it: everything discovery needs is in the key, so a
    discovery costs one LIST and no GET."""

    instance_id: str
    host: str
    port: int
    instance_type: Optional[str]
    zone: str
    modified: float                 # the object's LastModified, Unix time (its last heartbeat)


def _safe(text: Optional[str]) -> str:
    return _SAFE.sub("-", text or "") or "unknown"


def _norm_prefix(prefix: str) -> str:
    return prefix + "/" if prefix and not prefix.endswith("/") else prefix


def agents_prefix(prefix: str) -> str:
    """`<prefix>agents/`: every zone's partition sits below it."""
    return f"{_norm_prefix(prefix)}agents/"


def zone_prefix(prefix: str, zone: str) -> str:
    """`<prefix>agents/az=<zone>/`: one zone's partition (the AZ ID when IMDS gives it, which names the
    same physical zone in every account, else the AZ name)."""
    return f"{agents_prefix(prefix)}az={_safe(zone)}/"


def agent_key(prefix: str, zone: str, instance_id: str, host: str, port: int,
              instance_type: Optional[str]) -> str:
    """`<prefix>agents/az=<zone>/<instance-id>_<ipv4>_<port>_<type>.json`."""
    return f"{zone_prefix(prefix, zone)}{_safe(instance_id)}_{host}_{int(port)}_{_safe(instance_type)}.json"


def agent_document(instance_id: str, host: str, port: int, instance_type: Optional[str], zone: str,
                   region: Optional[str], registered_at: float, agent_version: str) -> bytes:
    """The object's body: the key's fields again, for people and Athena (discovery never reads it)."""
    doc: dict[str, Any] = {"format": REGISTRY_FORMAT, "instance_id": instance_id, "host": host, "port": port,
                           "instance_type": instance_type, "zone": zone, "region": region,
                           "registered_at": registered_at, "agent_version": agent_version}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8") + b"\n"


def parse_agent_key(key: str, zone: str, modified: float) -> Optional[AgentEntry]:
    """The entry a listed key names, or None when the key is not one of ours (garbage under the prefix,
    a name that is not `<id>_<ipv4>_<port>_<type>.json`, a port out of range)."""
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".json"):
        return None
    parts = name[:-len(".json")].split("_")
    if len(parts) != 4:
        return None
    iid, host, port_text, itype = parts
    if not iid or not _IPV4.match(host) or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return AgentEntry(iid, host, int(port_text), None if itype == "unknown" else itype, zone, modified)


def fresh(entry: AgentEntry, now: float, stale_after: float = STALE_AFTER) -> bool:
    """The entry's agent rewrote its object recently enough to be alive."""
    return entry.modified >= now - stale_after


# -- what crossing zones costs -------------------------------------------------------------------------------
def cross_az_dollars_per_month(cross_az_share: float, probe_bytes_per_hour: float) -> float:
    """Dollars per instance-month of inter-AZ transfer for a schedule moving `probe_bytes_per_hour` (own
    probes, both directions) with `cross_az_share` of its probes to another zone. The bytes served to
    other agents are billed to them (each agent's own probes count once, at both ends' rate)."""
    return cross_az_share * probe_bytes_per_hour * MONTH_HOURS / 1e9 * CROSS_AZ_DOLLARS_PER_GB
