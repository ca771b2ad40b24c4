"""`burstwatch status`'s allowance section: the conntrack table, the PPS ceiling and link-local drops, from /metrics."""

from __future__ import annotations

from typing import Any, Callable, Optional

from agent.models import figures as F
from agent.readers.daemon_metrics import Sample

# Owners status names (the view exports up to 10; the target is the top 3 by count).
STATUS_OWNERS = 3
# docs/allowances.md, "Link-local": the cause and the remedy status names when those drops happen.
LINKLOCAL_HINT = "likely DNS (uncached lookups): run a local DNS cache (systemd-resolved, dnsmasq, unbound)"


def _all(samples: list[Sample], fig: F.Figure) -> list[Sample]:
    return [s for s in samples if s.name == fig.name]


def _value(samples: list[Sample], fig: F.Figure) -> Optional[float]:
    found = _all(samples, fig)
    return found[0].value if found else None


def _label(samples: list[Sample], fig: F.Figure, label: str) -> Optional[str]:
    found = _all(samples, fig)
    return found[0].labels.get(label) if found else None


def _conntrack(samples: list[Sample]) -> Optional[dict[str, Any]]:
    exceeded = _value(samples, F.CONNTRACK_EXCEEDED_PACKETS_TOTAL)
    flows = _value(samples, F.CONNTRACK_HOST_FLOWS)
    if exceeded is None and flows is None:
        return None
    owners = sorted(_all(samples, F.CONNTRACK_OWNER_FLOWS), key=lambda s: -s.value)[:STATUS_OWNERS]
    return {"size": _value(samples, F.CONNTRACK_SIZE_ENTRIES),
            "size_method": _label(samples, F.CONNTRACK_SIZE_ENTRIES, "method"),
            "available": _value(samples, F.CONNTRACK_AVAILABLE_ENTRIES),
            "in_use_ratio": _value(samples, F.CONNTRACK_IN_USE_RATIO),
            "full_seconds": _value(samples, F.CONNTRACK_FULL_SECONDS),
            "running_out": _value(samples, F.CONNTRACK_RUNNING_OUT) == 1.0,
            "exceeded_total": exceeded, "flows": flows,
            "owners": [{"protocol": s.labels.get("protocol"), "direction": s.labels.get("direction"),
                        "port": int(s.labels.get("port") or 0), "flows": int(s.value)} for s in owners]}


def _pps(samples: list[Sample]) -> Optional[dict[str, Any]]:
    pps = _value(samples, F.PPS_PACKETS_PER_SECOND)
    if pps is None:
        return None
    return {"packets_per_second": pps, "ceiling": _value(samples, F.PPS_CEILING_PACKETS_PER_SECOND),
            "source": _label(samples, F.PPS_CEILING_PACKETS_PER_SECOND, "source"),
            "headroom_ratio": _value(samples, F.PPS_HEADROOM_RATIO),
            "near_ceiling": _value(samples, F.PPS_NEAR_CEILING) == 1.0,
            "exceeded_total": _value(samples, F.PPS_EXCEEDED_PACKETS_TOTAL)}


def _linklocal(samples: list[Sample]) -> Optional[dict[str, Any]]:
    per = {s.labels.get("interface", ""): s.value for s in _all(samples, F.ENA_ALLOWANCE_EXCEEDED_TOTAL)
           if s.labels.get("allowance") == "linklocal"}
    if not per:
        return None
    return {"exceeded_total": sum(per.values()), "by_interface": per,
            "hint": LINKLOCAL_HINT if any(per.values()) else None}


def allowance_status(samples: list[Sample]) -> Optional[dict[str, Any]]:
    """The JSON section (None when the daemon reports none of these figures)."""
    doc = {"conntrack": _conntrack(samples), "pps": _pps(samples), "linklocal": _linklocal(samples)}
    return doc if any(doc.values()) else None


def allowance_lines(doc: Optional[dict[str, Any]], duration: Callable[[Optional[float]], str]) -> list[str]:
    """What a person reads: one line each for the conntrack table, the PPS ceiling and link-local drops."""
    if not doc:
        return []
    lines = []
    c = doc.get("conntrack")
    if c:
        if c["size"] is not None and c["in_use_ratio"] is not None:
            what = (f"{c['in_use_ratio'] * 100:.1f}% of {c['size']:,.0f} ({c['size_method']}) in use, "
                    f"full in {duration(c['full_seconds'])}" + ("  RUNNING OUT" if c["running_out"] else ""))
        else:
            what = "size unknown (the driver reports no conntrack_allowance_available)"
        owners = ", ".join(f"{o['protocol']} {o['direction']} {o['port']} ({o['flows']})" for o in c["owners"])
        lines.append(f"  conntrack: {what}; dropped {int(c['exceeded_total'] or 0)}")
        if owners:
            lines.append(f"      busiest: {owners}  (`burstwatch check` for peers and remedies)")
    p = doc.get("pps")
    if p:
        rate = f"{p['packets_per_second']:,.0f} packets/s"
        if p["ceiling"] is not None:
            rate += (f" of a {p['ceiling']:,.0f}/s ceiling ({p['source']}), "
                     f"{(p['headroom_ratio'] or 0) * 100:.0f}%" + ("  NEAR CEILING" if p["near_ceiling"] else ""))
        else:
            rate += ", no ceiling learned"
        lines.append(f"  pps: {rate}; dropped {int(p['exceeded_total'] or 0)}")
    ll = doc.get("linklocal")
    if ll and ll["exceeded_total"]:
        lines.append(f"  link-local: {int(ll['exceeded_total'])} packets dropped: {ll['hint']}")
    return lines
