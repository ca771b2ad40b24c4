"""The replay summary's pure parts: an alert's `for:` as Prometheus applies it, and the size that holds a trace."""

from __future__ import annotations

from agent.models.replay import AlertRule, Candidate, SizeFit

G = 1e9 / 8


def test_an_alert_pages_once_per_episode_after_its_for() -> None:
    a = AlertRule("X", 60.0)
    for t in range(0, 200):
        a.observe(float(t), 10 <= t < 69 or 100 <= t < 200)   # 59 s: pending only; then 100 s: one page at 160
    assert (a.pages, a.first, a.fired_at) == (1, 160.0, [160.0])
    a.observe(200.0, False)
    for t in range(201, 262):
        a.observe(float(t), True)
    assert a.pages == 2 and a.fired_at[-1] == 261.0


def fit_of(rates: list[float], seconds: int = 1, window: float = 3600.0) -> SizeFit:
    sizes = [Candidate("s", 0.75 * G, 10 * G, 0.75 * G * 3600), Candidate("m", 1.25 * G, 10 * G, 1.25 * G * 3600),
             Candidate("big", 10 * G, 10 * G, None)]
    fit = SizeFit(sizes, window=window)
    for r in rates:
        fit.observe(seconds, r * seconds * G, 0.0)
    return fit


def test_the_smallest_size_covers_the_sustained_mean_and_its_bucket_never_empties() -> None:
    # two hours at 1 Gbit/s: the small size's baseline is under it; the medium's covers it
    fit = fit_of([1.0] * 7200)
    assert fit.sustained[0] == 1.0 * G and fit.smallest() is not None and fit.smallest().instance_type == "m"
    # a 10-minute burst at 6 Gbit/s: its hour averages 1 Gbit/s; it empties the small size's bucket
    # (600 s x 5.25 Gbit/s > 2700 Gbit), not the medium's (600 s x 4.75 < 4500)
    fit = fit_of([6.0] * 600 + [0.0] * 3600, seconds=1)
    assert abs(fit.sustained[0] - 1.0 * G) < 1e-6 * G and fit.emptied == [True, False, False]
    assert fit.smallest().instance_type == "m"
    # a trace shorter than the window: its whole mean
    fit = fit_of([2.0] * 60 + [0.0] * 60)
    assert fit.sustained[0] == 1.0 * G
    # nothing holds 20 Gbit/s
    assert fit_of([20.0] * 4000).smallest() is None


def test_sustained_is_the_highest_full_window_mean_at_any_interval() -> None:
    fit = fit_of([0.0] * 12 + [3.0] * 12 + [0.0] * 12, seconds=300)    # 5-min samples: 1 h at 3 Gbit/s
    assert abs(fit.sustained[0] - 3.0 * G) < 1e-6 * G
