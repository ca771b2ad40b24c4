"""Prometheus view of scheduled probes: per peer and direction results, skips by reason, budget, archive."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.exporters import View
from agent.probes.archive import ArchiveStats
from agent.probes.scheduler import SKIP_REASONS
from agent.probes.service import DiscoveryStatus, ProbeState

NS = "burstwatch_probe"
PEER_LABELS = ["peer", "direction"]

# A state with every optional part (discovery, archive) present: rendered once, it names every family this
# view can yield (FAMILIES, which describe() announces).
_EVERY_FAMILY = ProbeState(results={}, runs={}, skipped={}, bytes_total={}, budget_used_bytes=0.0, budget_bytes=0.0,
                           peers=(), rounds=0, next_round_timestamp=0.0, running=False,
                           discovery=DiscoveryStatus(False, 0.0, 0.0, 0), archive=ArchiveStats(0, 0, 0, 0, 0.0))


def _render(st: ProbeState) -> Iterable[Metric]:
    fams = {
        "success": GaugeMetricFamily(f"{NS}_success", "1 when the last probe of this peer and direction "
                                     "completed, 0 when it failed (refused, busy, timed out, ...).",
                                     labels=PEER_LABELS),
        "throughput": GaugeMetricFamily(f"{NS}_throughput_bytes_per_second", "Payload rate the receiver "
                                        "measured in the last successful probe (iperf3 end.sum_received).",
                                        labels=PEER_LABELS),
        "expected": GaugeMetricFamily(f"{NS}_expected_bytes_per_second", "What the pair should get: the "
                                      "lower of the two sizes' allowance (peak with credits, baseline "
                                      "without; the peer's size from discovery, else ours).",
                                      labels=PEER_LABELS),
        "ratio": GaugeMetricFamily(f"{NS}_throughput_ratio", "Last probe's throughput as a fraction of "
                                   "burstwatch_probe_expected_bytes_per_second.", labels=PEER_LABELS),
        "retransmits": GaugeMetricFamily(f"{NS}_retransmits", "TCP retransmits during the last successful "
                                         "probe (sender side, all streams).", labels=PEER_LABELS),
        "rtt": GaugeMetricFamily(f"{NS}_rtt_seconds", "Mean smoothed RTT over the streams of the last "
                                 "successful probe (TCP_INFO).", labels=PEER_LABELS),
        "duration": GaugeMetricFamily(f"{NS}_duration_seconds", "Wall time the last probe took, failures "
                                      "included.", labels=PEER_LABELS),
        "last": GaugeMetricFamily(f"{NS}_last_run_timestamp_seconds", "Unix time the last probe started.",
                                  labels=PEER_LABELS),
        "bytes": GaugeMetricFamily(f"{NS}_last_bytes", "Payload bytes the last probe moved.",
                                   labels=PEER_LABELS),
    }
    for (peer, direction), r in sorted(st.results.items()):
        labels = [peer, direction]
        fams["success"].add_metric(labels, 1.0 if r.success else 0.0)
        fams["duration"].add_metric(labels, r.duration_seconds)
        fams["last"].add_metric(labels, r.timestamp)
        fams["bytes"].add_metric(labels, r.bytes)
        if r.expected_bytes_per_second is not None:
            fams["expected"].add_metric(labels, r.expected_bytes_per_second)
        if r.throughput_bytes_per_second is not None:
            fams["throughput"].add_metric(labels, r.throughput_bytes_per_second)
        ratio = r.throughput_ratio
        if ratio is not None:
            fams["ratio"].add_metric(labels, ratio)
        if r.retransmits is not None:
            fams["retransmits"].add_metric(labels, r.retransmits)
        if r.rtt_seconds is not None:
            fams["rtt"].add_metric(labels, r.rtt_seconds)
    yield from fams.values()

    runs = CounterMetricFamily(f"{NS}_runs", "Probes run, by peer, direction and result "
                               "(success or failure).", labels=[*PEER_LABELS, "result"])
    for (peer, direction, result), n in sorted(st.runs.items()):
        runs.add_metric([peer, direction, result], n)
    yield runs

    skipped = CounterMetricFamily(f"{NS}_skipped", "Probes that were due but did not start, by reason: "
                                  "credit_floor, would_cross_floor, budget, busy, peer_backoff (one per "
                                  "peer and direction), no_peers (one per round).", labels=["reason"])
    for reason in SKIP_REASONS:
        skipped.add_metric([reason], st.skipped.get(reason, 0))
    yield skipped

    nbytes = CounterMetricFamily(f"{NS}_bytes", "Payload bytes moved by scheduled probes, by direction "
                                 "(out: we sent; in: the peer sent).", labels=["direction"])
    for direction, total in sorted(st.bytes_total.items()):
        nbytes.add_metric([direction], total)
    yield nbytes
    yield GaugeMetricFamily(f"{NS}_budget_used_bytes", "Probe bytes in the last hour (sliding window).",
                            value=st.budget_used_bytes)
    yield GaugeMetricFamily(f"{NS}_budget_bytes", "Hourly probe byte budget ([probe] hourly_budget_bytes).",
                            value=st.budget_bytes)
    yield CounterMetricFamily(f"{NS}_rounds", "Scheduling rounds begun since start.", value=st.rounds)
    yield GaugeMetricFamily(f"{NS}_next_round_timestamp_seconds", "Unix time the next round is due.",
                            value=st.next_round_timestamp)
    yield GaugeMetricFamily(f"{NS}_running", "1 while a probe is in flight.", value=1.0 if st.running else 0.0)

    peers = GaugeMetricFamily(f"{NS}_peers", "Peers in the schedule, by source (config or discovered).",
                              labels=["source"])
    by_source = {"config": 0, "discovered": 0}
    for p in st.peers:
        by_source[p.source] = by_source.get(p.source, 0) + 1
    for source, n in sorted(by_source.items()):
        peers.add_metric([source], n)
    yield peers
    info = GaugeMetricFamily(f"{NS}_peer_info", "1 per peer in the schedule, with its source and instance "
                             "type (empty when unknown).", labels=["peer", "source", "instance_type"])
    for p in st.peers:
        info.add_metric([p.key, p.source, p.instance_type or ""], 1.0)
    yield info

    if st.discovery is not None:
        d = st.discovery
        yield GaugeMetricFamily(f"{NS}_discovery_success", "1 when the last tag discovery "
                                "(ec2:DescribeInstances) succeeded; on failure the last good list is kept.",
                                value=1.0 if d.success else 0.0)
        yield GaugeMetricFamily(f"{NS}_discovery_last_success_timestamp_seconds",
                                "Unix time of the last successful tag discovery.", value=d.last_success_timestamp)

    if st.archive is not None:
        a = st.archive
        yield CounterMetricFamily(f"{NS}_archive_uploaded", "Probe documents uploaded to S3.", value=a.uploaded)
        yield CounterMetricFamily(f"{NS}_archive_failed", "S3 uploads that failed after botocore's retries "
                                  "(the object stays in the backlog and is tried again).", value=a.failed)
        yield CounterMetricFamily(f"{NS}_archive_dropped", "Probe documents dropped because the backlog "
                                  "was full (the oldest goes first).", value=a.dropped)
        yield GaugeMetricFamily(f"{NS}_archive_backlog", "Probe documents waiting to be uploaded.",
                                value=a.backlog)
        yield GaugeMetricFamily(f"{NS}_archive_last_success_timestamp_seconds",
                                "Unix time of the last successful upload (0 before the first).",
                                value=a.last_success_timestamp)


class ProbesView(View):
    """Renders `ProbeService.snapshot()`; a scrape never starts a probe or calls AWS.

    Per-probe figures describe the last probe of each (peer, direction); a failed probe sets success 0
    and leaves out the figures it could not measure (throughput, retransmits, RTT, ratio)."""

    FAMILIES = tuple((m.name, m.type) for m in _render(_EVERY_FAMILY))

    def __init__(self, snapshot: Callable[[], Optional[ProbeState]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        st = self._snapshot()
        return _render(st) if st is not None else ()
