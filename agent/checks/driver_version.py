"""Check: which ENA driver (out-of-tree or in-tree) and which of the features that matter it reports."""

from __future__ import annotations

from agent.checks.base import precheck
from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, WARN, Verdict
from agent.models.ena import (
    ALLOWANCE_STATS,
    V_ALLOWANCE,
    V_CONNTRACK_AVAILABLE,
    V_ENA_EXPRESS_STATS,
    V_ENAV3,
    ena_features,
    parse_ena_version,
)

NAME = "driver_version"

UPGRADE = ("modinfo ena | grep -E '^(filename|version)'\n"
           "# in-tree driver: update the kernel (e.g. `sudo dnf upgrade kernel`, `sudo apt install linux-aws`)\n"
           "# out-of-tree: install the current driver from https://github.com/amzn/amzn-drivers "
           "(kernel/linux/ena, DKMS), then reboot")


def _v(n: tuple[int, int, int]) -> str:
    return ".".join(map(str, n))


def run(ctx: CheckContext) -> list[Verdict]:
    return [_one(ctx, ifname) for ifname in ctx.interfaces]


def _one(ctx: CheckContext, ifname: str) -> Verdict:
    pre = precheck(ctx, NAME, ifname, "the ENA driver version check")
    if pre is not None:
        return pre
    info = ctx.driver(ifname)
    ver = parse_ena_version(info.version if info else "", ctx.sysfs_driver(ifname).module_version)
    what = f"ena {ver.text or '?'} ({ver.kind}" + (", kernel release as version)" if ver.kind == "in-tree"
                                                  and ver.number is None else ")")
    stats = ctx.stats(ifname)
    ev: dict = {"version": ver.text, "kind": ver.kind, "number": _v(ver.number) if ver.number else None}
    if stats is None:
        return Verdict(NAME, ifname, WARN, f"{what}: no ethtool statistics readable, features unknown", ev,
                       f"ethtool -S {ifname}")
    f = ena_features(stats)
    ev.update({"allowance_counters": list(f.allowance), "conntrack_allowance_available": f.conntrack_available,
               "ena_express_stats": f.ena_express_stats, "ena_express_mode": f.ena_express_mode})
    notes = []
    if ver.number is not None and ver.number < V_ENAV3:
        notes.append(f"older than {_v(V_ENAV3)}: degraded on ENAv3 devices (most 6th-generation types)")
    if not f.allowance:
        if ver.kind == "out-of-tree" and ver.number is not None and ver.number >= V_ALLOWANCE:
            why = f"the driver is new enough (>= {_v(V_ALLOWANCE)}), the device does not report them"
            remedy = ("# nothing to upgrade: this device (instance family) does not report ENI statistics; "
                      "burstwatch falls back to [credits] shaping_source = tc or none")
        else:
            why = f"they need ENA >= {_v(V_ALLOWANCE)} or a kernel whose in-tree ena has them"
            remedy = UPGRADE
        return Verdict(NAME, ifname, FAIL,
                       f"{what}: no allowance counters, so shaping is invisible; {why}"
                       + ("; " + "; ".join(notes) if notes else ""), ev, remedy)
    missing = [k for k in ALLOWANCE_STATS if k not in f.allowance]
    have = [f"allowance counters ({len(f.allowance)}/{len(ALLOWANCE_STATS)})"]
    if f.conntrack_available:
        have.append("conntrack_allowance_available")
    elif ver.number is not None and ver.kind == "out-of-tree" and ver.number >= V_CONNTRACK_AVAILABLE:
        notes.append("the device does not expose conntrack_allowance_available")
    if f.ena_express_stats:
        mode = f.ena_express_mode or 0
        state = "on" if mode & 1 else "off"
        extra = ", UDP" if mode & 2 else ""
        have.append(f"ENA Express stats (ENA Express {state}{extra})")
    elif ctx.instance.ena_srd_supported:
        notes.append(f"{ctx.instance.instance_type} supports ENA Express but the driver reports no ENA Express "
                     f"statistics (they need ENA >= {_v(V_ENA_EXPRESS_STATS)})")
    summary = f"{what}: " + ", ".join(have) + ("; " + "; ".join(notes) if notes else "")
    if missing:
        return Verdict(NAME, ifname, WARN, summary + f"; missing {', '.join(missing)}", ev, UPGRADE)
    if ver.number is not None and ver.number < V_ENAV3:
        return Verdict(NAME, ifname, WARN, summary, ev, UPGRADE)
    return Verdict(NAME, ifname, OK, summary, ev)
