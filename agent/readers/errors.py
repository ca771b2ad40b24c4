"""Errors every layer may raise or catch: defined at the bottom so no import runs back up."""

from __future__ import annotations

import errno


class NotSupported(Exception):
    """There is nothing to read on this host (e.g. no ethtool statistics on lo): logged at DEBUG, not an error."""


class NoSuchInterface(OSError):
    """The interface does not exist (any more): it left between listing and reading."""

    def __init__(self, ifname: str) -> None:
        super().__init__(errno.ENODEV, f"interface={ifname}: no such device")
        self.ifname = ifname
