"""sd_notify for Type=notify: READY, WATCHDOG, STATUS and STOPPING, through systemd-python."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

try:
    from systemd import daemon as _sd_daemon  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - systemd-python is a dependency; this keeps pip installs without it working
    _sd_daemon = None


def notify(state: str) -> bool:
    """Send one sd_notify state string; a no-op (False) when not run by systemd."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    if _sd_daemon is not None:
        return bool(_sd_daemon.notify(state))
    # Minimal fallback (sd_notify(3) is one datagram) for installs without systemd-python.
    addr = os.environ["NOTIFY_SOCKET"]
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(state.encode(), addr)
        return True
    except OSError as exc:
        log.debug("sd_notify failed: %s", exc)
        return False


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (a third of WatchdogSec), or None when no watchdog is armed."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return int(usec) / 1e6 / 3
    except ValueError:
        return None
