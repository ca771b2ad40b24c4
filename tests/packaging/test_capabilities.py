"""The unit's empty CapabilityBoundingSet= holds: every OS read the agent makes works as an unprivileged
user with no capabilities, NoNewPrivileges and MDWE, on a veth with a tbf qdisc in a network namespace.

Why no capability is needed (systemd/burstwatch.service cites it): net/ethtool/ioctl.c lets "anyone"
run the get commands the agent uses (GDRVINFO, GSSET_INFO, GSTRINGS, GSTATS, GCHANNELS, GRINGPARAM,
its `switch (sub_cmd)` before the CAP_NET_ADMIN check); netlink RTM_GET* dumps are unprivileged;
IP_MTU_DISCOVER and binding ports above 1023 need nothing. ETHTOOL_GREGS, which is not in that list,
is asked too: its EPERM proves the process really is unprivileged.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_root_tools
from tests.packaging.debroot import kernel_has_mdwe
from tests.support.lab import Lab

pytestmark = pytest.mark.netns

NOBODY = 65534

PROBE = r"""
import ctypes, errno, fcntl, json, socket, struct, sys
sys.path.insert(0, sys.argv[1])
ifname = sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
out = {"mdwe": libc.prctl(65, 1, 0, 0, 0) == 0 and libc.prctl(66, 0, 0, 0, 0) == 1}  # PR_SET/GET_MDWE
with open("/proc/self/status") as f:
    out["caps"] = {l.split(":")[0]: int(l.split()[1], 16) for l in f if l.startswith("Cap")}
    out["uid"] = __import__("os").getuid()

# The agent's own ethtool reader (agent/readers/ethtool.py): it raises on EPERM, returns None or
# raises NotSupported when the driver lacks an operation.
from agent.readers.ethtool import IoctlEthtoolReader, NotSupported
r = IoctlEthtoolReader()
stats = r.stats(ifname)
out["stats"] = len(stats)
drv = r.driver(ifname)
out["driver"] = drv.driver if drv else None
ch = r.channels(ifname)
out["channels"] = None if ch is None else list(ch)
out["rings"] = "none" if r.rings(ifname) is None else "ok"   # veth has no get_ringparam: None, not EPERM

# ETHTOOL_GREGS (0x4) is privileged: EPERM here proves the probe runs without CAP_NET_ADMIN.
buf = bytearray(struct.pack("=II", 0x4, 0) + b"\0" * 64)
addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
ifr = struct.pack("16sP", ifname.encode(), addr).ljust(40, b"\0")
raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    fcntl.ioctl(raw.fileno(), 0x8946, ifr)
    out["gregs"] = "allowed"
except OSError as exc:
    out["gregs"] = errno.errorcode[exc.errno]

# netlink dumps: links, routes, root qdisc statistics (tc), as the agent reads them.
from agent.readers.links import read_links, read_routes
from agent.readers.tc import TcReader
out["links"] = sorted(read_links())
out["routes"] = len(read_routes())
tc = TcReader()
q = tc.root_qdisc(ifname)
out["qdisc"] = None if q is None else q.kind
tc.close()

# Path MTU: a UDP socket with IP_MTU_DISCOVER=IP_PMTUDISC_DO, then IP_MTU.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)
s.connect(("10.232.0.1", 9))
out["ip_mtu"] = s.getsockopt(socket.IPPROTO_IP, 14)

# The listeners: /metrics and the responder.
for port in (9786, 5201):
    l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    l.bind(("0.0.0.0", port))
    l.listen()
    l.close()
out["bound"] = True
print(json.dumps(out))
"""


def test_agent_os_reads_need_no_capability(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_root_tools("ip", "tc", "setpriv")
    # The checkout may be private to root (CI clones into `mktemp -d`, mode 0700): give the unprivileged
    # user its own world-readable copy of the package, as the packages install it.
    import shutil

    code = tmp_path_factory.mktemp("caps-code")
    shutil.copytree(ROOT / "agent", code / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [code, *code.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    parent, top = code.parent, Path(tempfile.gettempdir())
    while parent not in (top, parent.parent):   # pytest's base temp dirs are 0700 too
        parent.chmod((parent.stat().st_mode & 0o7777) | 0o005)
        parent = parent.parent
    with Lab() as lab:
        ns, peer = lab.host("caps"), lab.host("peer")
        ifname, _ = lab.link(ns, peer, "10.232.0.2/24", "10.232.0.1/24", mtu=9001)
        lab.run(ns, "ip", "route", "add", "default", "via", "10.232.0.1")
        lab.tbf(ns, ifname, rate_bit=100_000_000, burst_bytes=1_000_000)
        proc = lab.run(ns, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                       "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
                       "/usr/bin/python3", "-I", "-c", PROBE, str(code), ifname, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["uid"] == NOBODY
    assert out["caps"] == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0}
    assert out["gregs"] == "EPERM"
    assert out["stats"] > 0 and out["driver"] == "veth"
    assert out["channels"] is not None
    assert out["rings"] == "none"
    assert ifname in out["links"] and out["routes"] >= 2
    assert out["qdisc"] == "tbf"
    assert out["ip_mtu"] == 9001
    assert out["bound"] is True
    if kernel_has_mdwe():  # the reads above ran under MemoryDenyWriteExecute's kernel twin
        assert out["mdwe"] is True


def test_setpriv_really_drops_capabilities() -> None:
    """The harness itself: as root, GREGS gets past the permission check (EOPNOTSUPP on veth)."""
    require_root_tools("ip")
    with Lab() as lab:
        ns, peer = lab.host("capsroot"), lab.host("peer")
        ifname, _ = lab.link(ns, peer, "10.233.0.2/24", "10.233.0.1/24")
        code = ("import ctypes,errno,fcntl,socket,struct\n"
                "buf=bytearray(struct.pack('=II',4,0)+bytes(64))\n"
                "a=ctypes.addressof((ctypes.c_char*len(buf)).from_buffer(buf))\n"
                f"ifr=struct.pack('16sP',{ifname!r}.encode(),a).ljust(40,bytes(1))\n"
                "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                "try:\n fcntl.ioctl(s.fileno(),0x8946,ifr);print('ok')\n"
                "except OSError as e: print(errno.errorcode[e.errno])\n")
        out = lab.run(ns, "/usr/bin/python3", "-I", "-c", code).stdout.strip()
    assert out in ("EOPNOTSUPP", "ENOTSUP", "ok"), out
