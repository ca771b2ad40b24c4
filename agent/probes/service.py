"""The daemon's probe service: a thread that runs the scheduler's probes, records them, and archives them."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from agent import aws
from agent.config import FleetConfig, ProbeConfig
from agent.iperf3.client import ProbeError, ProbeRequest, run_probe
from agent.iperf3.report import summarize
from agent.models.probe_cost import stream_bitrate
from agent.models.profile import BandwidthProfile
from agent.models.units import gbit_to_bytes
from agent.probes.archive import ArchiveStats, S3Archive
from agent.probes.discovery import own_zone, registry_discovery, tag_discovery
from agent.probes.scheduler import DEFAULT_PORT, CreditSource, Peer, ProbePlan, Scheduler, parse_peer

if TYPE_CHECKING:
    from agent.discovery import InstanceInfo

log = logging.getLogger(__name__)

# A failed discovery is retried sooner than a good one is refreshed, but not in a tight loop. The first
# discovery comes at a random point of the first tenth of this, so a fleet restarted at once spreads its calls.
DISCOVER_RETRY = 60.0
# Spread of each discovery around discover_interval (+/- 20 %), as the probe rounds (scheduler.DEFAULT_JITTER).
DISCOVER_JITTER = 0.2
# The thread wakes at least this often (stop requests and discovery do not wait for a round).
MAX_SLEEP = 5.0

Runner = Callable[[ProbeRequest], dict]


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe, per peer and direction; what the metrics view renders."""

    peer: str
    direction: str
    success: bool
    timestamp: float                                # Unix time the probe started
    duration_seconds: float                         # wall time it took, failures included
    bytes: int = 0
    throughput_bytes_per_second: Optional[float] = None   # what the receiver got (end.sum_received)
    retransmits: Optional[int] = None
    rtt_seconds: Optional[float] = None             # mean smoothed RTT over the streams
    expected_bytes_per_second: Optional[float] = None     # what the pair should get (pair_allowance)
    error: Optional[str] = None                     # ProbeError.kind, or "error" / "invalid"

    @property
    def throughput_ratio(self) -> Optional[float]:
        if self.throughput_bytes_per_second is None or not self.expected_bytes_per_second:
            return None
        return self.throughput_bytes_per_second / self.expected_bytes_per_second


@dataclass(frozen=True)
class DiscoveryStatus:
    success: bool
    timestamp: float                # Unix time of the last attempt
    last_success_timestamp: float
    peers: int                      # peers the last good discovery returned
    error: Optional[str] = None
    successes: int = 0              # discoveries run since start, by result
    failures: int = 0


@dataclass(frozen=True)
class ProbeState:
    """Everything the metrics view needs, copied under the service's lock."""

    results: dict[tuple[str, str], ProbeResult]
    runs: dict[tuple[str, str, str], int]           # (peer, direction, success|failure) -> probes
    skipped: dict[str, int]
    bytes_total: dict[str, float]                   # direction -> probe bytes since start
    budget_used_bytes: float
    budget_bytes: float
    peers: tuple[Peer, ...]
    rounds: int
    next_round_timestamp: float                     # Unix time the next round is due
    running: bool                                   # a probe is in flight now
    discovery: Optional[DiscoveryStatus] = None
    archive: Optional[ArchiveStats] = None
    peer_types: dict[str, str] = field(default_factory=dict)


def pair_allowance(direction: str, credits: dict[str, tuple[float, float]],
                   profile: Optional[BandwidthProfile], peer_peak: Optional[float]) -> Optional[float]:
    """What a probe between us and the peer should get, bytes/s: the lower of the two sizes' current
    allowance. Ours is the peak while the direction's bucket holds credit (or has no bucket) and the
    baseline once it is empty. The peer's credit is invisible from here, so its size counts at its peak;
    without its size (no discovery) our own peak stands in. Single-flow limits (5 Gbit/s per flow outside
    a placement group, docs/ec2-network-facts.md "Flow limits") are not applied: probes use several streams."""
    ours: Optional[float] = None
    if profile is not None and profile.peak_bytes_per_second:
        ours = profile.peak_bytes_per_second
        reading = credits.get(direction)
        if reading is not None and reading[0] <= 0 and profile.baseline_bytes_per_second:
            ours = profile.baseline_bytes_per_second
    theirs = peer_peak if peer_peak else (profile.peak_bytes_per_second if profile is not None else None)
    known = [v for v in (ours, theirs) if v]
    return min(known) if known else None


def result_from_document(plan: ProbePlan, doc: dict[str, Any], started: float, seconds: float,
                         expected: Optional[float]) -> ProbeResult:
    """A ProbeResult from an iperf3 --json document (ours or iperf3's own); a document carrying
    iperf3's `error` key, or one that is not iperf3's shape, is a failed probe."""
    if doc.get("error"):
        return ProbeResult(plan.peer.key, plan.direction, False, started, seconds, error="error",
                           expected_bytes_per_second=expected)
    try:
        s = summarize(doc)
    except (KeyError, TypeError, ValueError):
        return ProbeResult(plan.peer.key, plan.direction, False, started, seconds, error="invalid",
                           expected_bytes_per_second=expected)
    return ProbeResult(
        peer=plan.peer.key, direction=plan.direction, success=True, timestamp=started,
        duration_seconds=seconds, bytes=max(s.sent_bytes, s.received_bytes),
        throughput_bytes_per_second=s.received_bits_per_second / 8.0, retransmits=s.retransmits,
        rtt_seconds=s.rtt_mean_seconds, expected_bytes_per_second=expected)


def _catalogue_figure(instance_type: str, attr: str) -> Optional[float]:
    from agent.models.catalogue import catalogue_entry

    try:
        entry = catalogue_entry(instance_type)
    except (OSError, ValueError):
        return None
    value = getattr(entry, attr) if entry is not None else None
    return gbit_to_bytes(value) if value is not None else None


def catalogue_peak(instance_type: str) -> Optional[float]:
    """A size's peak in bytes/s from the bundled catalogue (None when the type is unknown)."""
    return _catalogue_figure(instance_type, "peak_gbps")


def catalogue_baseline(instance_type: str) -> Optional[float]:
    """A size's baseline in bytes/s from the bundled catalogue (None when the type is unknown)."""
    return _catalogue_figure(instance_type, "baseline_gbps")


def capped_bitrate(bitrate: Optional[int], streams: int, peer_baseline: Optional[float]) -> Optional[int]:
    """The plan's per-stream cap, lowered to the peer's baseline when that is smaller: a baseline-capped
    probe that runs above the peer's baseline would spend the peer's credits instead of ours (a forward
    probe its inbound bucket, a reverse one its outbound). Only a capped probe is lowered: rate = "peak"
    means the operator wants the path's most."""
    if bitrate is None or not peer_baseline:
        return bitrate
    return min(bitrate, stream_bitrate(peer_baseline, streams))


class ProbeService:
    """`name="probes"`: asks the scheduler what to do, runs it with `runner` (the engine's run_probe),
    records the result per peer and direction, refreshes discovered peers, and hands successful
    documents to the archive. A failed probe is a result with success=False, never an exception.

    `cfg` is the [probe] section: its peers (named without a port: `default_port`) and its discovery
    interval; `scheduler` runs its schedule (Scheduler.from_config). build_probe_service() makes all three
    from the section, as the daemon does."""

    name = "probes"

    def __init__(self, cfg: ProbeConfig, scheduler: Scheduler, *, default_port: int = DEFAULT_PORT,
                 discover: Optional[Callable[[], Sequence[Peer]]] = None,
                 runner: Runner = run_probe, connect_timeout: float = 5.0,
                 profile: Callable[[], Optional[BandwidthProfile]] = lambda: None,
                 peer_peak: Callable[[str], Optional[float]] = catalogue_peak,
                 peer_baseline: Callable[[str], Optional[float]] = catalogue_baseline,
                 archive: Optional[S3Archive] = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.scheduler = scheduler
        self.default_port = default_port
        self.configured = tuple(parse_peer(p, default_port) for p in cfg.peers)
        self.connect_timeout = connect_timeout
        self.archive = archive
        self._discover = discover
        self._runner = runner
        self._profile = profile
        self._peer_peak = peer_peak
        self._peer_baseline = peer_baseline
        self.wall = wall
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._nudge = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._discovered: tuple[Peer, ...] = ()
        self._discovery: Optional[DiscoveryStatus] = None
        self._next_discovery = scheduler.clock() + scheduler.rng.uniform(0.0, min(DISCOVER_RETRY,
                                                                                 cfg.discover_interval) / 10)
        self._results: dict[tuple[str, str], ProbeResult] = {}
        self._runs: dict[tuple[str, str, str], int] = {}
        with self._lock:
            self.scheduler.set_peers(self.configured)

    @property
    def discover_interval(self) -> float:
        return self.cfg.discover_interval

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.archive is not None:
            self.archive.start()
        self._thread = threading.Thread(target=self._run, name="probes", daemon=True)
        self._thread.start()
        with self._lock:
            peers = len(self.scheduler.peers)
            first = self.scheduler.next_round - self.scheduler.clock()
        log.info("probe scheduler started: %d configured peer(s)%s; first round in %.0fs, then every %gs "
                 "+/- %d%%", peers, ", discovery on" if self._discover else "", first,
                 self.scheduler.interval, round(self.scheduler.jitter * 100))

    def stop(self, timeout: float = 2.0) -> None:
        """Stop after the probe in progress, if any (the thread is a daemon: a probe still running when
        the timeout passes does not hold up the process)."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._nudge.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self.archive is not None:
            self.archive.stop(max(0.05, deadline - time.monotonic()))

    # -- the loop ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a bug must not end probing for the life of the daemon
                log.exception("probe service round failed")
                self._stop.wait(MAX_SLEEP)
                continue
            self._nudge.wait(self.sleep_seconds())
            self._nudge.clear()

    def sleep_seconds(self) -> float:
        with self._lock:
            wait = self.scheduler.wait_seconds()
            if self._discover is not None:
                wait = min(wait, self._next_discovery - self.scheduler.clock())
        return max(0.01, min(wait, MAX_SLEEP))

    def run_once(self) -> Optional[ProbeResult]:
        """One pass: refresh discovery when due, then run the next allowed probe (if any)."""
        if self._discover is not None and self.scheduler.clock() >= self._next_discovery:
            self.refresh_peers()
        with self._lock:
            plan = self.scheduler.poll()
        if plan is None:
            return None
        return self.execute(plan)

    def refresh_peers(self) -> None:
        """Ask discovery for peers; on failure keep the last good list (an API hiccup must not empty it)."""
        assert self._discover is not None
        now_wall = self.wall()
        try:
            found = tuple(self._discover())
        except Exception as exc:
            log.warning("peer discovery failed (%s error), keeping %d discovered peer(s): %s",
                        aws.classify(exc).kind, len(self._discovered), exc)
            last = self._discovery.last_success_timestamp if self._discovery else 0.0
            ok, failed = self._discovery_counts()
            with self._lock:
                self._discovery = DiscoveryStatus(False, now_wall, last, len(self._discovered), str(exc), ok,
                                                  failed + 1)
                self._next_discovery = self.scheduler.clock() + min(DISCOVER_RETRY, self.discover_interval)
            return
        if {p.key for p in found} != {p.key for p in self._discovered}:
            log.info("peer discovery: %d peer(s): %s", len(found), ", ".join(p.key for p in found) or "none")
        ok, failed = self._discovery_counts()
        with self._lock:
            self._discovered = found
            self._discovery = DiscoveryStatus(True, now_wall, now_wall, len(found), None, ok + 1, failed)
            self.scheduler.set_peers(self.configured + found)
            keep = {p.key for p in self.scheduler.peers}
            self._results = {k: v for k, v in self._results.items() if k[0] in keep}
            self._runs = {k: v for k, v in self._runs.items() if k[0] in keep}
            jitter = self.scheduler.rng.uniform(-DISCOVER_JITTER, DISCOVER_JITTER)
            self._next_discovery = self.scheduler.clock() + self.discover_interval * (1.0 + jitter)

    def _discovery_counts(self) -> tuple[int, int]:
        d = self._discovery
        return (d.successes, d.failures) if d is not None else (0, 0)

    def execute(self, plan: ProbePlan) -> ProbeResult:
        """Run one planned probe and record it (the scheduler has marked it in flight)."""
        credits = self.scheduler.credits_now()
        peer_type = plan.peer.instance_type
        peer_peak = self._peer_peak(peer_type) if peer_type else None
        bitrate = capped_bitrate(plan.bitrate, plan.streams, self._peer_baseline(peer_type) if peer_type else None)
        expected = pair_allowance(plan.direction, credits, self._profile(), peer_peak)
        if bitrate is not None:
            # A capped probe should get its cap (when the pair allows that much): the ratio then says
            # whether the network delivers the baseline.
            cap = bitrate * plan.streams / 8.0
            expected = min(expected, cap) if expected else cap
        req = ProbeRequest(host=plan.peer.host, port=plan.peer.port, streams=plan.streams,
                           duration=plan.duration, reverse=plan.direction == "in", bitrate=bitrate,
                           connect_timeout=self.connect_timeout)
        started = self.wall()
        t0 = time.monotonic()
        doc: Optional[dict[str, Any]] = None
        kind: Optional[str] = None
        try:
            doc = self._runner(req)
        except ProbeError as exc:
            kind = exc.kind
            log.warning("peer=%s direction=%s probe failed (%s): %s", plan.peer.key, plan.direction, kind, exc)
        except Exception as exc:
            kind = "error"
            log.error("peer=%s direction=%s probe failed: %s", plan.peer.key, plan.direction, exc)
        seconds = time.monotonic() - t0
        if doc is not None:
            result = result_from_document(plan, doc, started, seconds, expected)
            if not result.success:
                log.warning("peer=%s direction=%s probe failed: %s", plan.peer.key, plan.direction,
                            doc.get("error") or "not an iperf3 document")
        else:
            result = ProbeResult(plan.peer.key, plan.direction, False, started, seconds, error=kind,
                                 expected_bytes_per_second=expected)
        if result.success:
            log.info("peer=%s direction=%s %.1f Mbit/s (%.0f%% of the pair's %s%s), retransmits=%s, rtt=%s",
                     plan.peer.key, plan.direction, (result.throughput_bytes_per_second or 0) * 8 / 1e6,
                     100 * (result.throughput_ratio or 0), _mbit(expected),
                     " cap" if bitrate is not None else "", result.retransmits,
                     f"{result.rtt_seconds * 1000:.2f}ms" if result.rtt_seconds is not None else "-")
        with self._lock:
            self.scheduler.finish(plan, result.success, result.bytes, peer_fault=kind != "busy")
            self._results[(plan.peer.key, plan.direction)] = result
            key = (plan.peer.key, plan.direction, "success" if result.success else "failure")
            self._runs[key] = self._runs.get(key, 0) + 1
        if result.success and doc is not None and self.archive is not None:
            self.archive.submit(doc, started)
        return result

    def reconfigure(self, cfg: ProbeConfig, *, responder_port: Optional[int] = None) -> None:
        """Apply a reloaded [probe] section (SIGHUP): peers and schedule (Scheduler.reconfigure says what
        carries over). The keys marked `restart` in agent/config.py (discovery, the archive) keep their
        running values, and the reload names them in its "takes effect at the next restart" warning.
        `responder_port` (the port of peers named without one) is kept unless given. ValueError, with
        nothing changed, on a malformed peer or bad directions."""
        port = self.default_port if responder_port is None else responder_port
        configured = tuple(parse_peer(p, port) for p in cfg.peers)
        running = {f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(ProbeConfig)
                   if f.metadata.get("restart")}
        with self._lock:
            s = self.scheduler
            s.reconfigure(cfg)
            self.cfg = dataclasses.replace(cfg, **running)
            self.default_port = port
            self.configured = configured
            s.set_peers(self.configured + self._discovered)
            keep = {p.key for p in s.peers}
            self._results = {k: v for k, v in self._results.items() if k[0] in keep}
            self._runs = {k: v for k, v in self._runs.items() if k[0] in keep}
        self._wake()

    def _wake(self) -> None:
        """Cut the thread's current sleep short (it re-reads the schedule)."""
        self._nudge.set()

    # -- the view's side ---------------------------------------------------------------------------------
    def snapshot(self) -> ProbeState:
        with self._lock:
            s = self.scheduler
            return ProbeState(
                results=dict(self._results), runs=dict(self._runs), skipped=dict(s.skipped),
                bytes_total=dict(s.bytes_total), budget_used_bytes=s.budget_used(),
                budget_bytes=float(s.hourly_budget_bytes), peers=s.peers, rounds=s.rounds,
                next_round_timestamp=self.wall() + (s.next_round - s.clock()),
                running=s.in_flight is not None, discovery=self._discovery,
                archive=self.archive.snapshot() if self.archive is not None else None,
                peer_types={p.key: p.instance_type for p in s.peers if p.instance_type})


def _mbit(rate: Optional[float]) -> str:
    return f"{rate * 8 / 1e6:.0f} Mbit/s" if rate else "unknown"


def build_probe_service(cfg: ProbeConfig, *, responder_port: int, credits: CreditSource,
                        profile: Callable[[], Optional[BandwidthProfile]], busy: Callable[[], bool] = lambda: False,
                        instance: Optional[InstanceInfo] = None, runner: Runner = run_probe,
                        fleet: Optional[FleetConfig] = None) -> ProbeService:
    """The service for a [probe] section. `responder_port` is the port of peers named without one (our own
    responder's: a fleet runs one config); `credits` and `profile` return the latest credit readings and
    bandwidth profile; `busy` says when the link is in use otherwise (the responder serving a test);
    `instance` (discovery's) tells discovery and the archive this instance's VPC, zone, addresses, id and
    region; `fleet` is the [fleet] section, whose bucket holds the peer registry ([probe] registry).
    Imports boto3 only when discovery or the archive is on, and then only when first used."""
    def peak() -> Optional[float]:
        p = profile()
        return p.peak_bytes_per_second if p is not None else None

    def baseline() -> Optional[float]:
        p = profile()
        return p.baseline_bytes_per_second if p is not None else None

    sched = Scheduler.from_config(cfg, credits=credits, peak_bytes_per_second=peak,
                                  baseline_bytes_per_second=baseline, busy=busy)
    ident = instance.identity if instance is not None else None
    region = ident.region if ident is not None else None
    instance_id = ident.instance_id if ident is not None else None
    discover: Optional[Callable[[], Sequence[Peer]]] = None
    if cfg.registry and fleet is not None:
        own = profile()
        try:
            discover = registry_discovery(cfg, fleet, instance, responder_port,
                                          own.instance_type if own is not None else None)
            sched.zone = own_zone(instance, registry=True)
        except ValueError as exc:
            log.error("peer registry off: %s", exc)
    elif cfg.discover_tag:
        discover = tag_discovery(cfg, instance, responder_port)
        sched.zone = own_zone(instance, registry=False)

    archive = None
    a = cfg.archive
    if a.enabled and a.bucket:
        own = profile()
        archive = S3Archive(a.bucket, prefix=a.prefix, instance_type=own.instance_type if own is not None else None,
                            region=region, bucket_region=a.region, instance_id=instance_id,
                            endpoint_url=a.endpoint_url, backlog=a.backlog)
    return ProbeService(cfg, sched, default_port=responder_port, discover=discover, runner=runner, profile=profile,
                        archive=archive)
