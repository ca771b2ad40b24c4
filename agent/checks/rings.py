"""Check: RX/TX descriptor ring sizes, and advice when receive drops or overruns are rising."""

from __future__ import annotations

import re

from agent.checks.base import missing
from agent.checks.context import CheckContext
from agent.models.checks import OK, SKIP, WARN, Verdict
from agent.models.ena import ALLOWANCE_STATS

NAME = "rings"
RX_SUGGESTED = 4096   # ENA_Linux_Best_Practices.rst: `ethtool -G eth0 rx 4096` when CPU spikes drop packets
_TX_QUEUE_STOP = re.compile(r"^queue_\d+_tx_queue_stop$")


def _sum(stats: dict[str, int], pattern: re.Pattern) -> int:
    return sum(v for k, v in stats.items() if pattern.match(k))


def run(ctx: CheckContext) -> list[Verdict]:
    return [_one(ctx, ifname) for ifname in ctx.interfaces]


def _one(ctx: CheckContext, ifname: str) -> Verdict:
    if not ctx.exists(ifname):
        return missing(NAME, ifname)
    rings = ctx.rings(ifname)
    if rings is None:
        return Verdict(NAME, ifname, SKIP, f"the driver ({ctx.driver_name(ifname) or '?'}) reports no ring "
                       "settings (ethtool -g)", {})
    ev: dict = {"rx": rings.rx, "rx_max": rings.rx_max, "tx": rings.tx, "tx_max": rings.tx_max}
    sizes = f"rx ring {rings.rx} (max {rings.rx_max}), tx ring {rings.tx} (max {rings.tx_max})"
    b, a = ctx.before.get(ifname), ctx.after.get(ifname)
    if b is None or a is None or a.time <= b.time:
        return Verdict(NAME, ifname, OK, f"{sizes}; receive-drop trend unknown (one reading)", ev)
    window = a.time - b.time
    lost = max(0, a.rx.lost - b.rx.lost)
    stops = max(0, _sum(a.ethtool, _TX_QUEUE_STOP) - _sum(b.ethtool, _TX_QUEUE_STOP))
    limited = {k: a.ethtool[n] - b.ethtool.get(n, 0) for k, n in ALLOWANCE_STATS.items()
               if k in ("bw_out", "pps") and n in a.ethtool and a.ethtool[n] > b.ethtool.get(n, 0)}
    ev.update({"window_seconds": round(window, 3), "rx_lost": lost, "tx_queue_stops": stops,
               "allowance_exceeded": limited,
               "rx_dropped": a.rx.rx_dropped - b.rx.rx_dropped, "rx_overruns": a.rx.rx_over - b.rx.rx_over})
    if lost:
        if rings.rx < rings.rx_max:
            target = min(rings.rx_max, max(RX_SUGGESTED, rings.rx * 2))
            return Verdict(NAME, ifname, WARN,
                           f"receive drops/overruns rising (+{lost} in {window:.0f}s) with {sizes}: a larger RX "
                           "ring absorbs short vCPU stalls", ev, f"sudo ethtool -G {ifname} rx {target}")
        return Verdict(NAME, ifname, WARN,
                       f"receive drops/overruns rising (+{lost} in {window:.0f}s) with the RX ring already at its "
                       f"maximum ({rings.rx}): the vCPUs serving the queues are starved",
                       ev, "mpstat -P ALL 1 5; grep Tx-Rx /proc/interrupts   # spread the load (irqbalance, RPS) "
                       "or use a larger size")
    if stops and limited:
        # ENA best practices: queue_stop rising together with pps/bw_out allowance counters = the
        # instance's limit, not the ring.
        kinds = ", ".join(sorted(limited))
        return Verdict(NAME, ifname, WARN,
                       f"TX queues stopping (+{stops}) while the {kinds} allowance is exceeded: the instance's limit "
                       f"is reached, a bigger ring will not help; {sizes}", ev,
                       "# a larger size or a newer generation raises the allowance")
    return Verdict(NAME, ifname, OK, f"{sizes}; no receive drops in the last {window:.0f}s", ev)
