"""Prometheus view of the credit estimate: the contract's burstwatch_credit_* gauges and the shaping signal."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client.core import Metric

from agent.exporters import View, declared, family
from agent.models import figures as F
from agent.sampling.pipeline import Snapshot

# The figures read per direction from each CreditReading (Figure.read), in the order they are yielded.
PER_DIRECTION = (F.CREDIT_REMAINING_BYTES, F.CREDIT_REMAINING_RATIO, F.CREDIT_BUCKET_BYTES,
                 F.CREDIT_EXHAUSTION_SECONDS, F.CREDIT_REFILL_SECONDS, F.CREDIT_SHAPED, F.CREDIT_EXHAUSTED,
                 F.CREDIT_EXHAUSTION_TREND_SECONDS, F.CREDIT_REFILL_TREND_SECONDS, F.CREDIT_BUCKET_LEARNED_TOTAL,
                 F.CREDIT_BUCKET_LOW_BYTES, F.CREDIT_BUCKET_HIGH_BYTES, F.CREDIT_BUCKET_OBSERVATIONS,
                 F.CREDIT_BUCKET_CONTRADICTIONS_TOTAL, F.CREDIT_REMAINING_LOW_RATIO, F.CREDIT_REMAINING_HIGH_RATIO,
                 F.CREDIT_EXHAUSTION_EARLIEST_SECONDS, F.CREDIT_EXHAUSTION_LATEST_SECONDS, F.CREDIT_DRAINING)


class CreditView(View):
    """Renders the credit model's readings and the shaping totals of the latest snapshot; computes nothing."""

    FAMILIES = declared(F.CREDIT_MODEL_INFO, *PER_DIRECTION, F.CREDIT_BUCKET_INFO, F.CREDIT_BUCKET_BAND_INFO,
                        F.SHAPING_PACKETS_TOTAL)

    def __init__(self, latest: Callable[[], Optional[Snapshot]], shaping_source: Callable[[], Optional[str]],
                 restore_note: Callable[[], str]) -> None:
        self._latest = latest
        self._shaping_source = shaping_source
        self._restore_note = restore_note

    def collect(self) -> Iterable[Metric]:
        snap = self._latest()
        if snap is None:
            return
        credits = snap.credits or {}
        state = "unknown_profile"
        if credits:
            state = "estimating" if any(r.bucket_bytes for r in credits.values()) else "never_exhausts"
        info = family(F.CREDIT_MODEL_INFO)
        info.add_metric([state, self._restore_note()], 1)
        yield info

        directions = sorted(credits)
        for fig in PER_DIRECTION:
            assert fig.read is not None
            fam = family(fig)
            for d in directions:
                value = fig.read(snap, d)
                if value is not None:
                    fam.add_metric([d], value)
            yield fam

        binfo = family(F.CREDIT_BUCKET_INFO)
        for d in directions:
            r = credits[d]
            if r.bucket_bytes is not None and r.remaining_bytes is not None:
                binfo.add_metric([d, r.bucket_source, r.learn_method], 1)
        yield binfo

        band = family(F.CREDIT_BUCKET_BAND_INFO)
        for d in directions:
            r = credits[d]
            if r.bucket_bytes is not None and r.remaining_bytes is not None:
                band.add_metric([d, r.band_source], 1)
        yield band

        shaping = family(F.SHAPING_PACKETS_TOTAL)
        if snap.shaping is not None:
            for d, v in sorted(snap.shaping.total.items()):
                shaping.add_metric([d, snap.shaping.source], v)
        yield shaping
