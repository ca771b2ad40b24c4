"""`burstwatch replay`: a traffic history through the daemon's own credit model, one instance type at a time
(docs/replay.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any, Iterable, Iterator, Optional, TextIO, cast

from agent import config as configmod
from agent.commands.replay_options import ReplayError
from agent.exporters.credit_view import CreditView
from agent.exporters.openmetrics_file import OpenMetricsFile
from agent.models import catalogue
from agent.models.credit_model import CreditEstimator, CreditReading, estimator_for
from agent.models.profile import DEFAULT_BUCKET_SECONDS, GBIT, BandwidthProfile, resolve_profile
from agent.models.replay import Candidate, SizeFit, TypeSummary
from agent.models.shaping import ShapingReading
from agent.readers.trace import TraceError, TraceRow, read_trace

EXIT_OK, EXIT_USAGE = 0, 2


@dataclasses.dataclass
class ReplaySnapshot:
    """The part of a sampler Snapshot (agent/sampling/pipeline.py) the credit view reads."""

    credits: Optional[dict[str, CreditReading]] = None
    shaping: Optional[ShapingReading] = None
    instance_rates: Optional[dict[str, float]] = None


def new_estimator(profile: BandwidthProfile, credits: configmod.CreditsConfig) -> CreditEstimator:
    """The estimator the daemon starts with for `profile` (agent/models/credit_model.py estimator_for, as
    agent/sampling/credits.py builds it) on a fresh state directory without a fleet: a replay starts from a
    full bucket, the profile's belief and its prior band."""
    return estimator_for(profile, credits)


class TypeRun:
    """One --type: its profile, the model, the summary and (for --openmetrics) the credit view."""

    def __init__(self, instance_type: str, cfg: configmod.Config, fit: Optional[SizeFit]) -> None:
        entry = catalogue.catalogue_entry(instance_type)
        bw = cfg.instance.bandwidth
        if entry is None and bw.baseline_gbps is None:
            raise ReplayError(f"unknown instance type {instance_type!r}: not in the bundled catalogue; set "
                              "[instance.bandwidth] baseline_gbps and peak_gbps in --config")
        self.profile = resolve_profile(instance_type, bw, None, entry)
        self.estimator = new_estimator(self.profile, cfg.credits)
        self.summary = TypeSummary(instance_type, self.profile.baseline_bytes_per_second,
                                   self.profile.peak_bytes_per_second, self.profile.bucket_bytes,
                                   self.profile.bucket_source, fit=fit)
        self.snap = ReplaySnapshot()
        self.shaping_total = {"in": 0, "out": 0}
        self.view = CreditView(lambda: cast(Any, self.snap), lambda: "ethtool", lambda: "fresh")

    def feed(self, row: TraceRow) -> dict[str, CreditReading]:
        nbytes = {"in": row.in_bytes, "out": row.out_bytes}
        rates = {d: v / row.dt for d, v in nbytes.items()}
        # As the daemon: the increase of bw_*_allowance_exceeded per direction, None without a shaping source.
        increase = {d: n for d, n in (("in", row.in_shaped), ("out", row.out_shaped)) if n is not None}
        readings = self.estimator.update(row.dt, nbytes, rates, increase or None)
        self.summary.observe(row.t, row.dt, readings)
        shaping = None
        if increase:
            for d, n in increase.items():
                self.shaping_total[d] += n
            shaping = ShapingReading("ethtool", increase, {d: self.shaping_total[d] for d in increase})
        self.snap = ReplaySnapshot(readings, shaping, rates)
        return readings

    def families(self) -> Iterable[Any]:
        return self.view.collect()


def family_candidates(instance_type: str) -> list[Candidate]:
    """The catalogue's sizes of the type's family (the part before the dot), smallest baseline first."""
    fam = instance_type.split(".", 1)[0]
    out = []
    for name, e in catalogue.load_catalogue().items():
        if name.split(".", 1)[0] != fam or e.baseline_gbps is None or e.peak_gbps is None:
            continue
        base, peak = e.baseline_gbps * GBIT, max(e.peak_gbps, e.baseline_gbps) * GBIT
        out.append((base, e.vcpus or 0, name, Candidate(name, base, peak,
                                                        base * DEFAULT_BUCKET_SECONDS if peak > base else None)))
    return [c for *_, c in sorted(out, key=lambda x: (x[0], x[1], x[2]))]


def _rows(args: argparse.Namespace, cfg: configmod.Config) -> Iterator[TraceRow]:
    if args.cloudwatch:
        from agent.commands.replay_cloudwatch import cloudwatch_rows

        return cloudwatch_rows(args, cfg)
    if not args.trace:
        raise ReplayError("give a TRACE.csv or --cloudwatch INSTANCE_ID")
    return read_trace(args.trace)


def replay(args: argparse.Namespace) -> list[TypeSummary]:
    cfg = configmod.load(args.config)
    if args.bucket_gbit is not None:
        if not (args.bucket_gbit > 0 and math.isfinite(args.bucket_gbit)):
            raise ReplayError(f"--bucket-gbit {args.bucket_gbit:g}: must be a number > 0")
        bw = dataclasses.replace(cfg.instance.bandwidth, burst_bucket_gbit=args.bucket_gbit)
        cfg = dataclasses.replace(cfg, instance=dataclasses.replace(cfg.instance, bandwidth=bw))
    if args.openmetrics and len(args.types) != 1:
        raise ReplayError("--openmetrics takes one --type (the file holds one instance's series)")
    fits: dict[str, SizeFit] = {}
    runs = []
    for t in args.types:
        fam = t.split(".", 1)[0]
        if fam not in fits:
            fits[fam] = SizeFit(family_candidates(t))
        runs.append(TypeRun(t, cfg, fits[fam]))
    try:
        om = OpenMetricsFile(args.openmetrics) if args.openmetrics else None
    except OSError as exc:
        raise ReplayError(f"--openmetrics {args.openmetrics}: cannot write there: {exc.strerror or exc}") from None
    first = runs[0]
    try:
        for row in _rows(args, cfg):
            for fit in fits.values():
                fit.observe(row.dt, row.in_bytes, row.out_bytes)
            for run in runs:
                run.feed(row)
            if om is not None:
                om.add(row.t, first.families())
    except BaseException:
        if om is not None:
            om.discard()
        raise
    if om is not None:
        om.close()
    return [r.summary for r in runs]


def _when(t: Optional[float]) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def render(summaries: list[TypeSummary], out: TextIO) -> None:
    """One row per type and direction: the summary a person reads (docs/replay.md, "The summary")."""
    head = ("type", "bucket", "dir", "shaped at baseline", "first shaped", "lowest credit",
            "pages RunningOut/Low", "smallest size that holds it")
    rows = [head]
    for s in summaries:
        bucket = "none" if s.bucket is None else f"{s.bucket / GBIT:.0f} Gbit ({s.bucket_source})"
        fit = s.fit.smallest() if s.fit is not None else None
        for d, ds in sorted(s.directions.items()):
            low = "-" if ds.lowest_ratio is None else f"{100 * ds.lowest_ratio:.0f} % at {_when(ds.lowest_at)}"
            rows.append((s.instance_type, bucket, d, _duration(ds.shaped_seconds), _when(ds.first_shaped), low,
                         f"{ds.running_out.pages}/{ds.low.pages}",
                         (fit.instance_type if fit else "none in the family") if d == "in" or len(s.directions) == 1
                         else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
    if summaries and summaries[0].fit is not None:
        sus = summaries[0].fit.sustained
        out.write(f"sustained demand (highest 1-h mean): in {sus[0] * 8 / 1e9:.3g} Gbit/s, "
                  f"out {sus[1] * 8 / 1e9:.3g} Gbit/s over {_duration(summaries[0].seconds)} of trace\n")


def cmd_replay(args: argparse.Namespace, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    try:
        summaries = replay(args)
    except (ReplayError, TraceError) as exc:
        print(f"burstwatch replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        json.dump({"types": [s.to_json() for s in summaries]}, out, indent=2, allow_nan=False,
                  default=lambda v: None)
        out.write("\n")
    else:
        render(summaries, out)
    return EXIT_OK
