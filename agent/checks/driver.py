"""Check: is enhanced networking (ENA) on for each monitored interface?"""

from __future__ import annotations

from agent.checks.base import ENA, IXGBEVF, NETFRONT, missing
from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, WARN, Verdict

NAME = "driver"

# AWS: ENA is enabled per instance (attribute enaSupport) and needs the ena module in the AMI; the
# instance must be stopped to change the attribute (EC2 User Guide, "Enable enhanced networking").
ENABLE_ENA = ("modinfo ena   # the AMI needs the ena module\n"
              "aws ec2 stop-instances --instance-ids $INSTANCE_ID\n"
              "aws ec2 modify-instance-attribute --instance-id $INSTANCE_ID --ena-support\n"
              "aws ec2 start-instances --instance-ids $INSTANCE_ID")
ENABLE_SRIOV = ("modinfo ixgbevf\n"
                "aws ec2 stop-instances --instance-ids $INSTANCE_ID\n"
                "aws ec2 modify-instance-attribute --instance-id $INSTANCE_ID --sriov-net-support simple\n"
                "aws ec2 start-instances --instance-ids $INSTANCE_ID")
MOVE_TO_NITRO = ("# move to a current-generation (Nitro) type with an ENA-enabled AMI "
                 "(e.g. c4 -> c6i, m4 -> m6i, r4 -> r6i)")
WHY = ("lower bandwidth and PPS, higher latency, and no allowance counters, so shaping is invisible to "
       "burstwatch")


def run(ctx: CheckContext) -> list[Verdict]:
    return [_one(ctx, ifname) for ifname in ctx.interfaces]


def _one(ctx: CheckContext, ifname: str) -> Verdict:
    if not ctx.exists(ifname):
        return missing(NAME, ifname)
    info = ctx.driver(ifname)
    sysfs = ctx.sysfs_driver(ifname)
    driver = ctx.driver_name(ifname)
    inst = ctx.instance
    ev = {"driver": driver, "version": info.version if info else None,
          "bus_info": info.bus_info if info else None, "sysfs_driver": sysfs.driver,
          "instance_type": inst.instance_type, "ena_support": inst.ena_support, "on_ec2": inst.on_ec2}
    itype = inst.instance_type or "this type"
    ena_capable = inst.ena_support in ("supported", "required")
    if driver == ENA:
        note = ""
        if inst.ena_support == "unsupported":
            note = f" (the catalogue says {itype} does not support ENA: is instance.type right?)"
        version = f" {info.version}" if info and info.version else ""
        return Verdict(NAME, ifname, OK, f"ena{version}: enhanced networking (ENA) is on{note}", ev)
    if driver == IXGBEVF:
        if ena_capable:
            return Verdict(NAME, ifname, WARN,
                           f"ixgbevf: the older Intel 82599 VF enhanced networking (up to 10 Gbit/s, no allowance "
                           f"counters) although {itype} supports ENA ({inst.ena_support})", ev, ENABLE_ENA)
        return Verdict(NAME, ifname, WARN,
                       "ixgbevf: the older Intel 82599 VF enhanced networking (up to 10 Gbit/s, no allowance "
                       "counters); current-generation types use ENA", ev, MOVE_TO_NITRO)
    if driver in NETFRONT:
        remedy = ENABLE_ENA if ena_capable else ENABLE_SRIOV + "\n" + MOVE_TO_NITRO
        return Verdict(NAME, ifname, FAIL,
                       f"{driver} (Xen netfront): enhanced networking is off: {WHY}", ev, remedy)
    where = ""
    if inst.on_ec2 is False:
        where = " (and IMDS gave no instance identity: this does not look like an EC2 instance)"
    return Verdict(NAME, ifname, FAIL,
                   f"driver {driver or 'unknown'} is not ENA{where}; on EC2 that means enhanced networking is "
                   f"off: {WHY}", ev,
                   f"ethtool -i {ifname}\n" + (ENABLE_ENA if ena_capable or inst.on_ec2 else MOVE_TO_NITRO))
