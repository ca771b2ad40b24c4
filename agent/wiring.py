"""Wiring: build the sampler, the services and the Prometheus views from a config, and apply a reloaded one."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from agent import config as configmod
from agent.checks.runner import CheckRunner, subprocess_executor
from agent.config_checks import split_hostport
from agent.config_loader import keep_restart_keys, restart_keys_changed
from agent.discovery import EniWatcher, InstanceInfo, discover, eni_watcher, profile_for
from agent.exporters.allowances import AllowancesView
from agent.exporters.checks import CheckView
from agent.exporters.credit_view import CreditView
from agent.exporters.ena import EnaView
from agent.exporters.instance import InstanceView
from agent.exporters.prometheus import BuildInfoView, ReloadState, SamplerView
from agent.exporters.responder import ResponderView
from agent.exporters.state import StateView
from agent.models.credit_model import CreditReading
from agent.models.profile import BandwidthProfile
from agent.models.units import bytes_to_gbit
from agent.readers.ethtool import IoctlEthtoolReader
from agent.readers.imds import Eni
from agent.sampling import ModelStep
from agent.sampling.allowances import AllowancesStep
from agent.sampling.credits import CreditsStep
from agent.sampling.ethtool import EthtoolStep
from agent.sampling.netdev import NetdevStep
from agent.sampling.pipeline import Sampler, Snapshot
from agent.sampling.shaping import ShapingStep
from agent.writers.spool import Spool, SpoolStats
from agent.writers.statefile import WRITE_ERRORS

if TYPE_CHECKING:
    # Types only: each of these is imported when its feature is on (boto3 stays out of the resident process
    # otherwise, tests/test_resident_imports.py), so mypy sees them while the process may never load them.
    from agent.cloudwatch.publisher import CloudWatchPublisher
    from agent.fleet.service import FleetService
    from agent.probes.service import ProbeResult, ProbeService
    from agent.responder.server import Responder

log = logging.getLogger(__name__)

# Seconds a reload that turns the responder off gives its test in progress (aborted) and its threads to end;
# the listening socket is closed within this (docs/configuration.md, "Configuration reference").
RESPONDER_STOP_TIMEOUT = 2.0


class Service(Protocol):
    """Something the daemon runs beside the sampler (responder, checks, publishers)."""

    name: str

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...


@dataclass
class Paths:
    """OS roots, replaceable in tests (node_exporter's --path.procfs / --path.sysfs)."""

    procfs: str = "/proc"
    sysfs: str = "/sys"


def resolve_interfaces(cfg: configmod.Config, discovered: Callable[[], list[str]]) -> list[str]:
    if cfg.interfaces:
        return list(cfg.interfaces)
    try:
        found = discovered()
    except Exception as exc:
        log.warning("interface discovery failed: %s", exc)
        found = []
    if not found:
        log.warning("no interfaces configured and none discovered; monitoring nothing until a reload")
    return found


@dataclass
class Agent:
    """Everything `burstwatch run` runs, built once by build(); the daemon owns the loop around it.

    `sections` maps a config key (a section or a top-level key) to what applies its new value on a reload
    (returning the keys it could not apply, if any). Which keys a reload applies at all is decided in one
    place, the `restart` marks of agent/config.py (config_loader.reload_decisions); `started` is the config
    the process started with, against which keys waiting for a restart are named in `restart_pending`."""

    cfg: configmod.Config
    paths: Paths
    instance: Optional[InstanceInfo] = None
    profile: BandwidthProfile = field(default_factory=BandwidthProfile)
    interfaces: list[str] = field(default_factory=list)
    sampler: Optional[Sampler] = None
    credits: Optional[CreditsStep] = None
    ethtool: Optional[EthtoolStep] = None
    allowances: Optional[AllowancesStep] = None
    checks: Optional[CheckRunner] = None
    responder: Optional[Responder] = None
    probes: Optional[ProbeService] = None
    cloudwatch: Optional[CloudWatchPublisher] = None
    fleet: Optional[FleetService] = None
    fleet_bucket_bytes: Optional[float] = None      # the fleet's consensus for this type (docs/fleet.md)
    services: list[Service] = field(default_factory=list)
    views: list[Any] = field(default_factory=list)
    shutdown_hooks: list[Callable[[], None]] = field(default_factory=list)
    sections: dict[str, Callable[[Any], Optional[list[str]]]] = field(default_factory=dict)
    started: Optional[configmod.Config] = None
    restart_pending: list[str] = field(default_factory=list)
    responder_on: bool = False

    # -- the pieces ------------------------------------------------------------------------------
    def model_steps(self) -> list[ModelStep]:
        """The per-sample models' steps: each gets a shutdown save, its section's reload handler and, with
        [fleet] on, its fleet hand-off, in one loop each."""
        return [s for s in (self.credits, self.allowances) if s is not None]

    def latest(self) -> Optional[Snapshot]:
        return self.sampler.latest if self.sampler is not None else None

    def latest_credits(self) -> Optional[dict[str, CreditReading]]:
        snap = self.latest()
        return snap.credits if snap is not None else None

    def vpc_cidrs(self) -> list[str]:
        return list(self.instance.vpc_cidrs) if self.instance is not None else []

    def discovered_interfaces(self) -> list[str]:
        if self.instance is not None and self.instance.interfaces:
            return list(self.instance.interfaces)  # the ENIs IMDS listed, matched to interfaces by MAC
        from agent.readers.routes import default_route_interfaces

        return default_route_interfaces(self.paths.procfs)

    def responder_busy(self) -> bool:
        return self.responder is not None and bool(self.responder.stats.snapshot().busy)

    def probing(self) -> bool:
        return self.probes is not None and bool(self.probes.snapshot().running)

    def probe_results(self) -> list[ProbeResult]:
        return list(self.probes.snapshot().results.values()) if self.probes is not None else []

    def refresh_profile(self) -> None:
        """The profile again from what is known (a reloaded [instance], a new fleet consensus): no IMDS or
        API call; the credit model keeps its deficit."""
        if self.instance is None or self.credits is None:
            return
        self.profile = profile_for(self.cfg, self.instance, fleet_bucket_bytes=self.fleet_bucket_bytes)
        self.instance = dataclasses.replace(self.instance, profile=self.profile)
        self.credits.set_profile(self.profile)

    # -- reload ----------------------------------------------------------------------------------
    def apply(self, new: configmod.Config) -> list[str]:
        """Apply a reloaded config: each changed section goes to its handler, keys that wait for a restart at
        their running values. Returns the keys that wait (against `started`: one set back no longer does)."""
        started = self.started or self.cfg
        pending = restart_keys_changed(started, new)
        old, self.cfg = self.cfg, keep_restart_keys(started, new)
        changed = restart_keys_changed(old, self.cfg, restart=True)     # every key that changes now
        for key in (f.name for f in dataclasses.fields(configmod.Config)):
            value, handler = getattr(self.cfg, key), self.sections.get(key)
            if getattr(old, key) != value and handler is None:
                # A key the schema says applies live, and nothing here to apply it: say so, never "applied".
                keys = [k for k in changed if k == key or k.startswith(key + ".")]
                log.error("%s changed but nothing applies it while running; it takes effect at the next "
                          "restart", ", ".join(keys))
                pending.extend(keys)
            elif getattr(old, key) != value and handler is not None:
                pending.extend(handler(value) or [])
        pending = list(dict.fromkeys(pending))      # a section's handler may name a key the marks did too
        for key in pending:
            log.warning("%s changed; it takes effect at the next restart", key)
        self.restart_pending = pending
        return pending


def build(cfg: configmod.Config, config_path: Optional[str], paths: Paths,
          reload_state: Optional[ReloadState] = None) -> Agent:
    """Discover the instance and build the sampling pipeline, the services and their views."""
    a = Agent(cfg, paths, started=cfg)
    a.instance = discover(cfg, sysfs=paths.sysfs, isolate_api=True)
    a.profile = a.instance.profile
    a.interfaces = resolve_interfaces(cfg, a.discovered_interfaces)
    watcher = _watch_enis(a)

    def interfaces() -> list[str]:
        if watcher is not None:
            watcher.poll()   # one listdir per sample: ENIs attached or detached while running
        return a.interfaces

    # The sampling pipeline: netdev -> ethtool -> shaping -> credits -> allowances, in Sampler.sample's one order.
    reader = IoctlEthtoolReader()
    a.shutdown_hooks.append(reader.close)
    a.ethtool = EthtoolStep(interfaces, reader, include=cfg.metrics.ethtool_include)
    c = cfg.credits
    shaping = ShapingStep(c.shaping_source, interfaces, c.tc_in_interface, c.tc_out_interface)
    a.credits = CreditsStep(a.profile, cfg.state_dir, c, paths.procfs)
    # PPS and conntrack (docs/allowances.md): learned figures kept per instance type in state_dir.
    a.allowances = AllowancesStep(cfg.allowances, cfg.state_dir, a.profile.instance_type,
                                  lambda: a.profile.baseline_bytes_per_second, paths.procfs)
    a.shutdown_hooks.extend(step.save for step in a.model_steps())
    a.sampler = Sampler(NetdevStep(interfaces, paths.procfs, paths.sysfs), cfg.effective_rate_window,
                        ethtool=a.ethtool, shaping=shaping, credits=a.credits, allowances=a.allowances)

    a.checks = CheckRunner(subprocess_executor(config_path))
    a.services.append(a.checks)
    if cfg.responder.enabled:
        _responder(a)
    # One view whether or not the responder runs now: a reload may turn it on or off (it renders nothing
    # while there has been no responder).
    a.views.append(ResponderView(lambda: a.responder.stats.snapshot() if a.responder is not None else None))
    if cfg.probe.peers or cfg.probe.discover_tag or cfg.probe.registry:
        _probes(a)
    credits = a.credits
    a.views = [BuildInfoView(), SamplerView(a.latest), *([reload_state] if reload_state else []),
               InstanceView(lambda: a.instance),
               CreditView(a.latest, lambda: shaping.source, lambda: credits.restore_note),
               EnaView(lambda: a.latest().ethtool if a.latest() is not None else None),  # type: ignore[union-attr]
               AllowancesView(lambda: a.latest().allowances  # type: ignore[union-attr]
                              if a.latest() is not None else None),
               CheckView(lambda: a.checks.snapshot() if a.checks is not None and a.checks.snapshot().runs else None),
               *a.views]
    if cfg.cloudwatch.enabled:
        from agent.exporters.cloudwatch import CloudWatchView

        a.cloudwatch = _cloudwatch(a)
        a.views.append(CloudWatchView(a.cloudwatch.snapshot))
        # Added last so it is stopped first and gets most of the shutdown budget to flush.
        a.services.append(a.cloudwatch)
    if cfg.fleet.enabled:
        _fleet(a)
    a.views.append(StateView(WRITE_ERRORS.snapshot, lambda: _spool_stats(a)))
    a.sections = _reload_handlers(a)
    return a


def _watch_enis(a: Agent) -> Optional[EniWatcher]:
    """The monitored set follows ENIs attached or detached while running, when it comes from IMDS."""
    if a.instance is None:
        return None

    def changed(enis: list[Eni], interfaces: list[str], eni_interfaces: dict[str, str]) -> None:
        assert a.instance is not None
        a.instance = dataclasses.replace(a.instance, enis=enis, interfaces=interfaces,
                                         eni_interfaces=eni_interfaces)
        if not a.cfg.interfaces:           # a reload may have named interfaces since
            a.interfaces = list(interfaces)

    return eni_watcher(a.cfg, a.instance, changed, a.paths.sysfs, min_poll=a.cfg.sample_interval / 2)


def _spool_stats(a: Agent) -> list[SpoolStats]:
    archive = a.probes.archive if a.probes is not None else None
    spools = [a.cloudwatch.spool if a.cloudwatch is not None else None,
              archive.spool if archive is not None else None,
              a.fleet.spool if a.fleet is not None else None]
    return [s.snapshot() for s in spools if s is not None]


def _reload_handlers(a: Agent) -> dict[str, Callable[[Any], Optional[list[str]]]]:
    def interfaces(_value: Any) -> None:
        a.interfaces = resolve_interfaces(a.cfg, a.discovered_interfaces)

    def log_level(value: str) -> None:
        logging.getLogger().setLevel(value.upper())

    def rate_window(_value: Any) -> None:
        a.sampler.tracker.rate_window = a.cfg.effective_rate_window   # type: ignore[union-attr]

    def metrics(section: configmod.MetricsConfig) -> None:
        assert a.ethtool is not None
        a.ethtool.include = frozenset(section.ethtool_include)

    def responder(section: configmod.ResponderConfig) -> None:
        """[responder] enabled applies both ways: it is the one network-facing server."""
        if section.enabled and not a.responder_on:
            _responder(a, start=True)
        elif not section.enabled and a.responder_on:
            assert a.responder is not None
            a.responder.stop(RESPONDER_STOP_TIMEOUT)
            a.responder_on = False
            log.info("responder stopped: [responder] enabled = false")
        elif a.responder is not None and a.responder_on:
            from agent.responder.server import resolve_allow

            a.responder.reconfigure(section, resolve_allow(section.allow, a.vpc_cidrs))

    handlers: dict[str, Callable[[Any], Optional[list[str]]]] = {
        "interfaces": interfaces, "log_level": log_level, "rate_window": rate_window,
        "sample_interval": rate_window, "metrics": metrics,
        "instance": lambda _section: a.refresh_profile(), "responder": responder,
    }
    handlers.update((step.section, step.reconfigure) for step in a.model_steps())
    if a.probes is not None:
        probes = a.probes

        def probe(p: configmod.ProbeConfig) -> None:
            probes.reconfigure(p, responder_port=split_hostport(a.cfg.responder.listen)[1])

        handlers["probe"] = probe
    else:
        def probe_later(p: configmod.ProbeConfig) -> list[str]:
            """No probe service runs (none was configured at start): the section's changes wait for it."""
            started = a.started.probe if a.started is not None else configmod.ProbeConfig()
            return restart_keys_changed(started, p, "probe.", True)

        handlers["probe"] = probe_later
    return handlers


def _responder(a: Agent, start: bool = False) -> None:
    """The responder, in the services after the checks; a reload that turns it on again makes a new one
    (`start`) that keeps the stopped one's counters."""
    from agent.responder.server import Responder, resolve_allow

    old = a.responder
    # The credit guard reads this host's latest credit readings; a test served while this host runs its
    # own probe would measure the two competing, so the responder answers "busy" then.
    a.responder = Responder(a.cfg.responder, resolve_allow(a.cfg.responder.allow, a.vpc_cidrs),
                            credits=a.latest_credits, profile=lambda: a.profile, external_busy=a.probing,
                            stats=old.stats if old is not None else None)
    if old in a.services:
        a.services[a.services.index(old)] = a.responder
    else:
        a.services.insert(a.services.index(a.checks) + 1 if a.checks in a.services else 0, a.responder)
    a.responder_on = True
    if start:
        a.responder.start()


def _probes(a: Agent) -> None:
    """The probe scheduler (docs/probe-scheduling.md). Imports boto3 only when discovery or the archive
    is on, and then only when first used."""
    from agent.exporters.probes import ProbesView
    from agent.probes.service import build_probe_service

    a.probes = build_probe_service(a.cfg.probe, responder_port=split_hostport(a.cfg.responder.listen)[1],
                                   credits=a.latest_credits, profile=lambda: a.profile,
                                   # A probe while the responder serves a test would measure the two competing.
                                   busy=a.responder_busy, instance=a.instance, fleet=a.cfg.fleet)
    arc = a.cfg.probe.archive
    if a.probes.archive is not None and arc.spool:
        # Objects waiting for S3 survive a restart (the next start uploads them first).
        a.probes.archive.use_spool(Spool(Path(a.cfg.state_dir) / "spool" / "probe-archive", "probe-archive",
                                         arc.spool_max_objects, arc.spool_max_bytes))
    a.services.append(a.probes)
    a.views.append(ProbesView(a.probes.snapshot))


def _cloudwatch(a: Agent) -> CloudWatchPublisher:
    """The CloudWatch publisher (imports boto3: only when [cloudwatch] enabled = true)."""
    from agent import aws
    from agent.cloudwatch.publisher import CloudWatchPublisher
    from agent.readers.autoscaling import CACHE_FILE, autoscaling_group_name
    from agent.readers.imds import ImdsClient

    cw, ident = a.cfg.cloudwatch, (a.instance.identity if a.instance else None)
    iid = ident.instance_id if ident else None
    # DescribeTags asks the instance's own Region (IMDS), whatever [cloudwatch] region publishes to: another
    # Region answers an unknown instance id with no tags (readers/autoscaling.py).
    ec2_region = ident.region if ident else None
    imds_get = None
    if a.cfg.imds.enabled and ident is not None:
        im = a.cfg.imds
        imds_get = ImdsClient(im.endpoint, timeout=im.timeout, retries=im.retries,
                              allow_imdsv1=im.allow_imdsv1).get
    ec2_url = a.cfg.instance.ec2_endpoint_url
    checks = a.checks
    return CloudWatchPublisher(
        cw, region=ident.region if ident else None, instance_id=iid,
        instance_type=a.instance.instance_type if a.instance else a.cfg.instance.type,
        autoscaling_group=(lambda: autoscaling_group_name(
            iid, imds_get, lambda: aws.client("ec2", ec2_region, ec2_url),
            cache=Path(a.cfg.state_dir) / CACHE_FILE, region=ec2_region)) if iid else None,
        checks=(lambda: checks.snapshot().verdicts) if checks is not None else None,
        probes=a.probe_results, spool_dir=Path(a.cfg.state_dir) / "spool" / "cloudwatch")


def _fleet(a: Agent) -> None:
    """Learned buckets shared through S3 (docs/fleet.md): what this agent learns is queued for upload, and
    the fleet's consensus for the type becomes the bucket prior when neither config nor own learning has one."""
    from agent import __version__
    from agent.exporters.fleet import FleetView
    from agent.fleet.service import FleetService
    from agent.models.fleet import Consensus, allowance_record, bucket_records

    ident = a.instance.identity if a.instance is not None else None
    if a.profile.instance_type is None:
        log.warning("[fleet] enabled but the instance type is unknown (no IMDS, no [instance] type): "
                    "nothing to share or adopt")
        return

    def adopt(consensus: Optional[Consensus]) -> None:
        bucket = consensus.bucket_bytes if consensus is not None else None
        if bucket == a.fleet_bucket_bytes:
            return
        a.fleet_bucket_bytes = bucket
        if a.credits is not None:      # the type's spread across the fleet: the band of a fleet belief
            a.credits.fleet_spread = (consensus.low, consensus.high) \
                if consensus is not None and 0 < consensus.low <= consensus.high else None
        if consensus is not None:
            log.info("fleet consensus for %s: %.1f Gbit from %d instances", a.profile.instance_type,
                     bytes_to_gbit(consensus.bucket_bytes), consensus.instances)
        a.refresh_profile()

    allowances = a.allowances
    # A new instance of the type starts with the fleet's PPS ceiling and conntrack size (docs/allowances.md,
    # "The fleet"); its own learning, restored or new, wins.
    fleet = FleetService(a.cfg.fleet, instance_type=a.profile.instance_type,
                         instance_id=ident.instance_id if ident else None,
                         region=a.cfg.fleet.region or (ident.region if ident else None),
                         state_dir=a.cfg.state_dir, on_consensus=adopt,
                         on_allowances=(lambda found: allowances.adopt(found.conntrack_size, found.pps_ceiling))
                         if allowances is not None else None)
    where = {"instance_type": a.profile.instance_type, "instance_id": ident.instance_id if ident else None,
             "region": ident.region if ident else None,
             "availability_zone": ident.availability_zone if ident else None, "agent_version": __version__}
    others = allowances.learned if allowances is not None else dict

    def buckets() -> None:
        """The credits step learned a size: one record per direction, the allowance figures riding on it."""
        snap = a.latest()
        driver = next((e.driver for e in (snap.ethtool or {}).values() if e.driver is not None), None) \
            if snap else None
        records = bucket_records(a.credits.learned() if a.credits is not None else {}, a.profile, **where,
                                 **others(), driver=driver.driver if driver else None,
                                 driver_version=driver.version if driver else None, learned_at=time.time())
        if records:
            fleet.publish(records)

    def allowance_line() -> None:
        """The allowances step learned a PPS ceiling or conntrack size: published on its own (an allowance
        line), as it also rides on the next bucket object (docs/allowances.md, "The fleet")."""
        figures = others()
        if any(v is not None for v in figures.values()):
            fleet.publish_allowances(allowance_record(**where, **figures, learned_at=time.time()))

    publishers: dict[str, Callable[[], None]] = {"credits": buckets, "allowances": allowance_line}
    for step in a.model_steps():
        step.on_learned = publishers[step.name]
    a.fleet = fleet
    a.services.append(fleet)
    a.views.append(FleetView(fleet.snapshot))
