"""DescribeInstanceTypes for this instance's type through boto3, cached under state_dir, never fatal."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

from agent import aws
from agent.writers.statefile import JsonStore

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

log = logging.getLogger(__name__)

CACHE_FORMAT = "burstwatch-instance-type/1"
# An instance's type only changes across a stop/start, and AWS rarely revises a type's bandwidth:
# a week-old answer is still good, and one call per week per instance costs nothing.
CACHE_MAX_AGE = 7 * 86400.0
# The answer to a type this region does not offer (or that does not exist).
UNKNOWN_TYPE_CODES = frozenset({"InvalidInstanceType", "InvalidParameterValue"})

ClientFactory = Callable[[str], Any]   # region -> boto3 EC2 client
# One call at start-up, on the start-up path: two attempts with short timeouts bound a blocked endpoint
# (private subnet without NAT or VPC endpoint) to a few seconds; the cache makes it once a week.
API_ATTEMPTS = 2
API_CONNECT_TIMEOUT = 2.0
API_READ_TIMEOUT = 5.0


class ApiLookup(NamedTuple):
    """What the API lookup produced and why: `status` is fresh, cached, stale_cache, denied, unreachable,
    no_credentials, unknown_type or error; `info` (one InstanceTypeInfo as parse_describe_instance_types
    returns it; models.catalogue.entry_from_describe reads it) is None unless status is one of the first
    three."""

    info: Optional[dict[str, Any]]
    status: str
    detail: str


def client_factory(endpoint_url: Optional[str] = None) -> ClientFactory:
    """region -> EC2 client through agent.aws (botocore standard retry mode), for the lookup below."""
    def make(region: str) -> Any:
        return aws.client("ec2", region, endpoint_url, max_attempts=API_ATTEMPTS,
                          connect_timeout=API_CONNECT_TIMEOUT, read_timeout=API_READ_TIMEOUT)

    return make


# -- raw read and pure parse -------------------------------------------------------------------------

def read_describe_instance_types(client: Any, instance_type: str) -> str:
    """The raw XML of DescribeInstanceTypes for one type.

    botocore parses only the members its model knows, and Debian 12's botocore 1.29 model has no
    NetworkCards[].BaselineBandwidthInGbps / PeakBandwidthInGbps / DefaultEnaQueueCountPerInterface
    (botocore/data/ec2/2016-11-15/service-2.json, NetworkCardInfo): the figures are on the wire but
    dropped. So the body is taken as it arrived (botocore's after-call event) and parsed here."""
    captured: list[bytes] = []

    def grab(http_response: Any = None, **_kw: Any) -> None:
        if http_response is not None:
            captured.append(http_response.content)

    event = "after-call.ec2.DescribeInstanceTypes"
    uid = f"burstwatch-raw-{id(captured)}"
    client.meta.events.register(event, grab, unique_id=uid)
    try:
        client.describe_instance_types(InstanceTypes=[instance_type])
    finally:
        client.meta.events.unregister(event, unique_id=uid)
    if not captured:
        raise RuntimeError("DescribeInstanceTypes returned no body")
    return captured[-1].decode("utf-8")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(el: Optional[ET.Element], name: str) -> Optional[ET.Element]:
    if el is None:
        return None
    for c in el:
        if _local(c.tag) == name:
            return c
    return None


def _text(el: Optional[ET.Element], name: str) -> Optional[str]:
    c = _child(el, name)
    return c.text.strip() if c is not None and c.text is not None else None


def _items(el: Optional[ET.Element], name: str) -> list[ET.Element]:
    c = _child(el, name)
    return [i for i in c if _local(i.tag) == "item"] if c is not None else []


def _as_int(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and re.fullmatch(r"-?\d+", text) else None


def _as_float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _as_bool(text: Optional[str]) -> Optional[bool]:
    # AWS writes "true"/"false"; moto writes Python's "True"/"False" (which botocore reads as false).
    return None if text is None else text.lower() == "true"


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def parse_describe_instance_types(xml_text: str) -> list[dict[str, Any]]:
    """InstanceTypeInfo dicts in the API's PascalCase shape (the fields burstwatch uses) from the XML."""
    # Imported here: the parse runs once a week in a forked child, and xml.etree (~0.3 MiB) need not stay
    # resident in the daemon.
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml_text)
    out = []
    for item in _items(root, "instanceTypeSet"):
        net = _child(item, "networkInfo")
        cards = [_drop_none({
            "NetworkCardIndex": _as_int(_text(c, "networkCardIndex")),
            "NetworkPerformance": _text(c, "networkPerformance"),
            "MaximumNetworkInterfaces": _as_int(_text(c, "maximumNetworkInterfaces")),
            "BaselineBandwidthInGbps": _as_float(_text(c, "baselineBandwidthInGbps")),
            "PeakBandwidthInGbps": _as_float(_text(c, "peakBandwidthInGbps")),
            "DefaultEnaQueueCountPerInterface": _as_int(_text(c, "defaultEnaQueueCountPerInterface")),
        }) for c in _items(net, "networkCards")]
        vcpus = _as_int(_text(_child(item, "vCpuInfo"), "defaultVCpus"))
        out.append({
            "InstanceType": _text(item, "instanceType"),
            "VCpuInfo": _drop_none({"DefaultVCpus": vcpus}),
            "NetworkInfo": _drop_none({
                "NetworkPerformance": _text(net, "networkPerformance"),
                "EnaSupport": _text(net, "enaSupport"),
                "EnaSrdSupported": _as_bool(_text(net, "enaSrdSupported")),
                "MaximumNetworkCards": _as_int(_text(net, "maximumNetworkCards")),
                "DefaultNetworkCardIndex": _as_int(_text(net, "defaultNetworkCardIndex")),
                "NetworkCards": cards,
            }),
        })
    return out


# -- lookup with cache and fallbacks -----------------------------------------------------------------

def info_problem(info: Any) -> Optional[str]:
    """Why `info` is not an InstanceTypeInfo in parse_describe_instance_types' shape (a cache file edited or
    written by another version), or None."""
    if not isinstance(info, dict) or not isinstance(info.get("InstanceType"), str):
        return "no InstanceType"
    for key in ("VCpuInfo", "NetworkInfo"):
        if not isinstance(info.get(key, {}), dict):
            return f"{key} is not an object"
    cards = info.get("NetworkInfo", {}).get("NetworkCards", [])
    if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
        return "NetworkCards is not a list of objects"
    return None


def failure_status(exc: BaseException) -> tuple[str, str]:
    """(status, detail) for a failed DescribeInstanceTypes call, from the shared classifier."""
    err = aws.classify(exc)
    if err.code in UNKNOWN_TYPE_CODES:
        return "unknown_type", f"{err.code}: {exc}"
    if err.kind == "credentials":
        if err.code:  # refused: the role may not call it (EC2 says UnauthorizedOperation)
            return "denied", f"{err.code}: ec2:DescribeInstanceTypes not allowed for this instance's role"
        return "no_credentials", str(exc)
    if err.kind == "network":  # refused, DNS, connect/read timeouts
        return "unreachable", str(exc)
    if err.kind == "config":
        return "error", str(exc)
    return "error", f"{err.code or type(exc).__name__}: {exc}"


def cache_path(state_dir: str, instance_type: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", instance_type)
    return Path(state_dir) / f"instance-type-{safe}.json"


def lookup_instance_type(instance_type: str, region: str, state_dir: str, client_factory: ClientFactory,
                         max_age: float = CACHE_MAX_AGE, now: Callable[[], float] = time.time) -> ApiLookup:
    """This type's DescribeInstanceTypes InstanceTypeInfo: a fresh cache, else the API (then cached), else a
    stale cache; never raises. `info` is None when the caller should use the bundled catalogue."""
    store = JsonStore(cache_path(state_dir, instance_type), CACHE_FORMAT)
    cached: Optional[dict[str, Any]] = None
    try:
        cached = store.load(lambda d: info_problem(d.get("info")) if d.get("instance_type") == instance_type
                            else "not this type's entry")
    except Exception as exc:  # an unreadable cache is only a missed shortcut
        log.warning("instance type cache for %s unreadable: %s", instance_type, exc)
    age = now() - float(cached.get("fetched", 0)) if cached else None
    if cached and age is not None and 0 <= age < max_age:
        return ApiLookup(cached["info"], "cached", f"DescribeInstanceTypes answer cached {age / 3600:.1f} h ago")

    try:
        client = client_factory(region)
        infos = parse_describe_instance_types(read_describe_instance_types(client, instance_type))
        info = next((i for i in infos if i.get("InstanceType") == instance_type), None)
        if info is None:
            raise LookupError(f"DescribeInstanceTypes has no {instance_type}")
    except Exception as exc:
        status, detail = ("unknown_type", str(exc)) if isinstance(exc, LookupError) else failure_status(exc)
        if cached:
            return ApiLookup(cached["info"], "stale_cache",
                             f"{status}: {detail}; using the answer cached {(age or 0) / 3600:.1f} h ago")
        return ApiLookup(None, status, detail)

    store.save({"instance_type": instance_type, "region": region, "fetched": now(), "info": info})
    return ApiLookup(info, "fresh", f"DescribeInstanceTypes in {region}")
