"""Read an interface's driver from sysfs: the bound driver's name and its module's version."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional


class SysfsDriver(NamedTuple):
    driver: Optional[str]          # basename of /sys/class/net/IF/device/driver; None for virtual devices
    module_version: Optional[str]  # /sys/module/DRIVER/version: set by out-of-tree builds (ena 2.x.yg)
    exists: bool                   # /sys/class/net/IF exists


def read_sysfs_driver(ifname: str, sysfs: str = "/sys") -> SysfsDriver:
    """The driver bound to `ifname`'s device, and the version its module declares (if any).

    The in-tree ENA module sets no MODULE_VERSION, so /sys/module/ena/version exists only for the
    out-of-tree (GitHub) driver (docs/ec2-network-facts.md, "Driver identity")."""
    base = os.path.join(sysfs, "class/net", ifname)
    if not os.path.isdir(base):
        return SysfsDriver(None, None, False)
    link = os.path.join(base, "device/driver")
    if not os.path.islink(link):
        return SysfsDriver(None, None, True)
    name = os.path.basename(os.readlink(link))
    try:
        with open(os.path.join(sysfs, "module", name, "version"), encoding="utf-8") as f:
            version: Optional[str] = f.read().strip() or None
    except OSError:
        version = None
    return SysfsDriver(name, version, True)
