"""What checks look at: the config, interfaces, readers and instance facts, read once per run."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from agent import config as configmod
from agent.readers.driver import SysfsDriver, read_sysfs_driver
from agent.readers.ethtool import Channels, DriverInfo, EthtoolReader, Rings
from agent.readers.links import LinkInfo, RouteInfo, RouteLookup, RxCounters
from agent.readers.pmtu import PathMtu
from agent.sampling import NotSupported

log = logging.getLogger(__name__)

COUNTER_WINDOW = 1.0   # seconds between the two counter readings of a one-shot `burstwatch check`


@dataclass(frozen=True)
class InstanceFacts:
    """The instance's type and what the catalogue says about it; every field may be unknown."""

    instance_type: Optional[str] = None
    vcpus: Optional[int] = None                # online vCPUs here (what the driver sizes queues by)
    ena_support: Optional[str] = None          # EnaSupport: unsupported | supported | required
    default_queues: Optional[int] = None       # DefaultEnaQueueCountPerInterface
    ena_srd_supported: Optional[bool] = None   # ENA Express
    on_ec2: Optional[bool] = None              # IMDS answered
    source: str = "none"                       # where the type facts came from: api | catalogue | none
    instance_id: Optional[str] = None          # IMDS identity (names the fleet access check's object)
    region: Optional[str] = None


@dataclass(frozen=True)
class CounterSample:
    """Receive-loss and ethtool counters of one interface at one moment (for "rising" judgements)."""

    time: float
    rx: RxCounters
    ethtool: dict[str, int] = field(default_factory=dict)


@dataclass
class CheckContext:
    """Everything a check may look at. Readers are called through the memoising helpers below, so
    several checks share one `ethtool` read per interface and run."""

    config: configmod.Config
    interfaces: list[str]
    ethtool: EthtoolReader
    links: dict[str, LinkInfo] = field(default_factory=dict)
    routes: list[RouteInfo] = field(default_factory=list)
    instance: InstanceFacts = field(default_factory=InstanceFacts)
    before: dict[str, CounterSample] = field(default_factory=dict)
    after: dict[str, CounterSample] = field(default_factory=dict)
    path_mtu: Optional[Callable[[str], PathMtu]] = None
    route_to: Optional[Callable[[str], Optional[RouteLookup]]] = None
    imds_probe: Optional[Callable[[], Any]] = None      # -> agent.readers.imds.ImdsProbe
    sysfs: str = "/sys"
    _memo: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    def _cached(self, kind: str, ifname: str, read: Callable[[], Any]) -> Any:
        key = (kind, ifname)
        if key not in self._memo:
            try:
                self._memo[key] = read()
            except (NotSupported, OSError) as exc:
                log.debug("interface=%s: %s not available: %s", ifname, kind, exc)
                self._memo[key] = None
        return self._memo[key]

    def stats(self, ifname: str) -> Optional[dict[str, int]]:
        """All ethtool statistics, or None when the device has none (or is gone)."""
        return self._cached("stats", ifname, lambda: self.ethtool.stats(ifname))  # type: ignore[no-any-return]

    def driver(self, ifname: str) -> Optional[DriverInfo]:
        return self._cached("driver", ifname, lambda: self.ethtool.driver(ifname))  # type: ignore[no-any-return]

    def channels(self, ifname: str) -> Optional[Channels]:
        return self._cached("channels", ifname, lambda: self.ethtool.channels(ifname))  # type: ignore[no-any-return]

    def rings(self, ifname: str) -> Optional[Rings]:
        return self._cached("rings", ifname, lambda: self.ethtool.rings(ifname))  # type: ignore[no-any-return]

    def sysfs_driver(self, ifname: str) -> SysfsDriver:
        return self._cached("sysfs", ifname,  # type: ignore[no-any-return]
                            lambda: read_sysfs_driver(ifname, self.sysfs)) or SysfsDriver(None, None, False)

    def driver_name(self, ifname: str) -> Optional[str]:
        """The driver from ETHTOOL_GDRVINFO, else from the sysfs driver link."""
        info = self.driver(ifname)
        if info is not None and info.driver:
            return info.driver
        return self.sysfs_driver(ifname).driver

    def exists(self, ifname: str) -> bool:
        if self.links:
            return ifname in self.links
        return self.driver(ifname) is not None or self.sysfs_driver(ifname).exists


def sample_counters(interfaces: list[str], ethtool: EthtoolReader,
                    links: Optional[dict[str, LinkInfo]] = None) -> dict[str, CounterSample]:
    """Receive-loss counters (netlink) and ethtool statistics of each interface, now."""
    from agent.readers.links import read_links

    now = time.monotonic()
    try:
        links = links if links is not None else read_links(interfaces)
    except Exception as exc:  # netlink trouble must not stop the other checks
        log.warning("reading interface counters failed: %s", exc)
        links = {}
    out = {}
    for ifname in interfaces:
        if ifname not in links:
            continue
        try:
            stats = ethtool.stats(ifname)
        except (NotSupported, OSError):
            stats = {}
        out[ifname] = CounterSample(now, links[ifname].counters, stats)
    return out


def facts_from_instance(info: Any) -> InstanceFacts:
    """InstanceFacts from agent.discovery.InstanceInfo (duck-typed: any object with its fields)."""
    entry = getattr(info, "type_entry", None)
    return InstanceFacts(
        instance_type=getattr(info, "instance_type", None),
        vcpus=os.cpu_count(),
        ena_support=getattr(entry, "ena_support", None),
        default_queues=getattr(entry, "default_ena_queues", None),
        ena_srd_supported=getattr(entry, "ena_srd_supported", None),
        on_ec2=getattr(info, "on_ec2", None),
        source=(getattr(info, "sources", {}) or {}).get("type_entry", "none"),
        instance_id=getattr(getattr(info, "identity", None), "instance_id", None),
        region=getattr(getattr(info, "identity", None), "region", None),
    )


def facts_from_config(cfg: configmod.Config) -> InstanceFacts:
    """InstanceFacts from `[instance] type` and the bundled catalogue alone (no IMDS, no AWS calls)."""
    entry = None
    if cfg.instance.type:
        try:
            from agent.models.catalogue import catalogue_entry

            entry = catalogue_entry(cfg.instance.type)
        except (OSError, ValueError) as exc:
            log.warning("instance-type catalogue unusable: %s", exc)
    return InstanceFacts(instance_type=cfg.instance.type, vcpus=os.cpu_count(),
                         ena_support=getattr(entry, "ena_support", None),
                         default_queues=getattr(entry, "default_ena_queues", None),
                         ena_srd_supported=getattr(entry, "ena_srd_supported", None),
                         source="catalogue" if entry is not None else "none")


def build_context(cfg: configmod.Config, *, ethtool: Optional[EthtoolReader] = None,
                  instance: Any = None, discover: bool = True, interfaces: Optional[list[str]] = None,
                  before: Optional[dict[str, CounterSample]] = None, window: float = COUNTER_WINDOW,
                  sysfs: str = "/sys") -> CheckContext:
    """A context over the real system: the instance (`instance`: an InstanceInfo or InstanceFacts;
    when None, discovery through IMDS and the catalogue if `discover`, else the config and the
    catalogue), the configured or discovered interfaces, links and routes, and two counter readings
    `window` apart (or `before` from the previous run and one now, which is what the daemon does)."""
    from agent.readers import links as linksmod
    from agent.readers.ethtool import IoctlEthtoolReader
    from agent.readers.imds import ImdsClient
    from agent.readers.pmtu import measure_path_mtu

    reader = ethtool or IoctlEthtoolReader()
    client = None
    if cfg.imds.enabled:
        client = ImdsClient(cfg.imds.endpoint, timeout=cfg.imds.timeout, retries=cfg.imds.retries,
                            allow_imdsv1=cfg.imds.allow_imdsv1)
    if instance is None and discover:
        from agent import discovery as instancemod

        instance = instancemod.discover(cfg, sysfs=sysfs, imds=client)
    elif instance is None:
        instance = facts_from_config(cfg)
    facts = instance if isinstance(instance, InstanceFacts) else facts_from_instance(instance)
    if interfaces is None:
        interfaces = list(cfg.interfaces or getattr(instance, "interfaces", None) or [])
    if not interfaces:
        try:
            from agent.readers.routes import default_route_interfaces

            interfaces = default_route_interfaces()
        except Exception as exc:
            log.warning("interface discovery failed: %s", exc)
            interfaces = []
    started = time.monotonic()
    if before is None:
        before = sample_counters(interfaces, reader)
    try:
        links = linksmod.read_links()
        routes = linksmod.read_routes(interfaces)
    except Exception as exc:
        log.warning("reading links and routes failed: %s", exc)
        links, routes = {}, []
    if window > 0:
        time.sleep(max(0.0, window - (time.monotonic() - started)))
    after = sample_counters(interfaces, reader)
    return CheckContext(config=cfg, interfaces=interfaces, ethtool=reader, links=links, routes=routes,
                        instance=facts, before=before, after=after, path_mtu=measure_path_mtu,
                        route_to=linksmod.route_to,
                        # reuse: discovery just asked IMDS; a host without it must not wait out the timeouts twice
                        imds_probe=(lambda: client.probe(reuse=True)) if client else None, sysfs=sysfs)
