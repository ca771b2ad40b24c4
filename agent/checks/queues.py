"""Check: are all the ENA queues the instance offers in use (combined channels vs vCPUs and the type)?"""

from __future__ import annotations

from agent.checks.base import precheck
from agent.checks.context import CheckContext
from agent.models.checks import OK, SKIP, WARN, Verdict

NAME = "queues"


def run(ctx: CheckContext) -> list[Verdict]:
    return [_one(ctx, ifname) for ifname in ctx.interfaces]


def _one(ctx: CheckContext, ifname: str) -> Verdict:
    pre = precheck(ctx, NAME, ifname, "the ENA queue check")
    if pre is not None:
        return pre
    ch = ctx.channels(ifname)
    if ch is None:
        return Verdict(NAME, ifname, SKIP, "the driver reports no channel settings (ethtool -l)", {})
    # ENA >= 2.2.0 uses combined channels; older drivers reported separate RX/TX counts.
    combined = ch.combined > 0 or ch.max_combined > 0
    in_use = ch.combined if combined else min(ch.rx, ch.tx) or max(ch.rx, ch.tx)
    maximum = ch.max_combined if combined else min(ch.max_rx, ch.max_tx) or max(ch.max_rx, ch.max_tx)
    inst = ctx.instance
    # ENA_Linux_Best_Practices.rst: queues per ENI = MIN(max queues per ENI (8 on most types, up to 32),
    # vCPUs). The driver's maximum is already that minimum for this device; the catalogue's
    # DefaultEnaQueueCountPerInterface says what the type should offer.
    basis = []
    expected = maximum
    if inst.default_queues and inst.vcpus:
        expected = min(inst.vcpus, inst.default_queues)
        basis.append(f"min({inst.vcpus} vCPUs, {inst.default_queues} default queues of "
                     f"{inst.instance_type or 'this type'})")
    elif inst.vcpus and maximum:
        expected = min(inst.vcpus, maximum)
        basis.append(f"min({inst.vcpus} vCPUs, driver maximum {maximum})")
    else:
        basis.append(f"driver maximum {maximum}")
    if maximum:
        expected = min(expected, maximum)
    ev = {"in_use": in_use, "maximum": maximum, "expected": expected, "vcpus": inst.vcpus,
          "default_queues": inst.default_queues, "combined": combined}
    if expected and in_use < expected:
        remedy = (f"sudo ethtool -L {ifname} combined {expected}" if combined
                  else f"sudo ethtool -L {ifname} rx {expected} tx {expected}")
        return Verdict(NAME, ifname, WARN,
                       f"{in_use} of {expected} queues in use ({basis[0]}): fewer vCPUs share the packet "
                       f"processing and the PPS ceiling is lower", ev, remedy)
    if maximum and inst.default_queues and maximum < min(inst.vcpus or maximum, inst.default_queues):
        return Verdict(NAME, ifname, OK, f"{in_use} queues in use, the driver's maximum; the type's default "
                       f"is {inst.default_queues} (fewer interrupt vectors or an older device?)", ev)
    return Verdict(NAME, ifname, OK, f"{in_use} of {expected or in_use} queues in use ({basis[0]})", ev)
