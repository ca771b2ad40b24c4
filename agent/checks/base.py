"""Helpers shared by the checks: driver classes and the verdict a missing interface gets."""

from __future__ import annotations

from typing import Optional

from agent.checks.context import CheckContext
from agent.models.checks import FAIL, SKIP, Verdict

ENA = "ena"
IXGBEVF = "ixgbevf"       # Intel 82599 VF: the enhanced networking before ENA (up to 10 Gbit/s)
NETFRONT = ("vif", "xen-netfront", "xen_netfront")   # Xen PV network: enhanced networking off


def missing(check: str, ifname: str) -> Verdict:
    return Verdict(check, ifname, FAIL, f"interface {ifname} does not exist", {"exists": False},
                   "ip -br link   # list the interfaces; fix `interfaces` in the config")


def not_ena(check: str, ifname: str, driver: Optional[str], what: str) -> Verdict:
    return Verdict(check, ifname, SKIP, f"{what} applies to ENA; {ifname} uses {driver or 'no known driver'}",
                   {"driver": driver})


def precheck(ctx: CheckContext, check: str, ifname: str, what: str) -> Optional[Verdict]:
    """The verdict for an interface that is gone or not ENA, or None when the ENA check should run."""
    if not ctx.exists(ifname):
        return missing(check, ifname)
    driver = ctx.driver_name(ifname)
    if driver != ENA:
        return not_ena(check, ifname, driver, what)
    return None
