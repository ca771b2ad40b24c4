"""`make bench`: figures as ratios against peers measured in the same run (never asserted as timings).

1. Overhead: burstwatch (1 s sampling, CloudWatch off) beside Debian's prometheus-node-exporter (netdev and
   ethtool collectors only), both scraped once a second for 60 s: CPU seconds and peak RSS, and the ratios.
   Targets: CPU ratio <= 0.7, RSS ratio <= 1.3 (issue 19), the daemon run as the packages run it.
2. Credits: the lab's figures against issue 4's targets (tests/support/credit_scenarios.py), then the traffic
   zoo (tests/support/credit_zoo.py): every shape in both directions, one table row each, against issue 12's
   targets (`make bench BENCH=zoo` runs the zoo alone); then the pure model at EC2's own scale
   (tests/support/credit_ec2.py, `make bench BENCH=ec2`), whose table it writes into docs/credits.md.
3. Probes: burstwatch's engine against iperf3 on loopback and on a shaped link (tests/bench_probes.py).
4. Fleet: 20 real daemons against one moto server behind a counting proxy, 120 s: each API's calls against the
   model behind docs/fleet.md, then the extrapolated table at 10, 1,000 and 100,000 instances
   (tests/support/fleet_run.py, `make bench BENCH=fleet`).
5. Allowances: the nftables lab's PPS ceiling, conntrack size, forecast and flow owners against issue 22's
   targets (`make bench BENCH=allowances`).
6. Replay: issue 28's zoo through `burstwatch replay --openmetrics` with the shipped rules evaluated by a real
   Prometheus, and a week of 1-s samples replayed (tests/support/replay_zoo.py, `make bench BENCH=replay`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS: dict[str, float] = {}


def report(name: str, value: float) -> None:
    RESULTS[name] = value
    print(f"  {name:<48} {value:12.4f}", flush=True)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and of the children it has waited for (the check rounds)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def _peak_rss_bytes(pid: int) -> int:
    """VmHWM: the kernel's own peak RSS (psutil reports only the current RSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _wait(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


def overhead(seconds: float = 60.0) -> None:
    print("overhead: burstwatch vs prometheus-node-exporter (netdev + ethtool), scraped every 1 s", flush=True)
    exporter = shutil.which("prometheus-node-exporter")
    if exporter is None:
        raise SystemExit("prometheus-node-exporter is missing: `make test-deps` installs it")
    tmp = Path(tempfile.mkdtemp(prefix="bw-bench-"))
    cfg = tmp / "burstwatch.toml"
    cfg.write_text(f"""
sample_interval = 1.0
state_dir = "{tmp / 'state'}"
[metrics]
listen = "127.0.0.1:19786"
[imds]
timeout = 0.2
retries = 0
[responder]
listen = "127.0.0.1:15201"
allow = ["127.0.0.0/8"]
[cloudwatch]
enabled = false
""")
    cfg.write_text(cfg.read_text())
    # Run as the packages run it (tests/support/launch.py): the launcher, its interpreter flags and the unit's
    # environment, on Debian's own libraries, with the agent from this tree. A venv would add ~2 MiB.
    from tests.support.launch import launcher_argv, unit_env

    bw = subprocess.Popen([*launcher_argv(ROOT), "run", "--config", str(cfg)], cwd=ROOT, env=unit_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ne = subprocess.Popen([exporter, "--collector.disable-defaults", "--collector.netdev", "--collector.ethtool",
                           "--web.listen-address=127.0.0.1:19100"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        urls = {"burstwatch": "http://127.0.0.1:19786/metrics", "node_exporter": "http://127.0.0.1:19100/metrics"}
        for u in urls.values():
            _wait(u)
        # Past start-up, and past the first check round: its child's CPU would otherwise land in the window.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and b"burstwatch_check_runs_total 1" not in \
                urllib.request.urlopen(urls["burstwatch"], timeout=5).read():
            time.sleep(0.5)
        time.sleep(2.0)
        cpu0 = {"burstwatch": _cpu_seconds(bw.pid), "node_exporter": _cpu_seconds(ne.pid)}
        series = {}
        step_ms: list[float] = []
        end = time.monotonic() + seconds
        tick = time.monotonic()
        while time.monotonic() < end:
            for name, u in urls.items():
                body = urllib.request.urlopen(u, timeout=5).read()
                series[name] = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
                if name == "burstwatch":
                    for line in body.splitlines():
                        if line.startswith(b"burstwatch_sample_duration_seconds "):
                            step_ms.append(float(line.split()[1]) * 1e3)
            tick += 1.0
            time.sleep(max(0.0, tick - time.monotonic()))
        cpu = {"burstwatch": _cpu_seconds(bw.pid) - cpu0["burstwatch"],
               "node_exporter": _cpu_seconds(ne.pid) - cpu0["node_exporter"]}
        rss = {"burstwatch": _peak_rss_bytes(bw.pid), "node_exporter": _peak_rss_bytes(ne.pid)}
    finally:
        for p in (bw, ne):
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    report("burstwatch cpu seconds / 60 s", cpu["burstwatch"])
    report("node_exporter cpu seconds / 60 s", cpu["node_exporter"])
    report("burstwatch peak rss MiB", rss["burstwatch"] / 2**20)
    report("node_exporter peak rss MiB", rss["node_exporter"] / 2**20)
    step_ms.sort()
    report("burstwatch sampling step ms (median)", step_ms[len(step_ms) // 2])
    report("burstwatch sampling step ms (max)", step_ms[-1])
    report("burstwatch series per scrape", series["burstwatch"])
    report("node_exporter series per scrape", series["node_exporter"])
    report("cpu ratio burstwatch/node_exporter (target <= 0.7)", cpu["burstwatch"] / max(cpu["node_exporter"], 1e-9))
    report("rss ratio burstwatch/node_exporter (target <= 1.3)", rss["burstwatch"] / max(rss["node_exporter"], 1))
    # The daemon runs its checks as a child every 300 s (path MTU every 3600 s): what one round costs.
    import resource

    t0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "agent", "check", "--json", "--quick", "--config", str(cfg)], cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    t1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    round_cpu = (t1.ru_utime + t1.ru_stime) - (t0.ru_utime + t0.ru_stime)
    report("check round (child) cpu seconds", round_cpu)
    report("check round (child) peak rss MiB", t1.ru_maxrss / 1024)
    report("cpu ratio incl. check rounds amortized (<= 0.7)",
           (cpu["burstwatch"] + round_cpu * seconds / 300) / max(cpu["node_exporter"], 1e-9))


def credits() -> None:
    from tests.support import credit_scenarios as cs

    print("credits: the lab (tbf 100 Mbit/s baseline, 300 Mbit/s peak, 1200 Mbit bucket)", flush=True)
    for direction in ("out", "in"):
        fig = cs.forecast_idle_restart(direction, with_prometheus=(direction == "out"))
        report(f"{direction}: drain seconds (shaper)", fig["drain_seconds"])
        report(f"{direction}: forecast error s (tolerance {fig['forecast_tolerance_seconds']:.2f})",
               fig["forecast_error_seconds"])
        report(f"{direction}: after-idle error / bucket (target 0.10)", fig["idle_error_ratio"])
        report(f"{direction}: restart error / bucket (target 0.05)", fig["restart_error_ratio"])
        if "alert_lead_seconds" in fig:
            report(f"{direction}: alert fired seconds before clamp (> 0)", fig["alert_lead_seconds"])
    fig = cs.learn_bucket("out")
    report("learn: learned bucket / true bucket (target 0.8..1.2)", fig["learned_bucket_ratio"])
    report(f"learn: next forecast error s (tolerance {fig['forecast_tolerance_seconds']:.2f})",
           fig["forecast_error_seconds"])


def zoo() -> None:
    from tests.support import credit_zoo as cz

    print("credit zoo: shapes of traffic against the real agent, tbf and Prometheus (lab scale: 6-s full-speed "
          "drain, 12-s refill, 0.2-s samples, forecast_window 3 s)", flush=True)
    print(cz.LEGEND, flush=True)
    results = cz.run(echo=lambda line: print("  " + line, flush=True))
    for r in results:
        key = f"zoo {r.shape} {r.direction}"
        for name, value in (("true empty s", None if r.empty is None else r.empty - r.drain_start),
                            ("instant hit", r.instant_hit), ("trend hit", r.trend_hit),
                            ("instant median error s", r.instant_err), ("trend median error s", r.trend_err),
                            ("alert lead s", r.alert_lead)):
            if value is not None:
                RESULTS[f"{key}: {name}"] = value
        RESULTS[f"{key}: false alarms"] = r.false_alarms
        RESULTS[f"{key}: false exhaustions"] = r.false_exhaustions
        RESULTS[f"{key}: learned bucket error"] = r.bucket_error
        RESULTS[f"{key}: min remaining ratio"] = r.min_ratio
        for name, value in r.extra.items():
            RESULTS[f"{key}: {name}"] = value
    # issue 12's targets, judged on the table
    checks = [
        ("microbursts: ratio >= 0.9, no exhaustion, nothing learned",
         all(r.min_ratio >= 0.9 and r.exhausted_samples == 0 and r.learned == 0
             for r in results if r.shape.startswith("microbursts"))),
        ("on/off drains: trend within max(1 s, 15 %) in >= 80 % of samples",
         all((r.trend_hit or 0) >= 0.8 for r in results if r.shape.startswith("on/off") and r.empty is not None)),
        ("SIGKILL mid-drain: restart within 5 % of the bucket",
         all(abs(r.extra.get("restart-err", 0.0)) <= 0.05 for r in results)),
        ("under the baseline, any shape: no credit alert",
         all(r.false_alarms == 0 for r in results if r.empty is None)),
        ("no false exhaustion anywhere", all(r.false_exhaustions == 0 for r in results)),
    ]
    for what, ok in checks:
        print(f"  target {'met    ' if ok else 'MISSED '} {what}", flush=True)


EC2_BEGIN = "<!-- region: ec2 (generated by `make bench BENCH=ec2`: do not edit by hand) -->"
EC2_END = "<!-- end region: ec2 -->"
CHECK = False           # --check: compare docs/credits.md's generated region instead of rewriting it


def ec2() -> None:
    """The pure credit model at EC2's own scale (tests/support/credit_ec2.py): every shape at r4.large and
    r4.2xlarge, with the window rule and with the fixed 60-s window before it; the table goes into
    docs/credits.md ("The window rule")."""
    from tests.support import credit_ec2 as ce

    sys.path.insert(0, str(ROOT / "scripts"))
    from docregion import rewrite

    print("credits at EC2 scale: the pure model, r4 figures from the field write-ups, 1-s samples, defaults",
          flush=True)
    rows = ce.grid()
    body = ce.region(rows)
    print(body, flush=True)
    for now, old in rows:
        key = f"ec2 {now.size} {now.shape}"
        for name, value in (("trend hit", now.trend_hit), ("trend hit fixed window", old.trend_hit),
                            ("alert lead s", now.alert_lead), ("restart hit", now.restart_hit)):
            if value is not None:
                RESULTS[f"{key}: {name}"] = value
        RESULTS[f"{key}: false alarms"] = now.false_alarms
    argv = ["--check"] if CHECK else []
    if rewrite(ROOT / "docs" / "credits.md", EC2_BEGIN, EC2_END, body, "make bench BENCH=ec2", argv):
        raise SystemExit(1)


def probes() -> None:
    try:
        from tests import bench_probes
    except ImportError:
        print("probes: tests/bench_probes.py is not there yet", flush=True)
        return
    print("probes: burstwatch engine vs iperf3", flush=True)
    bench_probes.bench(report)


def fleet() -> None:
    """20 real daemons against one moto behind a counting proxy (tests/support/fleet_run.py; docs/fleet.md)."""
    from tests.support.fleet_run import bench

    bench(report)


def allowances() -> None:
    """The PPS and connection-tracking figures of the nftables lab (docs/allowances.md): the models fed from
    the real counters, then a real daemon, each test printing its `figures` line against the issue's targets
    (the same tests `make test` runs with loose asserts)."""
    print("allowances: PPS ceiling, conntrack size and forecast, flow owners (nftables lab)", flush=True)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          "tests/e2e/test_allowance_lab.py", "tests/e2e/test_allowance_daemon.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("figures "):
            print("  " + line[len("figures "):], flush=True)
    print("  " + (out.stdout.strip().splitlines() or ["(no output)"])[-1], flush=True)
    if out.returncode != 0:
        raise SystemExit(out.returncode)


def replay() -> None:
    """Issue 28's zoo at EC2's scale through `burstwatch replay --openmetrics`, the shipped rules evaluated by a
    real Prometheus at 15-s steps, one table row per drain against the targets; then `replay` of a week of
    1-s samples (tests/support/replay_zoo.py; docs/replay.md)."""
    from tests.support.replay_zoo import bench

    bench(report)


def band() -> None:
    """The credit band's zoo at EC2 scale (tests/support/credit_band_zoo.py, issue 28): true buckets of
    0.3x-2x of the belief, the band's coverage, the point forecast after a cycle's second onset, the page
    before the cliff (the shipped rule every 15 s with its `for:`), pages on drains that stopped anyway."""
    from tests.support import credit_band_zoo as bz

    print("credit band at EC2 scale: the pure model against true buckets other than its belief", flush=True)
    rows = bz.zoo()
    print(bz.HEADER, flush=True)
    for r in rows:
        print(r.row() + ("" if r.ok() else " **miss**"), flush=True)
        key = f"band {r.size} {r.shape} {r.factor:g}x{' learned' if r.learned else ''}"
        for name, value in (("coverage", r.coverage), ("point after 2nd onset", r.point), ("lead s", r.lead)):
            if value is not None:
                RESULTS[f"{key}: {name}"] = value
        RESULTS[f"{key}: pages"] = r.pages
    for line in bz.summary(rows):
        print("  " + line, flush=True)
    misses = [r.row() for r in rows if not r.ok() or (r.drain is None and "then idle" not in r.shape and r.pages)]
    if misses:
        raise SystemExit(f"band targets missed: {misses}")


PARTS: dict[str, Callable[[], None]] = {"overhead": overhead, "credits": credits, "zoo": zoo, "ec2": ec2,
                                        "band": band, "probes": probes, "fleet": fleet, "allowances": allowances,
                                        "replay": replay}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", choices=[*PARTS, []], help="which parts (default: all)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--check", action="store_true", help="ec2: compare docs/credits.md's table, do not rewrite it")
    args = ap.parse_args()
    global CHECK
    CHECK = args.check
    for name in args.parts or PARTS:
        PARTS[name]()
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
