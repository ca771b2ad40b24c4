"""Read interface MAC addresses from sysfs and match IMDS's ENIs to Linux interface names."""

from __future__ import annotations

import logging
import os
import re
from typing import Iterable, NamedTuple, Optional

log = logging.getLogger(__name__)

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class NetIf(NamedTuple):
    """What sysfs says about one interface, enough to find it by MAC."""

    name: str
    mac: Optional[str]       # lower-case, None when the interface has no Ethernet address
    has_device: bool         # backed by a device (PCI function), not a virtual interface


def read_net_interfaces(sysfs: str = "/sys") -> dict[str, tuple[str, bool]]:
    """name -> (raw text of address, has a device link) for every interface in class/net."""
    base = os.path.join(sysfs, "class", "net")
    out: dict[str, tuple[str, bool]] = {}
    try:
        names = sorted(os.listdir(base))
    except OSError as exc:
        log.debug("cannot list %s: %s", base, exc)
        return out
    for name in names:
        try:
            with open(os.path.join(base, name, "address"), encoding="ascii") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue  # not an interface directory (bonding_masters) or no address
        out[name] = (text, os.path.exists(os.path.join(base, name, "device")))
    return out


def parse_mac(text: str) -> Optional[str]:
    """A colon-separated 6-byte MAC in lower case, or None (loopback's 00:00:00:00:00:00, tunnels)."""
    mac = text.strip().lower()
    if not _MAC.match(mac) or mac == "00:00:00:00:00:00":
        return None
    return mac


def parse_net_interfaces(raw: dict[str, tuple[str, bool]]) -> list[NetIf]:
    return [NetIf(name, parse_mac(text), dev) for name, (text, dev) in sorted(raw.items())]


def match_macs(macs: Iterable[str], interfaces: Iterable[NetIf]) -> dict[str, str]:
    """mac -> interface name for each MAC found on an interface.

    VLANs, bridges, macvlans and bonds can carry an ENI's MAC too; the interface backed by a device
    (the ENA PCI function) wins, then the alphabetically first name, so the answer is stable."""
    by_mac: dict[str, list[NetIf]] = {}
    for nif in interfaces:
        if nif.mac:
            by_mac.setdefault(nif.mac, []).append(nif)
    out: dict[str, str] = {}
    for mac in macs:
        cands = by_mac.get(mac.strip().lower())
        if cands:
            out[mac.strip().lower()] = sorted(cands, key=lambda n: (not n.has_device, n.name))[0].name
    return out
