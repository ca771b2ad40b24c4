"""The credit estimate and the rate it uses: the contract's names (docs/metrics.md, "Credits")."""

from __future__ import annotations

from agent.models.figures.schema import (
    EXHAUSTION_CAP_SECONDS,
    Figure,
    PerDirection,
    StatusForm,
    credit,
    credit_while_draining,
    instance_rate,
    instance_rate_or_credit,
    shaping_increase,
)

CREDIT_MODEL_INFO = Figure(
    "burstwatch_credit_model_info", "gauge", "credits",
    "What the credit model is doing: estimating, never_exhausts (baseline = peak: no bucket) or unknown_profile; "
    "how its state started (fresh, restored, new_boot).",
    labels=("state", "start"),
    doc="`state`: `estimating`, `never_exhausts` (baseline = peak: no bucket), `unknown_profile`; `start`: `fresh`, "
        "`restored`, `new_boot`")
CREDIT_REMAINING_BYTES = Figure(
    "burstwatch_credit_remaining_bytes", "gauge", "credits",
    "Estimated burst credit left in the bucket.",
    labels=("direction",),
    doc="estimated burst credit left in the bucket",
    read=credit("remaining_bytes", bucket=True),
    cloudwatch=(
        PerDirection("CreditRemainingBytes", "Bytes", "Minimum", False,
                     "estimated burst credit left",
                     credit("remaining_bytes")),
    ),
    status=(StatusForm("remaining_bytes"),))
CREDIT_REMAINING_RATIO = Figure(
    "burstwatch_credit_remaining_ratio", "gauge", "credits",
    "Credit left as a fraction of the bucket (0..1).",
    labels=("direction",),
    doc="the same as a fraction of the bucket (0..1)",
    read=credit("ratio", bucket=True),
    cloudwatch=(
        PerDirection("CreditRemainingRatio", "None", "Minimum", True,
                     "estimated burst credit left, as a fraction of the bucket (0..1)",
                     credit("ratio")),
    ),
    status=(StatusForm("remaining_ratio"),))
CREDIT_BUCKET_BYTES = Figure(
    "burstwatch_credit_bucket_bytes", "gauge", "credits",
    "Bucket size in use (configured, default or learned).",
    labels=("direction",),
    doc="the bucket size in use (configured, default or learned)",
    read=credit("bucket_bytes", bucket=True),
    cloudwatch=(
        PerDirection("CreditBucketBytes", "Bytes", "Maximum", False,
                     "bucket size in use",
                     credit("bucket_bytes")),
    ),
    status=(StatusForm("bucket_bytes"),))
CREDIT_EXHAUSTION_SECONDS = Figure(
    "burstwatch_credit_exhaustion_seconds", "gauge", "credits",
    "Forecast seconds until the bucket is empty at the current rate; +Inf when not draining.",
    labels=("direction",),
    doc="forecast seconds until the bucket is empty at the current rate; `+Inf` when not draining",
    read=credit("exhaustion_seconds"),
    cloudwatch=(
        PerDirection("CreditExhaustionSeconds", "Seconds", "Minimum", True,
                     "forecast seconds until the bucket is empty at the current rate; 31536000 (a year) stands for "
                     "\"not draining\"",
                     credit("exhaustion_seconds", cap=EXHAUSTION_CAP_SECONDS),
                     # sustained over the period, as the alarm reads it (agent/models/cw_alarms.py)
                     rollup="Maximum"),
    ),
    status=(StatusForm("exhaustion_seconds"),))
CREDIT_REFILL_SECONDS = Figure(
    "burstwatch_credit_refill_seconds", "gauge", "credits",
    "Forecast seconds until the bucket is full at the current rate; +Inf when not refilling.",
    labels=("direction",),
    doc="forecast seconds until the bucket is full at the current rate; `+Inf` when not refilling, 0 when full",
    read=credit("refill_seconds", bucket=True),
    cloudwatch=(
        PerDirection("CreditRefillSeconds", "Seconds", "Minimum", False,
                     "seconds until the bucket is full at the current rate; capped like the exhaustion forecast",
                     credit("refill_seconds", cap=EXHAUSTION_CAP_SECONDS)),
    ),
    status=(StatusForm("refill_seconds"),))
CREDIT_SHAPED = Figure(
    "burstwatch_credit_shaped", "gauge", "credits",
    "1 when the shaping signal rose during the last sample.",
    labels=("direction",),
    doc="1 when the shaping signal rose during the last sample (also at the peak)",
    read=credit("shaped"),
    cloudwatch=(
        PerDirection("Shaped", "None", "Maximum", False,
                     "1 when the shaping counter rose, else 0",
                     credit("shaped")),
    ))
CREDIT_EXHAUSTED = Figure(
    "burstwatch_credit_exhausted", "gauge", "credits",
    "1 while the shaper holds traffic at the baseline (bucket empty, confirmed by the shaping signal).",
    labels=("direction",),
    doc="1 while the shaper holds traffic at the baseline (empty bucket, confirmed by the shaping signal and by a "
        "history that could have spent the bucket: [credits.md](credits.md#exhaustion-needs-evidence))",
    read=credit("exhausted", bucket=True),
    cloudwatch=(
        PerDirection("CreditExhausted", "None", "Maximum", False,
                     "1 while the shaper holds the rate at the baseline (bucket empty), else 0",
                     credit("exhausted")),
    ),
    status=(StatusForm("exhausted", "flag"),))
CREDIT_EXHAUSTION_TREND_SECONDS = Figure(
    "burstwatch_credit_exhaustion_trend_seconds", "gauge", "credits",
    "Forecast seconds until the bucket is empty at the net spend rate over the last forecast_window (bursts and "
    "pauses together); +Inf when not draining.",
    labels=("direction",),
    doc="forecast seconds until the bucket is empty at the net spend rate over the last `[credits] forecast_window` "
        "(default 60 s), bursts and pauses together; `+Inf` when not draining, 0 while exhausted "
        "([credits.md](credits.md#two-forecasts))",
    read=credit("exhaustion_trend_seconds"),
    cloudwatch=(
        PerDirection("CreditExhaustionTrendSeconds", "Seconds", "Minimum", True,
                     "the same at the net spend rate over `[credits] forecast_window` (default 60 s: bursts and "
                     "pauses together, [credits.md](credits.md#two-forecasts)); capped the same way",
                     credit("exhaustion_trend_seconds", cap=EXHAUSTION_CAP_SECONDS), rollup="Maximum"),
    ),
    status=(StatusForm("exhaustion_trend_seconds"),))
CREDIT_REFILL_TREND_SECONDS = Figure(
    "burstwatch_credit_refill_trend_seconds", "gauge", "credits",
    "Forecast seconds until the bucket is full at the net rate over the last forecast_window; +Inf when not "
    "refilling.",
    labels=("direction",),
    doc="forecast seconds until the bucket is full at the net rate over the last `forecast_window`; `+Inf` when not "
        "refilling, 0 when full",
    read=credit("refill_trend_seconds", bucket=True),
    status=(StatusForm("refill_trend_seconds"),))
CREDIT_BUCKET_LEARNED_TOTAL = Figure(
    "burstwatch_credit_bucket_learned_total", "counter", "credits",
    "Times the bucket size was corrected from observed shaping.",
    labels=("direction",),
    doc="times the bucket size was corrected from observed shaping",
    read=credit("learned_count", bucket=True))
CREDIT_BUCKET_INFO = Figure(
    "burstwatch_credit_bucket_info", "gauge", "credits",
    "Where the bucket size in use came from and how it was last learned.",
    labels=("direction", "source", "method"),
    doc="where the bucket in use came from (`config`, `learned`, `default`) and how it was last learned (`none`, "
        "`exhaustion`, `unshaped_overrun`)",
    status=(StatusForm("bucket_source", "source"),))
CREDIT_BUCKET_LOW_BYTES = Figure(
    "burstwatch_credit_bucket_low_bytes", "gauge", "credits",
    "The bucket's low estimate: the prior from public measurements, this type's exhaustions or the fleet's.",
    labels=("direction",),
    doc="the bucket's low estimate: the prior (0.2x one hour of baseline), 0.4x the smallest exhaustion seen, "
        "or the configured size ([credits.md](credits.md#the-bucket-as-a-band))",
    read=credit("bucket_low_bytes", bucket=True),
    status=(StatusForm("bucket_low_bytes"),))
CREDIT_BUCKET_HIGH_BYTES = Figure(
    "burstwatch_credit_bucket_high_bytes", "gauge", "credits",
    "The bucket's high estimate: the prior from public measurements, this type's exhaustions or the fleet's.",
    labels=("direction",),
    doc="the bucket's high estimate: the prior (3x one hour of baseline), 1.6x the largest exhaustion seen, or "
        "the configured size ([credits.md](credits.md#the-bucket-as-a-band))",
    read=credit("bucket_high_bytes", bucket=True),
    status=(StatusForm("bucket_high_bytes"),))
CREDIT_BUCKET_OBSERVATIONS = Figure(
    "burstwatch_credit_bucket_observations", "gauge", "credits",
    "Confirmed exhaustions the bucket's band stands on (the recent ones kept in the state file).",
    labels=("direction",),
    doc="confirmed exhaustions the band stands on (at most 8, the recent ones, kept across restarts)",
    read=credit("band_observations", bucket=True),
    status=(StatusForm("bucket_observations"),))
CREDIT_BUCKET_BAND_INFO = Figure(
    "burstwatch_credit_bucket_band_info", "gauge", "credits",
    "Where the bucket's band comes from: default (the prior), fleet, config or learned.",
    labels=("direction", "source"),
    doc="where the band comes from: `default` (the prior), `fleet`, `config` (no band until an exhaustion "
        "contradicts it) or `learned`",
    status=(StatusForm("bucket_band_source", "source"),))
CREDIT_BUCKET_CONTRADICTIONS_TOTAL = Figure(
    "burstwatch_credit_bucket_contradictions_total", "counter", "credits",
    "Exhaustions at a size more than 10 % away from the configured burst_bucket_gbit (kept as the belief).",
    labels=("direction",),
    doc="exhaustions at a size more than 10 % away from the configured `burst_bucket_gbit`, which stays the "
        "belief (also logged)",
    read=credit("contradictions", bucket=True))
CREDIT_REMAINING_LOW_RATIO = Figure(
    "burstwatch_credit_remaining_low_ratio", "gauge", "credits",
    "Credit left as a fraction of the bucket if the bucket is its low estimate (0..1).",
    labels=("direction",),
    doc="credit left as a fraction of the bucket if it is its low estimate (0..1): what `BurstCreditsLow` reads",
    read=credit("remaining_low_ratio", bucket=True),
    status=(StatusForm("remaining_low_ratio"),))
CREDIT_REMAINING_HIGH_RATIO = Figure(
    "burstwatch_credit_remaining_high_ratio", "gauge", "credits",
    "Credit left as a fraction of the bucket if the bucket is its high estimate (0..1).",
    labels=("direction",),
    doc="the same if the bucket is its high estimate (0..1)",
    read=credit("remaining_high_ratio", bucket=True),
    status=(StatusForm("remaining_high_ratio"),))
CREDIT_EXHAUSTION_EARLIEST_SECONDS = Figure(
    "burstwatch_credit_exhaustion_earliest_seconds", "gauge", "credits",
    "The forecast band's early side: seconds until a bucket of the low estimate is empty at the sooner of the "
    "two forecasts (in a pause, when the drain's fastest pace resumes); +Inf when not draining.",
    labels=("direction",),
    doc="the forecast band's early side: seconds until a bucket of the low estimate is empty at the sooner of the "
        "two forecasts, in a pause at the drain's fastest pace resuming now; `+Inf` when not draining. "
        "`BurstCreditsRunningOut` pages on it ([credits.md](credits.md#the-forecast-as-a-band))",
    read=credit("exhaustion_earliest_seconds", bucket=True),
    cloudwatch=(
        PerDirection("CreditExhaustionEarliestSeconds", "Seconds", "Minimum", True,
                     "the forecast band's early side (a bucket of the low estimate of its size) while the bucket "
                     "drains, else 31536000 (a year, \"not draining\"): the side the exhaustion alarm pages on "
                     "([cloudwatch.md](cloudwatch.md#which-side-of-the-band))",
                     credit_while_draining("exhaustion_earliest_seconds", EXHAUSTION_CAP_SECONDS),
                     rollup="Maximum"),
    ),
    status=(StatusForm("exhaustion_earliest_seconds"),))
CREDIT_EXHAUSTION_LATEST_SECONDS = Figure(
    "burstwatch_credit_exhaustion_latest_seconds", "gauge", "credits",
    "The forecast band's late side: seconds until a bucket of the high estimate is empty at the drain's mean "
    "pace; +Inf when not draining or when a pause of a cycle not yet seen may never end.",
    labels=("direction",),
    doc="the forecast band's late side: seconds until a bucket of the high estimate is empty at the drain's mean "
        "pace (half of it until the traffic has shown its cycle); `+Inf` when not draining, and in a pause of a "
        "cycle not yet seen, which may never end",
    read=credit("exhaustion_latest_seconds", bucket=True),
    status=(StatusForm("exhaustion_latest_seconds"),))
CREDIT_DRAINING = Figure(
    "burstwatch_credit_draining", "gauge", "credits",
    "1 while the bucket drains: at the current rate, or at the trend once the drain is two forecast windows old.",
    labels=("direction",),
    doc="1 while the bucket drains: at the current rate, or at the trend once the drain is two forecast windows "
        "old (before that one burst from a full bucket fills the trend's window); what `BurstCreditsRunningOut` "
        "reads with the band's early side",
    read=credit("draining", bucket=True))
SHAPING_PACKETS_TOTAL = Figure(
    "burstwatch_shaping_packets_total", "counter", "credits",
    "Packets the shaper queued or dropped (ENA bw_*_allowance_exceeded summed over interfaces, or tc overlimits), "
    "accounted across counter resets.",
    labels=("direction", "source"),
    doc="packets the shaper queued or dropped: ENA `bw_{in,out}_allowance_exceeded` summed over interfaces "
        "(`source=\"ethtool\"`) or tc overlimits (`source=\"tc\"`), accounted across resets",
    cloudwatch=(
        PerDirection("ShapingEvents", "Count", "Sum", True,
                     "increase of the shaping counter during the period: ENA's `bw_in/bw_out_allowance_exceeded` "
                     "(packets queued or dropped by the shaper) or the tc qdisc's overlimits; a driver reset is "
                     "counted from zero, never as a negative",
                     shaping_increase),
    ),
    status=(StatusForm("shaping_packets_total", "sum"),))
THROUGHPUT_BYTES_PER_SECOND = Figure(
    "burstwatch_throughput_bytes_per_second", "gauge", "credits",
    "Instance rate (all monitored interfaces) over the rate window: the rate the credit estimate uses.",
    labels=("direction",),
    doc="the measured rate the estimate uses (all monitored interfaces, over `rate_window`)",
    read=instance_rate,
    cloudwatch=(
        PerDirection("ThroughputBytesPerSecond", "Bytes/Second", "Average", True,
                     "measured instance throughput, all monitored interfaces",
                     instance_rate_or_credit),
    ),
    status=(StatusForm("rate_bytes_per_second"),))
