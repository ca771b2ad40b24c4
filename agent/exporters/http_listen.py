"""The /metrics server's listening sockets: the TCP port, and the local Unix socket `burstwatch status` reads."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from typing import Optional

log = logging.getLogger(__name__)

# Owner and group read-write: connect(2) on a Unix socket needs write permission on its file (unix(7)), so
# root, the service user and members of its group can connect, nobody else. The directory (0750) adds the same.
SOCKET_MODE = 0o660
DIR_MODE = 0o750


def tcp_listener(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def unix_listener(path: str, backlog: int, create_dir: bool) -> Optional[tuple[socket.socket, int]]:
    """A listening Unix socket at `path` (mode 0660) and its file's inode, or None when it cannot be had:
    the reason is logged and /metrics goes on over TCP alone. The directory is made (0750) only when
    `create_dir`: the default, /run/burstwatch, is systemd's RuntimeDirectory=, whose owner and mode the
    unit sets; without systemd it is absent and the socket is simply off (INFO)."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        if not create_dir:
            log.info("metrics: no local socket: %s does not exist (metrics.socket = %r; under systemd the unit's "
                     "RuntimeDirectory= makes it)", directory, path)
            return None
        try:
            os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            log.warning("metrics: no local socket: cannot make %s for metrics.socket: %s", directory, exc)
            return None
    if not _clear_stale(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # bind(2) made the file with the process umask (0027 under the unit: 0750, which no group member
        # could connect to); chmod before listen(2), so it never accepts under a looser mode.
        os.chmod(path, SOCKET_MODE)
        ino = os.stat(path).st_ino
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        log.warning("metrics: no local socket at %s (metrics.socket): %s; `burstwatch status` falls back to "
                    "metrics.listen", path, exc)
        return None
    sock.setblocking(False)
    return sock, ino


def _clear_stale(path: str) -> bool:
    """Remove a socket file left by a daemon that is gone (kill -9 off systemd); refuse to touch anything
    else, or a socket some live process still answers on. True when `path` is free."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("metrics: no local socket: cannot look at %s: %s", path, exc)
        return False
    if not stat.S_ISSOCK(st.st_mode):
        log.warning("metrics: no local socket: %s exists and is not a socket; leaving it alone", path)
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno != errno.ECONNREFUSED:
            log.warning("metrics: no local socket: %s: %s", path, exc)
            return False
    else:
        log.warning("metrics: no local socket: another process serves %s (a second daemon?)", path)
        return False
    finally:
        probe.close()
    os.unlink(path)
    log.info("metrics: removed a stale socket at %s", path)
    return True


def remove_socket(path: str, ino: int) -> None:
    """Unlink the socket file at stop if it is still the one bound (a newer daemon may have replaced it)."""
    try:
        ours = os.lstat(path).st_ino == ino
    except OSError:
        return
    if ours:
        try:
            os.unlink(path)
        except OSError:
            pass
