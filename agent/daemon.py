"""`burstwatch run`: wire readers, models and exporters together and keep them running."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from agent import config as configmod
from agent.checks.runner import CheckRunner, subprocess_executor
from agent.credits.feed import CreditTracker
from agent.discovery import InstanceInfo, discover, profile_for
from agent.exporters.checks import CheckView
from agent.exporters.credit_view import CreditView
from agent.exporters.ena import EnaView
from agent.exporters.instance import InstanceView
from agent.exporters.prometheus import BuildInfoView, MetricsServer, ReloadState, SamplerView, build_registry
from agent.models.profile import BandwidthProfile
from agent.notify import notify, watchdog_interval
from agent.readers.ethtool import IoctlEthtoolReader
from agent.sampling.ethtool import EthtoolCollector, make_step_hook
from agent.sampling.pipeline import Sampler, Snapshot
from agent.sampling.shaping import ShapingCollector

if TYPE_CHECKING:
    from agent.probes.service import ProbeService

log = logging.getLogger(__name__)


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


class Daemon:
    def __init__(self, cfg: configmod.Config, config_path: Optional[str], paths: Paths | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.paths = paths or Paths()
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self._hup = False
        self.reload_state = ReloadState()
        self.reload_state.success_time = time.time()
        self.services: list[Service] = []
        self.interfaces: list[str] = []
        self.sampler: Optional[Sampler] = None
        self.server: Optional[MetricsServer] = None
        self.views: list[Any] = []
        self.shutdown_hooks: list[Callable[[], None]] = []
        self.credits: Optional[CreditTracker] = None
        self.instance: Optional[InstanceInfo] = None
        self.ethtool: Optional[EthtoolCollector] = None
        self.cloudwatch: Optional[Any] = None
        self.checks: Optional[CheckRunner] = None
        self.responder: Optional[Any] = None
        self.profile = BandwidthProfile()
        self.probes: Optional[ProbeService] = None

    # -- signals ---------------------------------------------------------------------------------
    def _on_term(self, signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        self.stop_event.set()
        self.wake.set()

    def _on_hup(self, _signum: int, _frame: Any) -> None:
        self._hup = True
        self.wake.set()

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, self._on_hup)

    # -- config ----------------------------------------------------------------------------------
    def reload(self) -> bool:
        """Re-read the config file; on any error keep the running config and say so in a metric."""
        try:
            new = configmod.load(self.config_path)
        except configmod.ConfigError as exc:
            log.error("config reload failed, keeping the running config: %s", exc)
            self.reload_state.successful = 0.0
            self.reload_state.reloads["failure"] += 1
            return False
        self.reload_state.successful = 1.0
        self.reload_state.success_time = time.time()
        self.reload_state.reloads["success"] += 1
        old, self.cfg = self.cfg, new
        logging.getLogger().setLevel(new.log_level.upper())
        if self.ethtool is not None:
            self.ethtool.include = frozenset(new.metrics.ethtool_include)
        if new.interfaces != old.interfaces:
            self.interfaces = resolve_interfaces(new, self._discover)
        if self.sampler is not None:
            self.sampler.tracker.rate_window = new.effective_rate_window
        if self.credits is not None and new.instance != old.instance and self.instance is not None:
            self.profile = profile_for(new, self.instance)
            self.instance = dataclasses.replace(self.instance, profile=self.profile)
            self.credits.set_profile(self.profile)
        if self.responder is not None and new.responder != old.responder:
            from agent.responder.server import resolve_allow

            self.responder.reconfigure(new.responder, resolve_allow(new.responder.allow, self._vpc_cidrs))
        if self.probes is not None and new.probe != old.probe:
            p = new.probe
            self.probes.reconfigure(peers=p.peers, interval=p.interval, peers_per_round=p.peers_per_round,
                                    duration=p.duration, streams=p.streams, credit_floor=p.credit_floor,
                                    hourly_budget_bytes=p.hourly_budget_bytes, directions=p.directions,
                                    default_port=configmod.split_hostport(new.responder.listen)[1])
            if (p.discover_tag, p.discover_endpoint_url, p.archive) != (
                    old.probe.discover_tag, old.probe.discover_endpoint_url, old.probe.archive):
                log.warning("[probe] discovery or archive settings changed; they take effect at the next restart")
        elif self.probes is None and (new.probe.peers or new.probe.discover_tag):
            log.warning("[probe] now names peers; probing starts at the next restart")
        for name in ("cloudwatch", "credits", "imds", "state_dir"):
            if getattr(new, name) != getattr(old, name):
                log.warning("%s changed; it takes effect at the next restart", name)
        if new.metrics.listen != old.metrics.listen:
            log.warning("metrics.listen changed to %s; it takes effect at the next restart", new.metrics.listen)
        log.info("config reloaded from %s", self.config_path or configmod.DEFAULT_CONFIG_PATH)
        return True

    def _discover(self) -> list[str]:
        if self.instance is not None and self.instance.interfaces:
            return list(self.instance.interfaces)  # the ENIs IMDS listed, matched to interfaces by MAC
        from agent.readers.routes import default_route_interfaces

        return default_route_interfaces(self.paths.procfs)

    # -- the loop --------------------------------------------------------------------------------
    def setup(self) -> None:
        self.instance = discover(self.cfg, sysfs=self.paths.sysfs, isolate_api=True)
        self.profile = self.instance.profile
        self.interfaces = resolve_interfaces(self.cfg, self._discover)
        self.sampler = Sampler(lambda: self.interfaces, self.cfg.effective_rate_window,
                               procfs=self.paths.procfs, sysfs=self.paths.sysfs)
        sampler = self.sampler

        def latest() -> Optional[Snapshot]:
            return sampler.latest

        reader = IoctlEthtoolReader()
        self.shutdown_hooks.append(reader.close)
        self.ethtool = EthtoolCollector(lambda: self.interfaces, reader, include=self.cfg.metrics.ethtool_include)
        sampler.hooks.append(make_step_hook(self.ethtool, sampler.status))
        c = self.cfg.credits
        ethtool = self.ethtool
        shaping = ShapingCollector(c.shaping_source, lambda: self.interfaces, c.tc_in_interface, c.tc_out_interface,
                                   ethtool_stats=lambda: {n: r.totals for n, r in (ethtool.latest or {}).items()})
        self.credits = CreditTracker(self.profile, self.cfg.state_dir, c.save_interval, c.learn, shaping,
                                     c.trust_configured_bucket, sampler.status, self.paths.procfs)
        sampler.hooks.append(self.credits.hook)
        self.shutdown_hooks.append(self.credits.save)
        credits = self.credits
        checks = self.checks = CheckRunner(executor=subprocess_executor(self.config_path))
        self.services.append(checks)
        if self.cfg.responder.enabled:
            from agent.exporters.responder import ResponderView
            from agent.responder.server import Responder, resolve_allow

            self.responder = Responder(self.cfg.responder, resolve_allow(self.cfg.responder.allow, self._vpc_cidrs))
            self.services.append(self.responder)
            self.views.append(ResponderView(self.responder.stats.snapshot))
        self._setup_probes(sampler)
        self.views = [BuildInfoView(), SamplerView(latest), self.reload_state, InstanceView(lambda: self.instance),
                      CreditView(latest, lambda: shaping.source, lambda: credits.restore_note),
                      EnaView(lambda: sampler.latest.extra.get("ethtool") if sampler.latest else None),
                      CheckView(lambda: checks.state if checks.state.runs else None), *self.views]
        if self.cfg.cloudwatch.enabled:
            self.cloudwatch = self._cloudwatch()
            self.views.append(self.cloudwatch.view)
        # The publisher is added last so it is stopped first and gets most of the shutdown budget to flush.
        if self.cloudwatch is not None:
            self.services.append(self.cloudwatch)
        host, port = configmod.split_hostport(self.cfg.metrics.listen)
        self.server = MetricsServer(host, port, build_registry(self.views))

    def _cloudwatch(self) -> Any:
        """The CloudWatch publisher (imports boto3: only when [cloudwatch] enabled = true)."""
        from agent.cloudwatch.publisher import CloudWatchPublisher, autoscaling_group_name
        from agent.readers import aws
        from agent.readers.imds import ImdsClient

        cw, ident = self.cfg.cloudwatch, (self.instance.identity if self.instance else None)
        iid = ident.instance_id if ident else None
        region = cw.region or (ident.region if ident else None)
        imds_get = None
        if self.cfg.imds.enabled and ident is not None:
            im = self.cfg.imds
            imds_get = ImdsClient(im.endpoint, timeout=im.timeout, retries=im.retries,
                                  allow_imdsv1=im.allow_imdsv1).get
        ec2_url = self.cfg.instance.ec2_endpoint_url
        checks = self.checks
        return CloudWatchPublisher(
            cw, region=region, instance_id=iid,
            instance_type=self.instance.instance_type if self.instance else self.cfg.instance.type,
            autoscaling_group=(lambda: autoscaling_group_name(
                iid, imds_get, lambda: aws.client("ec2", region, ec2_url))) if iid else None,
            checks=(lambda: checks.state.verdicts) if checks is not None else None,
            probes=self._probe_results, flush_interval=cw.flush_interval)

    def _setup_probes(self, sampler: Sampler) -> None:
        """The probe scheduler, when [probe] names peers or a discovery tag (docs/probe-scheduling.md).
        Imports boto3 only when discovery or the archive is on (and then only when first used)."""
        p = self.cfg.probe
        if not p.peers and not p.discover_tag:
            return
        from agent.exporters.probes import ProbesView
        from agent.probes.service import build_probe_service

        info = self.instance
        ident = info.identity if info is not None else None
        enis = info.enis if info is not None else []
        responder = self.responder
        self.probes = build_probe_service(
            peers=p.peers, interval=p.interval, peers_per_round=p.peers_per_round, duration=p.duration,
            streams=p.streams, credit_floor=p.credit_floor, hourly_budget_bytes=p.hourly_budget_bytes,
            directions=p.directions,
            credits=lambda: sampler.latest.credits if sampler.latest is not None else None,
            profile=lambda: self.profile,
            # A probe while the responder serves a test would measure the two tests competing.
            busy=(lambda: responder.stats.snapshot().busy) if responder is not None else (lambda: False),
            default_port=configmod.split_hostport(self.cfg.responder.listen)[1],
            discover_tag=p.discover_tag, discover_interval=p.discover_interval,
            discover_endpoint_url=p.discover_endpoint_url,
            vpc_id=enis[0].vpc_id if enis else None,
            region=ident.region if ident is not None else None,
            instance_id=ident.instance_id if ident is not None else None,
            instance_type=self.profile.instance_type,
            self_ips=[ip for e in enis for ip in e.local_ipv4s],
            archive_bucket=p.archive.bucket if p.archive.enabled else None,
            archive_prefix=p.archive.prefix, archive_region=p.archive.region,
            archive_endpoint_url=p.archive.endpoint_url, archive_backlog=p.archive.backlog)
        self.services.append(self.probes)
        self.views.append(ProbesView(self.probes.snapshot))
        if responder is not None:
            probes = self.probes
            responder.external_busy = lambda: probes.snapshot().running

    def _vpc_cidrs(self) -> list[str]:
        return list(self.instance.vpc_cidrs) if self.instance is not None else []

    def _probe_results(self) -> list[Any]:
        probes = getattr(self, "probes", None)
        return list(probes.snapshot().results.values()) if probes is not None else []

    def status_line(self, snap: Snapshot) -> str:
        ifs = ",".join(snap.interfaces) or "no interfaces"
        line = f"sampling {ifs} every {self.cfg.sample_interval:g}s"
        if snap.instance_rates:
            line += (f"; in {snap.instance_rates['in'] * 8 / 1e6:.1f} Mbit/s,"
                     f" out {snap.instance_rates['out'] * 8 / 1e6:.1f} Mbit/s")
        return line

    def run(self) -> int:
        self.install_signals()
        self.setup()
        assert self.sampler is not None and self.server is not None
        self.sampler.step()                      # READY only once there is a first sample ...
        self.server.start()                      # ... and the endpoint answers
        for svc in self.services:
            svc.start()
        log.info("burstwatch running: interfaces=%s metrics=http://%s/metrics", ",".join(self.interfaces) or "-",
                 self.cfg.metrics.listen)
        notify("READY=1")
        wd = watchdog_interval()
        last_wd = 0.0
        last_status = 0.0
        next_tick = time.monotonic() + self.cfg.sample_interval
        while not self.stop_event.is_set():
            self.wake.wait(max(0.0, next_tick - time.monotonic()))
            self.wake.clear()
            if self.stop_event.is_set():
                break
            if self._hup:
                self._hup = False
                self.reload()
            now = time.monotonic()
            if now < next_tick:
                continue
            snap = self.sampler.step()
            if self.cloudwatch is not None:
                try:
                    self.cloudwatch.observe(snap)   # copies figures into its aggregator; no network here
                except Exception:
                    log.exception("cloudwatch observe failed")
            # Ticks are anchored to the schedule, not to the end of the step, so the interval does not
            # drift; after a stall (suspend, overload) it skips ahead instead of bursting.
            next_tick += self.cfg.sample_interval
            if next_tick < now:
                next_tick = now + self.cfg.sample_interval
            healthy = snap.collectors.get("netdev") is not None and snap.collectors["netdev"].success
            if wd is not None and healthy and now - last_wd >= wd:
                notify("WATCHDOG=1")
                last_wd = now
            if now - last_status >= 5.0:
                notify("STATUS=" + self.status_line(snap))
                last_status = now
        return self.shutdown()

    def shutdown(self) -> int:
        notify("STOPPING=1")
        deadline = time.monotonic() + 1.5      # systemd's stop must finish well within 2 s
        for svc in reversed(self.services):
            try:
                svc.stop(max(0.1, deadline - time.monotonic()))
            except Exception:
                log.exception("stopping %s failed", svc.name)
        for hook in self.shutdown_hooks:
            try:
                hook()
            except Exception:
                log.exception("shutdown hook failed")
        if self.server is not None:
            self.server.stop()
        log.info("burstwatch stopped")
        return 0


def state_dir_writable(path: str) -> bool:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".write-test"
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False
