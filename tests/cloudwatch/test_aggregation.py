"""The aggregation's instance-wide "sample" series (the allowances' CloudWatch forms): read from each snapshot."""

from __future__ import annotations

from types import SimpleNamespace

from agent.cloudwatch.aggregation import Aggregation


def test_sample_forms_are_read_from_each_snapshot_without_a_direction() -> None:
    agg = Aggregation(60, ["ConntrackInUseRatio", "PpsHeadroomRatio"])
    for t, share, headroom in ((0.5, 0.25, 0.5), (10.0, 0.75, None), (61.0, 0.9, 0.1)):
        snap = SimpleNamespace(wall_time=t, instance_rates=None, shaping=None, credits=None,
                               conntrack=SimpleNamespace(in_use_ratio=share),
                               pps=SimpleNamespace(headroom_ratio=headroom))
        agg.observe(snap)  # type: ignore[arg-type]
    datums = {(d.name, d.timestamp): d for d in agg.close(60.0)}
    ct = datums["ConntrackInUseRatio", 0.0]
    assert (ct.sample_count, ct.minimum, ct.maximum) == (2.0, 0.25, 0.75)
    assert ct.dims == ()
    pps = datums["PpsHeadroomRatio", 0.0]
    assert (pps.sample_count, pps.maximum) == (1.0, 0.5)           # a sample with no ceiling sends nothing
    assert ("ConntrackInUseRatio", 60.0) not in datums             # the next period is still open
