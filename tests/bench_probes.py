"""`make bench` part 3: burstwatch's probe engine against iperf3, each tool end to end on the same path.

Loopback: `iperf3 -c` -> `iperf3 -s` against `burstwatch probe` -> the burstwatch responder, each side in its
own process as the tools are deployed, 4 streams and 1 stream, alternating runs and taking the median.
Targets (issue 6): burstwatch/iperf3 >= 1.0 with 4 streams, >= 0.9 with 1 stream. The mixed pairs
(burstwatch -> iperf3 -s, iperf3 -c -> responder) are reported too: there the slower peer sets the pace.
Shaped link: a 200 Mbit/s tbf between two lab namespaces; both tools' received rate against the shaper's
(target: within 5 %).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
SECONDS = 3
RUNS = 3
SHAPED_RATE = 200_000_000

Report = Callable[[str, float], None]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _probe_cmd(host: str, port: int, streams: int, seconds: float, netns: Optional[str] = None) -> list[str]:
    code = textwrap.dedent(f"""
        import json
        from agent.iperf3.client import ProbeRequest, run_probe
        print(json.dumps(run_probe(ProbeRequest({host!r}, {port}, streams={streams}, duration={seconds}))))
    """)
    cmd = [sys.executable, "-c", code]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def _iperf3_cmd(host: str, port: int, streams: int, seconds: float, netns: Optional[str] = None) -> list[str]:
    cmd = ["iperf3", "-c", host, "-p", str(port), "-t", str(int(seconds)), "-P", str(streams), "--json"]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def _received_bps(cmd: list[str]) -> float:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env(), check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {proc.stderr.strip() or proc.stdout[-300:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return float(doc["end"]["sum_received"]["bits_per_second"])


class _Servers:
    """`iperf3 -s` and a burstwatch responder (standalone process, caps lifted) on free ports."""

    def __init__(self, netns: Optional[str] = None, bind: str = "127.0.0.1") -> None:
        from tests.support.iperf3 import free_port, wait_listening

        self.netns = netns
        self.iperf_port, self.bw_port = (5201, 5202) if netns else (free_port(), free_port())
        self.tmp = tempfile.TemporaryDirectory()
        conf = Path(self.tmp.name) / "bench.toml"
        conf.write_text(f'[responder]\nlisten = "{bind}:{self.bw_port}"\nallow = ["0.0.0.0/0"]\n'
                        "max_duration = 600.0\nmax_streams = 128\nmax_bytes = 1125899906842624\n"
                        "max_tests_per_hour = 100000\nhourly_budget_bytes = 1125899906842624\n"
                        "hourly_budget_per_source_bytes = 1125899906842624\n")
        code = (f"import argparse, sys\nfrom agent.commands import probe as cli\nsys.exit(cli.cmd_responder("
                f"argparse.Namespace(config={str(conf)!r}, listen=None, allow=None)))")
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.procs = [
            subprocess.Popen([*prefix, "iperf3", "-s", "-p", str(self.iperf_port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL),
            subprocess.Popen([*prefix, sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=_env()),
        ]
        for port in (self.iperf_port, self.bw_port):
            wait_listening(port, netns)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.tmp.cleanup()


def loopback(report: Report) -> None:
    servers = _Servers()
    try:
        for streams in (4, 1):
            runs: dict[str, list[float]] = {"iperf3": [], "burstwatch": [], "burstwatch_to_iperf3": [],
                                            "iperf3_to_burstwatch": []}
            for _ in range(RUNS):  # interleaved, so drift on the machine hits both tools alike
                runs["iperf3"].append(_received_bps(_iperf3_cmd("127.0.0.1", servers.iperf_port, streams, SECONDS)))
                runs["burstwatch"].append(_received_bps(_probe_cmd("127.0.0.1", servers.bw_port, streams, SECONDS)))
                runs["burstwatch_to_iperf3"].append(
                    _received_bps(_probe_cmd("127.0.0.1", servers.iperf_port, streams, SECONDS)))
                runs["iperf3_to_burstwatch"].append(
                    _received_bps(_iperf3_cmd("127.0.0.1", servers.bw_port, streams, SECONDS)))
            med = {k: statistics.median(v) for k, v in runs.items()}
            for k, v in med.items():
                report(f"probe_loopback_{streams}s_{k}_gbps", v / 1e9)
            report(f"probe_loopback_{streams}s_ratio", med["burstwatch"] / med["iperf3"])
            report(f"probe_loopback_{streams}s_ratio_client_vs_iperf3_server",
                   med["burstwatch_to_iperf3"] / med["iperf3"])
            report(f"probe_loopback_{streams}s_ratio_server_vs_iperf3_client",
                   med["iperf3_to_burstwatch"] / med["iperf3"])
            target = 1.0 if streams == 4 else 0.9
            gbps = {k: [round(x / 1e9, 2) for x in v] for k, v in runs.items()}
            print(f"  -> {streams} stream(s): burstwatch/iperf3 = {med['burstwatch'] / med['iperf3']:.2f} "
                  f"(target >= {target}); runs in Gbit/s {json.dumps(gbps)}", flush=True)
    finally:
        servers.close()


def shaped(report: Report) -> None:
    if os.geteuid() != 0:
        print("  shaped link: skipped (needs root for network namespaces)", flush=True)
        return
    from tests.support.lab import Lab

    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        ia, _ = lab.link(a, b, "10.77.8.1/24", "10.77.8.2/24")
        # The tbf's burst is ~1 ms at the rate (and above rate/HZ), so the bucket flatters a 3 s run by
        # < 0.1 %.
        lab.tbf(a, ia, SHAPED_RATE, burst_bytes=256 * 1024)
        servers = _Servers(netns=b, bind="0.0.0.0")
        try:
            figures = {
                "iperf3": _received_bps(_iperf3_cmd("10.77.8.2", servers.iperf_port, 4, SECONDS, netns=a)),
                "burstwatch": _received_bps(_probe_cmd("10.77.8.2", servers.bw_port, 4, SECONDS, netns=a)),
                "burstwatch_to_iperf3": _received_bps(
                    _probe_cmd("10.77.8.2", servers.iperf_port, 4, SECONDS, netns=a)),
            }
        finally:
            servers.close()
    for k, v in figures.items():
        report(f"probe_shaped_{k}_mbps", v / 1e6)
        report(f"probe_shaped_{k}_vs_shaper", v / SHAPED_RATE)
    print(f"  -> shaped {SHAPED_RATE / 1e6:.0f} Mbit/s: " + ", ".join(
        f"{k} {v / SHAPED_RATE:.3f}" for k, v in figures.items()) + " of the shaper's rate (target within 5 %; "
        "TCP payload is ~96.5 % of the IP bytes tbf counts at MTU 1500)", flush=True)


def bench(report: Report) -> None:
    loopback(report)
    shaped(report)


if __name__ == "__main__":
    bench(lambda name, value: print(f"  {name:<56} {value:10.4f}", flush=True))
