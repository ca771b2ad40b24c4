"""The allow list across namespaces: a responder in A allows B's link, not C's."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import require_root_tools
from tests.support.iperf3 import listening, wait_until
from tests.support.lab import Lab

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.netns


def probe_from(lab: Lab, ns: str, target: str) -> dict:
    """`burstwatch probe --json` run inside namespace `ns` (via the CLI function, as the command will)."""
    code = textwrap.dedent(f"""
        import argparse, sys
        from agent.commands import probe as cli
        from agent.commands import probe_options as options
        p = argparse.ArgumentParser(); options.add_probe_arguments(p)
        sys.exit(cli.cmd_probe(p.parse_args([{target!r}, "-t", "1", "-P", "2", "--json"])))
    """)
    proc = lab.run(ns, sys.executable, "-c", code, check=False, timeout=30)
    return {"rc": proc.returncode, "doc": json.loads(proc.stdout), "stderr": proc.stderr}


def test_only_allowed_networks_may_test(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_root_tools("ip", "iperf3")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # An unshaped veth moves tens of Gbit/s: lift the hourly serving budget, which is not tested here.
    conf = tmp_path / "responder.toml"
    conf.write_text("[responder]\nhourly_budget_bytes = 1125899906842624\n"
                    "hourly_budget_per_source_bytes = 1125899906842624\n")
    with Lab() as lab:
        a, b, c = lab.host("a"), lab.host("b"), lab.host("c")
        lab.link(a, b, "10.77.1.1/24", "10.77.1.2/24")
        lab.link(a, c, "10.77.2.1/24", "10.77.2.2/24")
        code = textwrap.dedent(f"""
            import argparse, sys
            from agent.commands import probe as cli
            sys.exit(cli.cmd_responder(argparse.Namespace(config={str(conf)!r}, listen="0.0.0.0:5201",
                                                          allow=["10.77.1.0/24"])))
        """)
        resp = lab.popen(a, sys.executable, "-c", code, text=True)
        wait_until(lambda: listening(5201, a), timeout=15, what="responder in namespace a")

        allowed = probe_from(lab, b, "10.77.1.1:5201")
        denied = probe_from(lab, c, "10.77.2.1:5201")
        iperf_allowed = lab.run(b, "iperf3", "-c", "10.77.1.1", "-t", "1", check=False)
        iperf_denied = lab.run(c, "iperf3", "-c", "10.77.2.1", "-t", "1", check=False)

        resp.send_signal(signal.SIGTERM)
        _, log = resp.communicate(timeout=15)

    assert allowed["rc"] == 0, allowed["stderr"]
    assert allowed["doc"]["end"]["sum_received"]["bytes"] > 0
    assert denied["rc"] == 1
    assert "peer 10.77.2.1:5201: access denied: source 10.77.2.2 is not in the responder's allow list" \
        in denied["stderr"]
    assert iperf_allowed.returncode == 0, iperf_allowed.stderr
    assert iperf_denied.returncode == 1 and "the server is busy running a test" in iperf_denied.stderr
    assert log.count("refused peer=10.77.2.2 reason=not_allowed") == 2
    assert "responder stopped: 2 tests completed, 0 aborted, 2 refused" in log


def test_a_scoped_link_local_entry_allows_only_its_own_link(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 13, row 8: `fe80::%v1a/64` lost its scope id, so a link-local peer on any link got in. A has
    a link to B (v1a) and one to C (v2a); only B may test, over link-local addresses."""
    require_root_tools("ip")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    conf = tmp_path / "responder.toml"
    conf.write_text("[responder]\nhourly_budget_bytes = 1125899906842624\n"
                    "hourly_budget_per_source_bytes = 1125899906842624\n")
    with Lab() as lab:
        a, b, c = lab.host("a"), lab.host("b"), lab.host("c")
        v1a, v1b = lab.link(a, b, None, None)
        v2a, v2b = lab.link(a, c, None, None)
        for ns, dev, addr in ((a, v1a, "fe80::a1"), (a, v2a, "fe80::a2"), (b, v1b, "fe80::b"), (c, v2b, "fe80::c")):
            lab.run(ns, "ip", "-6", "addr", "add", f"{addr}/64", "dev", dev, "nodad")
        code = textwrap.dedent(f"""
            import argparse, sys
            from agent.commands import probe as cli
            sys.exit(cli.cmd_responder(argparse.Namespace(config={str(conf)!r}, listen="[::]:5201",
                                                          allow=["fe80::%{v1a}/64"])))
        """)
        resp = lab.popen(a, sys.executable, "-c", code, text=True)
        wait_until(lambda: listening(5201, a), timeout=15, what="responder in namespace a")
        allowed = probe_from(lab, b, f"[fe80::a1%{v1b}]:5201")
        denied = probe_from(lab, c, f"[fe80::a2%{v2b}]:5201")
        resp.send_signal(signal.SIGTERM)
        _, log = resp.communicate(timeout=15)
    assert allowed["rc"] == 0, allowed["stderr"] + log
    assert allowed["doc"]["end"]["sum_received"]["bytes"] > 0
    assert denied["rc"] == 1 and "is not in the responder's allow list" in denied["stderr"], denied["stderr"]
    assert "responder stopped: 1 tests completed, 0 aborted, 1 refused" in log
