"""Prometheus view of scheduled probes: per peer and direction results, skips by reason, budget, archive."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import Metric

from agent.exporters import View, declared, family
from agent.models import figures as F
from agent.probes.scheduler import SKIP_REASONS
from agent.probes.service import ProbeState

# The per-probe figures (labels peer, direction), each read from a ProbeResult; None leaves the series out.
PER_PROBE = (
    (F.PROBE_SUCCESS, lambda r: 1.0 if r.success else 0.0),
    (F.PROBE_THROUGHPUT_BYTES_PER_SECOND, lambda r: r.throughput_bytes_per_second),
    (F.PROBE_EXPECTED_BYTES_PER_SECOND, lambda r: r.expected_bytes_per_second),
    (F.PROBE_THROUGHPUT_RATIO, lambda r: r.throughput_ratio),
    (F.PROBE_RETRANSMITS, lambda r: r.retransmits),
    (F.PROBE_RTT_SECONDS, lambda r: r.rtt_seconds),
    (F.PROBE_DURATION_SECONDS, lambda r: r.duration_seconds),
    (F.PROBE_LAST_RUN_TIMESTAMP_SECONDS, lambda r: r.timestamp),
    (F.PROBE_LAST_BYTES, lambda r: r.bytes),
)


def _render(st: ProbeState) -> Iterable[Metric]:
    results = sorted(st.results.items())
    for fig, read in PER_PROBE:
        fam = family(fig)
        for (peer, direction), r in results:
            value = read(r)
            if value is not None:
                fam.add_metric([peer, direction], value)
        yield fam

    runs = family(F.PROBE_RUNS_TOTAL)
    for (peer, direction, result), n in sorted(st.runs.items()):
        runs.add_metric([peer, direction, result], n)
    yield runs

    skipped = family(F.PROBE_SKIPPED_TOTAL)
    for reason in SKIP_REASONS:
        skipped.add_metric([reason], st.skipped.get(reason, 0))
    yield skipped

    nbytes = family(F.PROBE_BYTES_TOTAL)
    for direction, total in sorted(st.bytes_total.items()):
        nbytes.add_metric([direction], total)
    yield nbytes
    yield family(F.PROBE_BUDGET_USED_BYTES, st.budget_used_bytes)
    yield family(F.PROBE_BUDGET_BYTES, st.budget_bytes)
    yield family(F.PROBE_ROUNDS_TOTAL, st.rounds)
    yield family(F.PROBE_NEXT_ROUND_TIMESTAMP_SECONDS, st.next_round_timestamp)
    yield family(F.PROBE_RUNNING, 1.0 if st.running else 0.0)

    peers = family(F.PROBE_PEERS)
    by_source = {"config": 0, "discovered": 0}
    for p in st.peers:
        by_source[p.source] = by_source.get(p.source, 0) + 1
    for source, n in sorted(by_source.items()):
        peers.add_metric([source], n)
    yield peers
    info = family(F.PROBE_PEER_INFO)
    for p in st.peers:
        info.add_metric([p.key, p.source, p.instance_type or ""], 1.0)
    yield info

    if st.discovery is not None:
        d = st.discovery
        yield family(F.PROBE_DISCOVERY_SUCCESS, 1.0 if d.success else 0.0)
        yield family(F.PROBE_DISCOVERY_LAST_SUCCESS_TIMESTAMP_SECONDS, d.last_success_timestamp)
        runs = family(F.PROBE_DISCOVERIES_TOTAL)
        runs.add_metric(["success"], d.successes)
        runs.add_metric(["failure"], d.failures)
        yield runs

    if st.archive is not None:
        a = st.archive
        yield family(F.PROBE_ARCHIVE_UPLOADED_TOTAL, a.uploaded)
        yield family(F.PROBE_ARCHIVE_FAILED_TOTAL, a.failed)
        yield family(F.PROBE_ARCHIVE_DROPPED_TOTAL, a.dropped)
        yield family(F.PROBE_ARCHIVE_BACKLOG, a.backlog)
        yield family(F.PROBE_ARCHIVE_LAST_SUCCESS_TIMESTAMP_SECONDS, a.last_success_timestamp)


class ProbesView(View):
    """Renders `ProbeService.snapshot()`; a scrape never starts a probe or calls AWS.

    Per-probe figures describe the last probe of each (peer, direction); a failed probe sets success 0
    and leaves out the figures it could not measure (throughput, retransmits, RTT, ratio)."""

    FAMILIES = declared(*(fig for fig, _ in PER_PROBE), F.PROBE_RUNS_TOTAL, F.PROBE_SKIPPED_TOTAL,
                        F.PROBE_BYTES_TOTAL, F.PROBE_BUDGET_USED_BYTES, F.PROBE_BUDGET_BYTES, F.PROBE_ROUNDS_TOTAL,
                        F.PROBE_NEXT_ROUND_TIMESTAMP_SECONDS, F.PROBE_RUNNING, F.PROBE_PEERS, F.PROBE_PEER_INFO,
                        F.PROBE_DISCOVERY_SUCCESS, F.PROBE_DISCOVERY_LAST_SUCCESS_TIMESTAMP_SECONDS,
                        F.PROBE_DISCOVERIES_TOTAL,
                        F.PROBE_ARCHIVE_UPLOADED_TOTAL, F.PROBE_ARCHIVE_FAILED_TOTAL, F.PROBE_ARCHIVE_DROPPED_TOTAL,
                        F.PROBE_ARCHIVE_BACKLOG, F.PROBE_ARCHIVE_LAST_SUCCESS_TIMESTAMP_SECONDS)

    def __init__(self, snapshot: Callable[[], Optional[ProbeState]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        st = self._snapshot()
        return _render(st) if st is not None else ()
