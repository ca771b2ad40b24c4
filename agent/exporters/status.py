"""`burstwatch status`: a person's view (bars, rates, forecasts) and a JSON document, from /metrics samples."""

from __future__ import annotations

import math
from typing import Any, Optional

from agent.exporters.allowance_status import allowance_lines, allowance_status
from agent.models import figures as F
from agent.models.catalogue import UNKNOWN_TYPE_REMEDY
from agent.models.units import DIRECTIONS, bytes_to_gbit
from agent.readers.daemon_metrics import Sample

BAR = 30


def _find(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def _one(samples: list[Sample], name: str, **labels: str) -> Optional[Sample]:
    found = _find(samples, name, **labels)
    return found[0] if found else None


def _val(samples: list[Sample], name: str, **labels: str) -> Optional[float]:
    s = _one(samples, name, **labels)
    return s.value if s else None


def _field(samples: list[Sample], fig: F.Figure, form: F.StatusForm, direction: str) -> Any:
    """One field of a direction, as the figure's StatusForm says to read its samples."""
    if form.pick == "sum":
        return sum(s.value for s in _find(samples, fig.name, direction=direction))
    s = _one(samples, fig.name, direction=direction)
    if form.pick == "source":
        return s.labels.get("source") if s else None
    if form.pick == "flag":
        return s is not None and s.value == 1.0
    # None from a daemon older than the figure (e.g. the trend forecasts)
    return s.value if s else None


def build_status(samples: list[Sample]) -> dict[str, Any]:
    """The JSON document: identity, profile, credits per direction (the fields the figure table gives a
    StatusForm), shaping, checks, probes, the responder and the fleet."""
    doc: dict[str, Any] = {}
    build = _one(samples, F.BUILD_INFO.name)
    doc["version"] = build.labels.get("version") if build else None
    for key, fig in (("instance", F.INSTANCE_INFO), ("discovery", F.INSTANCE_DISCOVERY_INFO),
                     ("credit_model", F.CREDIT_MODEL_INFO)):
        info = _one(samples, fig.name)
        doc[key] = dict(info.labels) if info else None
    doc["directions"] = {d: {form.key: _field(samples, fig, form, d) for fig, form in F.STATUS_FIELDS}
                         for d in DIRECTIONS}
    checks = [s for s in _find(samples, F.CHECK_STATUS.name) if s.value == 1.0]
    doc["checks"] = [{"check": s.labels.get("check"), "interface": s.labels.get("interface"),
                      "status": s.labels.get("status")} for s in checks]
    doc["probes"] = [{"peer": s.labels.get("peer"), "direction": s.labels.get("direction"),
                      "bytes_per_second": s.value}
                     for s in _find(samples, F.PROBE_THROUGHPUT_BYTES_PER_SECOND.name)]
    doc["responder"] = _responder(samples)
    doc["fleet"] = _fleet(samples)
    doc["allowances"] = allowance_status(samples)
    return doc


def _fleet(samples: list[Sample]) -> Optional[dict[str, Any]]:
    """The fleet's consensus bucket for this type and how many instances stand behind it (None when
    [fleet] is off; docs/fleet.md)."""
    instances = _val(samples, F.FLEET_CONSENSUS_INSTANCES.name)
    if instances is None:
        return None
    return {"consensus_instances": int(instances),
            "consensus_bucket_bytes": _val(samples, F.FLEET_CONSENSUS_BUCKET_BYTES.name),
            "published_total": _val(samples, F.FLEET_PUBLISHED_TOTAL.name),
            "backlog_objects": _val(samples, F.FLEET_BACKLOG_OBJECTS.name)}


def _responder(samples: list[Sample]) -> Optional[dict[str, Any]]:
    """The responder's serving in the last hour against its budget, and its refusals by reason (None when
    the daemon runs no responder)."""
    listening = _val(samples, F.RESPONDER_LISTENING.name)
    if listening is None:
        return None
    return {
        "listening": listening == 1.0,
        "served_last_hour_bytes": {d: _val(samples, F.RESPONDER_SERVED_LAST_HOUR_BYTES.name, direction=d)
                                   for d in DIRECTIONS},
        "hourly_budget_bytes": _val(samples, F.RESPONDER_HOURLY_BUDGET_BYTES.name),
        "hourly_budget_basis": next((s.labels.get("basis")
                                     for s in _find(samples, F.RESPONDER_HOURLY_BUDGET_INFO.name)), None),
        "refused": {s.labels.get("reason", ""): int(s.value)
                    for s in _find(samples, F.RESPONDER_REFUSED_TOTAL.name)},
    }


def _size(nbytes: Optional[float]) -> str:
    """Bytes as a person reads a volume (decimal units, as AWS and the budgets are quoted)."""
    if nbytes is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def json_safe(doc: Any) -> Any:
    """JSON has no Infinity/NaN: a forecast of "never" becomes null (documented in docs/operations.md)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: json_safe(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [json_safe(v) for v in doc]
    return doc


def _gbit(bps: Optional[float]) -> str:
    """Bytes per second as a person reads a link rate: Gbit/s, Mbit/s or kbit/s."""
    if bps is None:
        return "?"
    bits = bps * 8
    if bits >= 1e8:
        return f"{bits / 1e9:.3g} Gbit/s"
    if bits >= 1e5:
        return f"{bits / 1e6:.3g} Mbit/s"
    return f"{bits / 1e3:.3g} kbit/s"


def _duration(seconds: Optional[float]) -> str:
    if seconds is None or math.isnan(seconds):
        return "?"
    if math.isinf(seconds):
        return "never"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{seconds:.1f}s"


def _finite(seconds: Optional[float]) -> bool:
    return seconds is not None and math.isfinite(seconds)


def _forecast(what: str, instant: Optional[float], trend: Optional[float], verb: str) -> str:
    """Both forecasts: at the current rate, and at the trend (the net rate over forecast_window). A bursty
    drain reads +Inf at the current rate in every pause, so then the trend leads."""
    if trend is None:                       # a daemon older than the trend forecast
        return f"{what} in {_duration(instant)}"
    if not _finite(instant) and _finite(trend):
        return f"{what} in {_duration(trend)} at the trend (not {verb} now)"
    return f"{what} in {_duration(instant)} (trend {_duration(trend)})"


def _bits(nbytes: float) -> str:
    """A bucket's size as AWS quotes bandwidth: Tbit or Gbit."""
    bits = nbytes * 8
    return f"{bits / 1e12:.2g} Tbit" if bits >= 1e12 else f"{bits / 1e9:.3g} Gbit"


def _band(v: dict[str, Any], draining: bool) -> Optional[str]:
    """The band (docs/credits.md, "The forecast as a band"): "runs out in 4m00s-11m00s" while draining, and
    "bucket 1.6-2.9 Tbit (learned x3)", with an en dash and a multiplication sign; None from a daemon older
    than the band."""
    low, high = v.get("bucket_low_bytes"), v.get("bucket_high_bytes")
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return None
    source = v.get("bucket_band_source") or "?"
    count = int(v.get("bucket_observations") or 0)
    if source in ("learned", "config") and count:
        source += f" \u00d7{count}"
    lo_text, hi_text = _bits(low), _bits(high)
    unit = hi_text.split()[1]
    if lo_text.split()[1] == unit:
        lo_text = lo_text.split()[0]
    out = f"bucket {lo_text}\u2013{hi_text} ({source})"
    early, late = v.get("exhaustion_earliest_seconds"), v.get("exhaustion_latest_seconds")
    if draining and early is not None:
        late_text = "never (a pause may never end)" if late is None or math.isinf(late) else _duration(late)
        out = f"runs out in {_duration(early)}\u2013{late_text}; " + out
    return out


def render_text(doc: dict[str, Any]) -> str:
    """What a person reads: identity and sources, a bar and forecasts per direction, then checks, probes,
    the fleet and the responder (each only when there is something to say)."""
    lines = _identity(doc)
    state = (doc.get("credit_model") or {}).get("state", "unknown_profile")
    for d, v in doc["directions"].items():
        lines += _direction(d, v, state)
    if state == "unknown_profile":
        itype = (doc.get("instance") or {}).get("instance_type")
        lines.append(f"  no bandwidth figures for type {itype}: {UNKNOWN_TYPE_REMEDY} (docs/instance.md)" if itype
                     else "  no instance type: set [instance] type, or [instance.bandwidth] (docs/instance.md)")
    lines += allowance_lines(doc.get("allowances"), _duration)
    lines += _checks(doc["checks"])
    for p in doc["probes"]:
        lines.append(f"  probe {p['peer']} {p['direction']}: {_gbit(p['bytes_per_second'])}")
    f = doc.get("fleet")
    if f:
        bucket = f["consensus_bucket_bytes"]
        agree = (f"{bytes_to_gbit(bucket):.4g} Gbit from {f['consensus_instances']} instances"
                 if f["consensus_instances"] and bucket is not None else "no consensus yet")
        lines.append(f"  fleet: {agree}; published {int(f['published_total'] or 0)}, "
                     f"waiting {int(f['backlog_objects'] or 0)}")
    r = doc.get("responder")
    if r:
        lines.append(_responder_line(r))
    return "\n".join(lines)


def _identity(doc: dict[str, Any]) -> list[str]:
    lines = []
    inst = doc.get("instance") or {}
    if inst.get("on_ec2") == "true" or inst.get("instance_id"):
        lines.append(f"burstwatch {doc.get('version')}  {inst.get('instance_id', '?')}  "
                     f"{inst.get('instance_type', '?')}  {inst.get('availability_zone', '')}")
    else:
        lines.append(f"burstwatch {doc.get('version')}  off EC2  type {inst.get('instance_type') or 'unknown'}")
    disc = doc.get("discovery") or {}
    if disc:
        lines.append(f"  sources: imds {disc.get('imds', '?')}, type from {disc.get('instance_type_source', '?')}, "
                     f"bandwidth from {disc.get('type_data_source', '?')}, "
                     f"DescribeInstanceTypes {disc.get('api', '?')}")
    return lines


def _direction(d: str, v: dict[str, Any], state: str) -> list[str]:
    """A direction's bar (credit left), when it runs out or fills, its rate against baseline and peak."""
    rate = f"rate {_gbit(v['rate_bytes_per_second'])} (baseline {_gbit(v['baseline_bytes_per_second'])}" \
           f" [{v['baseline_source'] or 'none'}], peak {_gbit(v['peak_bytes_per_second'])}" \
           f" [{v['peak_source'] or 'none'}])"
    ratio = v["remaining_ratio"]
    if ratio is None:
        what = "never exhausts (baseline = peak)" if state == "never_exhausts" else "no profile: no estimate"
        return [f"  {d:<3} {what}  {rate}"]
    filled = int(round(max(0.0, min(1.0, ratio)) * BAR))
    bar = "[" + "#" * filled + "." * (BAR - filled) + "]"
    if v["exhausted"]:
        when = "EMPTY: shaped to the baseline"
    elif _finite(v["exhaustion_seconds"]) or _finite(v["exhaustion_trend_seconds"]):
        when = _forecast("empty", v["exhaustion_seconds"], v["exhaustion_trend_seconds"], "draining")
    elif ratio >= 0.999:
        when = "full"
    else:
        when = _forecast("full", v["refill_seconds"], v["refill_trend_seconds"], "refilling")
    bucket = bytes_to_gbit(v["bucket_bytes"] or 0)
    lines = [f"  {d:<3} {bar} {ratio * 100:5.1f}% of {bucket:.4g} Gbit ({v['bucket_source']})  {when}",
             f"      {rate}  shaped packets {int(v['shaping_packets_total'])}"]
    draining = not v["exhausted"] and (_finite(v["exhaustion_seconds"]) or _finite(v["exhaustion_trend_seconds"]))
    band = _band(v, draining)
    if band is not None:
        lines.append(f"      {band}")
    return lines


def _checks(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return []
    counts: dict[str, int] = {}
    for c in checks:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    lines = ["  checks: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
             + "  (`burstwatch check` for details)"]
    for c in checks:
        if c["status"] in ("fail", "warn"):
            lines.append(f"    {c['status']:<4} {c['check']} {c['interface'] or ''}")
    return lines


def _responder_line(r: dict[str, Any]) -> str:
    served = r["served_last_hour_bytes"]
    budget = r["hourly_budget_bytes"]
    line = (f"  responder {'listening' if r['listening'] else 'NOT listening'}: served in the last hour "
            f"in {_size(served['in'])}, out {_size(served['out'])}")
    if budget is not None:
        # The basis says whether the budget guards credits or, without a bucket, is only a fairness limit.
        basis = {"refill": ", a share of the refill", "link": ", a fairness limit: no burst bucket",
                 "median": ", sized for the median size: this one is unknown"}.get(r.get("hourly_budget_basis") or "",
                                                                                    "")
        line += f" (budget {_size(budget)} each{basis})"
    refused = {k: v for k, v in sorted(r["refused"].items()) if v}
    return line + "; refused " + (", ".join(f"{k} {v}" for k, v in refused.items()) if refused else "none")
