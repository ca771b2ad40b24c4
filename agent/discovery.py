"""Who this instance is: identity and ENIs from IMDS, Linux names by MAC, and the size's bandwidth profile."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from agent import config as configmod
from agent.isolate import ChildFailed, call_in_child
from agent.models.catalogue import (
    UNKNOWN_TYPE_REMEDY,
    TypeEntry,
    catalogue_entry,
    catalogue_source,
    entry_from_describe,
)
from agent.models.profile import BandwidthProfile, resolve_profile
from agent.models.units import bytes_to_gbit
from agent.readers.imds import (
    Eni,
    Identity,
    ImdsClient,
    ImdsError,
    ImdsForbidden,
    ImdsStats,
    ImdsUnavailable,
    parse_eni,
    parse_identity,
    read_enis,
    read_identity,
    sort_enis,
)
from agent.readers.sysfs_net import match_macs, parse_net_interfaces, read_net_interfaces

if TYPE_CHECKING:
    from agent.readers.ec2api import ClientFactory

log = logging.getLogger(__name__)
NODE_NAME_ENV = "BURSTWATCH_NODE_NAME"


@dataclass(frozen=True)
class InstanceInfo:
    """Everything discovery learned, and where each part came from (`sources`)."""

    on_ec2: bool
    identity: Optional[Identity]
    enis: list[Eni]
    interfaces: list[str]                   # the ENIs' Linux names, primary first
    vpc_cidrs: list[str]
    catalogue_entry: Optional[TypeEntry]
    profile: BandwidthProfile
    # imds: v2 | v1 | off (config) | unreachable | disabled (403) | error
    # instance_type: config | imds | none;   type_entry: api | catalogue | none
    # api: fresh | cached | stale_cache | denied | unreachable | no_credentials | unknown_type | error
    #      | skipped
    # catalogue: the data the bundled table came from;   *_detail: a sentence for logs and `status`
    sources: dict[str, str]
    api_entry: Optional[TypeEntry] = None
    eni_interfaces: dict[str, str] = field(default_factory=dict)     # mac -> Linux name
    imds_stats: Optional[ImdsStats] = None
    discovery_seconds: float = 0.0
    # Kubernetes: the node's name, from the downward API (spec.nodeName) through the Helm chart's env.
    node_name: str = field(default_factory=lambda: os.environ.get(NODE_NAME_ENV, ""))

    @property
    def instance_type(self) -> Optional[str]:
        return self.profile.instance_type

    @property
    def type_entry(self) -> Optional[TypeEntry]:
        """The type's facts from the best source (API over the bundled catalogue)."""
        return self.api_entry if self.api_entry is not None else self.catalogue_entry


def _read_imds(client: ImdsClient, sources: dict[str, str]) -> tuple[Optional[Identity], list[Eni]]:
    try:
        identity = parse_identity(read_identity(client))
    except ImdsUnavailable as exc:
        sources["imds"], sources["imds_detail"] = "unreachable", str(exc)
        return None, []
    except ImdsForbidden as exc:
        sources["imds"], sources["imds_detail"] = "disabled", str(exc)
        return None, []
    except (ImdsError, ValueError) as exc:
        sources["imds"], sources["imds_detail"] = "error", str(exc)
        return None, []
    sources["imds"] = client.stats.version or "v2"
    sources["imds_detail"] = f"IMDS{sources['imds']} at {client.endpoint}"
    try:
        enis = sort_enis([parse_eni(mac, values) for mac, values in read_enis(client).items()])
    except (ImdsError, ValueError) as exc:
        log.warning("IMDS answered for the identity but not for the ENIs: %s", exc)
        sources["enis_detail"] = f"ENIs unreadable: {exc}"
        enis = []
    return identity, enis


def _catalogue(instance_type: Optional[str], sources: dict[str, str]) -> Optional[TypeEntry]:
    try:
        sources["catalogue"] = catalogue_source()
        entry = catalogue_entry(instance_type) if instance_type is not None else None
    except (OSError, ValueError) as exc:
        log.error("bundled instance-type catalogue unusable: %s", exc)
        sources["catalogue"] = f"unusable: {exc}"
        return None
    if instance_type is None:
        return None
    if entry is None:
        log.warning("instance_type=%s is not in the bundled catalogue (%s); %s", instance_type,
                    sources["catalogue"], UNKNOWN_TYPE_REMEDY)
    return entry


def discover(cfg: configmod.Config, sysfs: str = "/sys", imds: Optional[ImdsClient] = None,
             api_factory: Optional[ClientFactory] = None, isolate_api: bool = False) -> InstanceInfo:
    """Ask IMDS (if enabled) who we are, match ENIs to interfaces, and resolve the bandwidth profile.

    Never raises on IMDS, AWS or sysfs faults: each is logged and recorded in `sources`. Off EC2 (or with
    IMDS off) it says so in one INFO line and runs on [instance] / [instance.bandwidth]."""
    started = time.monotonic()
    try:
        return _discover(cfg, sysfs, imds, api_factory, started, isolate_api)
    except Exception as exc:  # a bug here must not stop the agent: fall back to the config's profile
        log.exception("instance discovery failed; running on the configured profile")
        profile = resolve_profile(cfg.instance.type, cfg.instance.bandwidth, None, None)
        sources = {"imds": "error", "imds_detail": f"discovery failed: {exc}", "api": "skipped",
                   "instance_type": "config" if cfg.instance.type else "none", "type_entry": "none"}
        return InstanceInfo(False, None, [], [], [], None, profile, sources,
                            discovery_seconds=time.monotonic() - started)


def _match_enis(enis: list[Eni], sysfs: str) -> dict[str, str]:
    """mac -> Linux name of the ENIs present in this network namespace."""
    eni_ifs: dict[str, str] = {}
    try:
        eni_ifs = match_macs([e.mac for e in enis], parse_net_interfaces(read_net_interfaces(sysfs)))
    except Exception as exc:  # sysfs trouble only costs the default interface list
        log.warning("matching ENIs to interfaces via %s failed: %s", sysfs, exc)
    for e in enis:
        if e.mac not in eni_ifs:
            log.info("ENI %s (mac %s, card %d, device %s) has no interface in this network namespace",
                     e.interface_id, e.mac, e.network_card_index, e.device_number)
    return eni_ifs


def _describe_type(cfg: configmod.Config, instance_type: Optional[str], region: Optional[str],
                   api_factory: Optional[ClientFactory], isolate_api: bool,
                   sources: dict[str, str]) -> Optional[TypeEntry]:
    """The type's entry from DescribeInstanceTypes, when the type and region are known and the API is
    allowed; how it went in `sources`."""
    if not (instance_type and region and cfg.instance.describe_api):
        sources["api"] = "skipped"
        sources["api_detail"] = ("no instance type" if not instance_type else
                                 "instance.describe_api = false" if not cfg.instance.describe_api else
                                 "no region (not on EC2)")
        return None

    def lookup() -> tuple[Optional[dict[str, Any]], str, str]:
        # Imported here and answered as plain values: with `isolate_api` neither the API reader nor boto3
        # loads into the daemon, not even to unpickle the answer.
        from agent.readers import ec2api

        factory = api_factory or ec2api.client_factory(cfg.instance.ec2_endpoint_url)
        res = ec2api.lookup_instance_type(instance_type, region, cfg.state_dir, factory)
        return res.info, res.status, res.detail

    if isolate_api:
        # The daemon asks from a forked child, so boto3 never stays resident for this one call
        # (docs/architecture.md, "What stays out of the resident process").
        try:
            info, status, detail = call_in_child(lookup, timeout=30.0)
        except ChildFailed as exc:
            info, status, detail = None, "error", str(exc)
    else:
        info, status, detail = lookup()
    api_entry = entry_from_describe(info) if info is not None else None
    sources["api"], sources["api_detail"] = status, detail
    if api_entry is None:
        log.info("instance_type=%s: DescribeInstanceTypes %s (%s); using the bundled catalogue",
                 instance_type, status, detail)
    return api_entry


def _discover(cfg: configmod.Config, sysfs: str, imds: Optional[ImdsClient],
              api_factory: Optional[ClientFactory], started: float,
              isolate_api: bool = False) -> InstanceInfo:
    sources: dict[str, str] = {}
    identity: Optional[Identity] = None
    enis: list[Eni] = []
    client: Optional[ImdsClient] = None
    if cfg.imds.enabled:
        client = imds or ImdsClient(cfg.imds.endpoint, timeout=cfg.imds.timeout, retries=cfg.imds.retries,
                                    allow_imdsv1=cfg.imds.allow_imdsv1)
        identity, enis = _read_imds(client, sources)
    else:
        sources["imds"], sources["imds_detail"] = "off", "imds.enabled = false"
    on_ec2 = identity is not None

    eni_ifs = _match_enis(enis, sysfs) if enis else {}
    interfaces = [eni_ifs[e.mac] for e in enis if e.mac in eni_ifs]
    vpc_cidrs = sorted({c for e in enis for c in e.vpc_ipv4_cidr_blocks})

    instance_type = cfg.instance.type or (identity.instance_type if identity else None)
    sources["instance_type"] = "config" if cfg.instance.type else ("imds" if identity else "none")
    if cfg.instance.type and identity and cfg.instance.type != identity.instance_type:
        log.warning("instance.type = %s overrides the type IMDS reports (%s)", cfg.instance.type,
                    identity.instance_type)

    catalogue_entry = _catalogue(instance_type, sources)
    api_entry = _describe_type(cfg, instance_type, identity.region if identity else None, api_factory,
                               isolate_api, sources)
    profile = resolve_profile(instance_type, cfg.instance.bandwidth, api_entry, catalogue_entry)
    sources["type_entry"] = "api" if api_entry else ("catalogue" if catalogue_entry else "none")
    for note in profile.notes:
        log.warning("profile: %s", note)

    elapsed = time.monotonic() - started
    if on_ec2:
        assert identity is not None
        log.info("on EC2: instance_id=%s type=%s region=%s az=%s (%s); interfaces=%s; profile: %s",
                 identity.instance_id, instance_type, identity.region, identity.availability_zone,
                 identity.availability_zone_id, ",".join(interfaces) or "-", describe_profile(profile))
    else:
        log.info("not on EC2 (%s, %.1fs); running on the configured profile: %s",
                 sources.get("imds_detail", sources["imds"]), elapsed, describe_profile(profile))
    return InstanceInfo(on_ec2, identity, enis, interfaces, vpc_cidrs, catalogue_entry, profile, sources,
                        api_entry, eni_ifs, client.stats if client else None, elapsed)


def profile_for(cfg: configmod.Config, info: InstanceInfo,
                fleet_bucket_bytes: Optional[float] = None) -> BandwidthProfile:
    """The profile under a (reloaded) config, from what discovery already knows: no IMDS or API call.

    The API's entry is reused while the type stays the same; a type changed in [instance] is looked up
    in the bundled catalogue."""
    itype = cfg.instance.type or (info.identity.instance_type if info.identity else None)
    api = info.api_entry if info.api_entry is not None and info.api_entry.instance_type == itype else None
    try:
        cat = catalogue_entry(itype) if itype else None
    except (OSError, ValueError) as exc:
        log.error("bundled instance-type catalogue unusable: %s", exc)
        cat = None
    profile = resolve_profile(itype, cfg.instance.bandwidth, api, cat, fleet_bucket_bytes=fleet_bucket_bytes)
    for note in profile.notes:
        log.warning("profile: %s", note)
    return profile


def describe_profile(p: BandwidthProfile) -> str:
    """One line for logs and `burstwatch status`: type, figures in Gbit/s, and where each came from."""
    def gbit(v: Optional[float]) -> str:
        return f"{bytes_to_gbit(v):g}" if v is not None else "?"

    if p.baseline_bytes_per_second is None and p.peak_bytes_per_second is None:
        if p.instance_type is None:
            return "type=?, bandwidth unknown (set [instance] type or [instance.bandwidth])"
        return f"type={p.instance_type}, bandwidth unknown: no credit estimate ({UNKNOWN_TYPE_REMEDY})"
    line = (f"type={p.instance_type or '?'} baseline={gbit(p.baseline_bytes_per_second)} Gbit/s "
            f"({p.baseline_source}) peak={gbit(p.peak_bytes_per_second)} Gbit/s ({p.peak_source})")
    if p.never_exhausts:
        return line + " bucket=none (baseline = peak: never exhausts)"
    return line + f" bucket={gbit(p.bucket_bytes)} Gbit ({p.bucket_source})"


# An ENI attached while the daemon runs: its interface shows up in sysfs within a moment, and IMDS lists its
# MAC under network/interfaces/macs/ (docs/ec2-network-facts.md, "Instance metadata"), possibly a little
# later. An interface that is no ENI (a container's veth, a bridge) is asked about for this long, then left.
ENI_RETRY_FIRST = 1.0
ENI_RETRY_MAX = 60.0
ENI_GIVE_UP = 600.0

EniChange = Callable[[list[Eni], list[str], dict[str, str]], None]


class EniWatcher:
    """Keeps the monitored set equal to IMDS's ENIs present in this network namespace while ENIs are
    attached and detached, matched by MAC as at start-up.

    poll() is on the sampling path: one listdir of <sysfs>/class/net, compared with the last one. A
    monitored name that went away leaves the set at once (no IMDS needed; the counter helpers forget it,
    so it adds no spike). A new name starts a re-match on a thread of its own (IMDS's ENI list, then the
    MACs in sysfs), so a slow or failing IMDS never holds up a sample; the new set is used from the next
    sample. A failed IMDS read, or a new name IMDS does not list (yet), is tried again after 1, 2, 4 ...
    60 s, for up to ENI_GIVE_UP seconds. `on_change(enis, interfaces, eni_interfaces)` receives each new
    set (interfaces primary first)."""

    def __init__(self, info: InstanceInfo, imds: ImdsClient, on_change: EniChange, sysfs: str = "/sys",
                 min_poll: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 retry_first: float = ENI_RETRY_FIRST, retry_max: float = ENI_RETRY_MAX,
                 give_up: float = ENI_GIVE_UP, background: bool = True) -> None:
        self.imds = imds
        self.on_change = on_change
        self.base = os.path.join(sysfs, "class", "net")
        self.sysfs = sysfs
        self.min_poll = min_poll
        self.clock = clock
        self.retry_first, self.retry_max, self.give_up = retry_first, retry_max, give_up
        self.background = background
        self._lock = threading.Lock()
        self.enis = list(info.enis)
        self.interfaces = list(info.interfaces)
        self.eni_interfaces = dict(info.eni_interfaces)
        self._names = self._listdir() or frozenset()
        self._last_poll = -1e18
        self._pending: set[str] = set()      # new names not matched yet
        self._next_try = 0.0
        self._delay = retry_first
        self._deadline = 0.0
        self._busy = False
        self._failing = False
        self.refreshes = 0                   # IMDS re-matches run (tests, logs)

    def _listdir(self) -> Optional[frozenset[str]]:
        try:
            return frozenset(os.listdir(self.base))
        except OSError:
            return None

    # -- the sampling path -------------------------------------------------------------------------
    def poll(self) -> None:
        now = self.clock()
        if now - self._last_poll < self.min_poll:
            return
        self._last_poll = now
        names = self._listdir()
        start = False
        with self._lock:
            if names is not None and names != self._names:
                added, removed = names - self._names, self._names - names
                self._names = names
                if removed & set(self.interfaces):
                    self._drop(removed)
                if added:
                    self._pending |= added
                    self._next_try, self._delay, self._deadline = now, self.retry_first, now + self.give_up
            if self._pending and not self._busy and now >= self._next_try:
                self._busy = start = True
        if start:
            if self.background:
                threading.Thread(target=self.refresh, name="eni-watch", daemon=True).start()
            else:
                self.refresh()

    def _drop(self, removed: frozenset[str]) -> None:
        """Under the lock: interfaces that went away leave the monitored set."""
        gone = [n for n in self.interfaces if n in removed]
        self.interfaces = [n for n in self.interfaces if n not in removed]
        self.eni_interfaces = {m: n for m, n in self.eni_interfaces.items() if n not in removed}
        log.info("interface(s) %s gone (ENI detached?); monitoring %s", ",".join(gone),
                 ",".join(self.interfaces) or "-")
        self.on_change(list(self.enis), list(self.interfaces), dict(self.eni_interfaces))

    # -- the re-match (its own thread) -------------------------------------------------------------
    def refresh(self) -> None:
        """Read IMDS's ENIs and match them to interfaces by MAC; publish the set when it changed."""
        try:
            self.refreshes += 1
            self.imds.reset()       # a client that gave up on an unreachable IMDS asks again
            enis = sort_enis([parse_eni(mac, values) for mac, values in read_enis(self.imds).items()])
            eni_ifs = match_macs([e.mac for e in enis], parse_net_interfaces(read_net_interfaces(self.sysfs)))
        except Exception as exc:  # IMDS flapping, sysfs trouble: try again later, never fail the daemon
            with self._lock:
                first = not self._failing
                self._failing = True
                self._busy = False
                self._retry_later()
            if first:
                log.warning("re-matching ENIs to interfaces failed (%s); trying again in %.0f s", exc,
                            self._next_try - self.clock())
            else:
                log.debug("re-matching ENIs failed again: %s", exc)
            return
        with self._lock:
            if self._failing:
                log.info("re-matching ENIs to interfaces works again")
            self._failing = False
            self._busy = False
            # A name that went away since the sysfs read stays out.
            present = {m: n for m, n in eni_ifs.items() if n in self._names}
            interfaces = [present[e.mac] for e in enis if e.mac in present]
            self._pending = {n for n in self._pending if n in self._names and n not in interfaces}
            if self._pending:
                self._retry_later()
            changed = interfaces != self.interfaces or enis != self.enis
            old = self.interfaces
            self.enis, self.interfaces, self.eni_interfaces = enis, interfaces, present
            if changed:
                joined = [n for n in interfaces if n not in old]
                by_name = {present[e.mac]: e for e in enis if e.mac in present}
                log.info("ENIs changed: monitoring %s%s", ",".join(interfaces) or "-",
                         "".join(f"; {n} joined (ENI {by_name[n].interface_id}, mac {by_name[n].mac}, card "
                                 f"{by_name[n].network_card_index}, device {by_name[n].device_number})"
                                 for n in joined))
                self.on_change(list(enis), list(interfaces), dict(present))

    def _retry_later(self) -> None:
        """Under the lock: schedule the next try with backoff, or give up on the pending names."""
        now = self.clock()
        if now >= self._deadline:
            if self._pending:
                log.info("interface(s) %s: no ENI in IMDS has their MAC after %.0f s; not monitored",
                         ",".join(sorted(self._pending)), self.give_up)
            self._pending = set()
            return
        self._next_try = now + self._delay
        self._delay = min(self._delay * 2, self.retry_max)


def eni_watcher(cfg: configmod.Config, info: InstanceInfo, on_change: EniChange, sysfs: str = "/sys",
                min_poll: float = 0.0) -> Optional[EniWatcher]:
    """A watcher when the monitored set comes from IMDS's ENIs (no `interfaces` in the config, IMDS on
    and answering at start-up), else None. Its IMDS requests count in the start-up client's ImdsStats."""
    if cfg.interfaces or not cfg.imds.enabled or not info.on_ec2:
        return None
    im = cfg.imds
    client = ImdsClient(im.endpoint, timeout=im.timeout, retries=im.retries, allow_imdsv1=im.allow_imdsv1)
    if info.imds_stats is not None:
        client.stats = info.imds_stats
    return EniWatcher(info, client, on_change, sysfs, min_poll)
