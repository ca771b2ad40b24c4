"""A fleet you can run here: N real daemons, each with its own IMDSv2 server, identity, zone, loopback address,
state_dir and /metrics port, all calling one moto server through a counting proxy (docs/fleet.md, "The fleet
run"). Used by tests/e2e/test_fleet_run.py (short, loose asserts) and `make bench BENCH=fleet` (longer).

Lab time scale: discovery, fleet reads and CloudWatch flushes run seconds apart instead of hours, and the
figures per agent-hour are compared with scripts/gen_fleet_arithmetic.py's model evaluated at the lab's own
config (`calls_per_agent_hour`); the same model at the EC2 defaults gives docs/fleet.md's tables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tests.conftest import MOTO_SERVER, free_port, wait_port
from tests.support.counting_proxy import CountingProxy
from tests.support.daemon_config import daemon_config
from tests.support.imds_server import FakeEni, ImdsServer, metadata_tree

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "fleet-run"
PREFIX = "burstwatch/"
TYPE = "m5.large"
ZONES = (("us-east-1a", "use1-az1"), ("us-east-1b", "use1-az2"))
SERIES = re.compile(r'^([a-z_]+)(\{[^}]*\})? (\S+)$')


@dataclass(frozen=True)
class LabScale:
    """The lab's intervals (seconds) where the EC2 defaults are hours."""

    discover_interval: float = 2.0
    fleet_refresh: float = 2.0
    cw_period: int = 2
    cw_flush: float = 4.0
    probe_interval: float = 10.0


@dataclass
class Agent:
    n: int
    instance_id: str
    zone: str
    host: str
    metrics_port: int
    key_id: str
    imds: ImdsServer
    proc: Optional[subprocess.Popen] = None
    log: Optional[Path] = None


@dataclass
class FleetRun:
    """Start with `start()`, measure with `window(seconds)`, always `close()` (the context manager does)."""

    tmp: Path
    agents_n: int = 20
    scale: LabScale = field(default_factory=LabScale)
    agents: list[Agent] = field(default_factory=list)
    moto: Optional[subprocess.Popen] = None
    proxy: Optional[CountingProxy] = None

    def __enter__(self) -> FleetRun:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        if not MOTO_SERVER.exists():
            raise RuntimeError(f"{MOTO_SERVER} missing: run `make test-deps`")
        port = free_port()
        self.moto = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port("127.0.0.1", port, timeout=30)
        self.proxy = CountingProxy(f"http://127.0.0.1:{port}")
        self._s3("setup").create_bucket(Bucket=BUCKET)
        for n in range(self.agents_n):
            self.agents.append(self._agent(n))
        for a in self.agents:
            self._launch(a)
        for a in self.agents:
            wait_port("127.0.0.1", a.metrics_port, timeout=60)

    def close(self) -> None:
        for a in self.agents:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.terminate()
        for a in self.agents:
            if a.proc is not None:
                try:
                    a.proc.wait(10)
                except subprocess.TimeoutExpired:
                    a.proc.kill()
                    a.proc.wait(5)
            a.imds.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.moto is not None:
            self.moto.terminate()
            try:
                self.moto.wait(10)
            except subprocess.TimeoutExpired:
                self.moto.kill()

    def _agent(self, n: int) -> Agent:
        zone, zone_id = ZONES[n % len(ZONES)]
        host = f"127.0.1.{n + 1}"
        eni = FakeEni(f"02:00:00:00:{n // 256:02x}:{n % 256:02x}", vpc_cidrs=("127.0.0.0/8",), local_ipv4s=(host,))
        iid = f"i-0f1ee7{n:011x}"
        imds = ImdsServer(metadata_tree(instance_id=iid, instance_type=TYPE, availability_zone=zone,
                                        availability_zone_id=zone_id, enis=(eni,)))
        imds.start()
        return Agent(n, iid, zone_id, host, free_port(), f"AKIDFLEET{n:06d}", imds)

    def _config(self, a: Agent) -> Path:
        s = self.scale
        assert self.proxy is not None
        url = self.proxy.url
        return daemon_config(
            self.tmp, f"agent{a.n}", state_dir=self.tmp / f"agent{a.n}",
            metrics={"listen": f"127.0.0.1:{a.metrics_port}"},
            imds={"endpoint": a.imds.url, "timeout": 0.5},
            instance={"ec2_endpoint_url": url, "bandwidth": {"baseline_gbps": 0.01, "peak_gbps": 0.1}},
            credits={"shaping_source": "none"},
            responder={"enabled": True, "listen": f"{a.host}:5201", "credit_floor": 0.0},
            probe={"registry": True, "discover_interval": s.discover_interval, "interval": s.probe_interval,
                   "duration": 1.0, "streams": 1, "credit_floor": 0.0},
            cloudwatch={"enabled": True, "endpoint_url": url, "region": "us-east-1", "period": s.cw_period,
                        "flush_interval": s.cw_flush},
            fleet={"enabled": True, "bucket": BUCKET, "prefix": PREFIX, "region": "us-east-1", "endpoint_url": url,
                   "refresh_interval": s.fleet_refresh, "publish_interval": 0.0})

    def _launch(self, a: Agent) -> None:
        cfg = self._config(a)
        env = dict(os.environ, AWS_ACCESS_KEY_ID=a.key_id, AWS_SECRET_ACCESS_KEY="fleet-run-secret",
                   AWS_DEFAULT_REGION="us-east-1")
        env.pop("AWS_PROFILE", None)
        a.log = self.tmp / f"agent{a.n}.log"
        a.proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--config", str(cfg)], cwd=str(ROOT),
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(a.log, "ab"))

    def _s3(self, key_id: str) -> Any:
        import boto3
        from botocore.config import Config

        assert self.proxy is not None
        return boto3.client("s3", region_name="us-east-1", endpoint_url=self.proxy.url,
                            aws_access_key_id=key_id, aws_secret_access_key="x",
                            config=Config(retries={"max_attempts": 2}))

    # -- measuring -------------------------------------------------------------------------------------------
    def alive(self) -> list[int]:
        """Agents whose process has exited (should be none)."""
        return [a.n for a in self.agents if a.proc is not None and a.proc.poll() is not None]

    def metrics(self, a: Agent) -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{a.metrics_port}/metrics", timeout=5).read().decode()
        out = {}
        for line in text.splitlines():
            m = SERIES.match(line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def events(self) -> dict[str, float]:
        """The agents' own counts of the events the calls follow: discoveries and fleet reads, summed."""
        out = dict.fromkeys(EVENTS.values(), 0.0)
        for a in self.agents:
            m = self.metrics(a)
            for key, value in m.items():
                name = key.split("{", 1)[0]
                if name in out:
                    out[name] += value
        return out

    def window(self, seconds: float) -> Window:
        """Count every agent's requests, and the events behind them, over `seconds` of steady state."""
        assert self.proxy is not None
        ev0 = self.events()
        before = self.proxy.snapshot()
        t0 = time.monotonic()
        time.sleep(seconds)
        after = self.proxy.snapshot()
        elapsed = time.monotonic() - t0
        ev1 = self.events()
        agents = {a.key_id for a in self.agents}
        per_api: dict[str, float] = {}
        for call, n in (after - before).items():
            if call.caller in agents:
                name = call.api + (f" {call.area}" if call.area else "")
                per_api[name] = per_api.get(name, 0) + n
        hours = elapsed / 3600 * len(self.agents)
        return Window(elapsed, {k: v / hours for k, v in per_api.items()}, per_api,
                      {k: ev1[k] - ev0[k] for k in ev0})

    def totals(self) -> dict[str, int]:
        """Every agent request since the start, by API (and S3 area)."""
        assert self.proxy is not None
        agents = {a.key_id for a in self.agents}
        out: dict[str, int] = {}
        for call, n in self.proxy.snapshot().items():
            if call.caller in agents:
                name = call.api + (f" {call.area}" if call.area else "")
                out[name] = out.get(name, 0) + n
        return out

    def cloudwatch_metrics(self) -> tuple[int, int]:
        """Distinct CloudWatch metrics (namespace-wide identities) with and without InstanceId."""
        assert self.proxy is not None
        ids = set().union(*self.proxy.metrics.values()) if self.proxy.metrics else set()
        with_id = sum(1 for _, dims in ids if any(k == "InstanceId" for k, _ in dims))
        return with_id, len(ids) - with_id

    def s3_objects(self) -> dict[str, int]:
        """Objects in the bucket by area (not counted as agent requests: signed as "setup")."""
        out: dict[str, int] = {}
        pages = self._s3("setup").get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for page in pages:
            for o in page.get("Contents", []):
                area = next((x for x in ("learned/", "agents/", "access-check/") if x in o["Key"]), "other")
                out[area] = out.get(area, 0) + 1
        return out

    def probe_bytes_by_zone(self) -> tuple[float, float, int]:
        """(same-zone bytes, cross-zone bytes, probes) of every agent's own probes, from /metrics."""
        zone_of = {a.host: a.zone for a in self.agents}
        same = cross = 0.0
        probes = 0
        for a in self.agents:
            m = self.metrics(a)
            last = {k.replace("burstwatch_probe_last_bytes", ""): v for k, v in m.items()
                    if k.startswith("burstwatch_probe_last_bytes{")}
            for key, runs in m.items():
                if not key.startswith("burstwatch_probe_runs_total{") or 'result="success"' not in key:
                    continue
                peer = re.search(r'peer="([^"]+)"', key)
                direction = re.search(r'direction="([^"]+)"', key)
                if peer is None or direction is None:
                    continue
                host = peer.group(1).rsplit(":", 1)[0]
                nbytes = next((v for k, v in last.items() if f'peer="{peer.group(1)}"' in k
                               and f'direction="{direction.group(1)}"' in k), 0.0)
                probes += int(runs)
                if zone_of.get(host) == a.zone:
                    same += runs * nbytes
                else:
                    cross += runs * nbytes
        return same, cross, probes


@dataclass(frozen=True)
class Window:
    seconds: float
    per_agent_hour: dict[str, float]      # wall clock: what the lab's intervals gave on this (shared) machine
    calls: dict[str, float]               # requests in the window, all agents
    events: dict[str, float]              # the agents' own event counts in the window (EVENTS)


# -- the model beside the measurement ----------------------------------------------------------------------------
# Calls made in steady state, compared per agent-hour with the model at the lab's config; calls made once per
# start, compared per agent with 1.
STEADY = ("s3:ListObjectsV2 agents/", "s3:ListObjectsV2 learned/", "monitoring:PutMetricData")
# The event each steady call follows, counted by the agents themselves: the model's calls per event are
# compared with the measured ones, so a loaded machine that stretches the lab's intervals does not skew
# them. PutMetricData has no event counter: it is compared per agent-hour of wall clock.
EVENTS = {"s3:ListObjectsV2 agents/": "burstwatch_probe_discoveries_total",
          "s3:ListObjectsV2 learned/": "burstwatch_fleet_refreshes_total"}
PER_START = ("s3:PutObject agents/", "s3:ListObjectsV2 access-check/", "s3:PutObject access-check/",
             "s3:GetObject access-check/", "ec2:DescribeInstanceTypes", "ec2:DescribeTags")


@dataclass(frozen=True)
class Row:
    api: str
    measured: float          # per event (EVENTS), per agent-hour at lab scale (other STEADY), per agent start
    model: float             # the same from scripts/fleet_model.py at the lab's config
    unit: str
    at_defaults: float       # per agent-hour at the EC2 defaults: model(defaults) x measured / model(lab)

    @property
    def ratio(self) -> float:
        return self.measured / self.model if self.model else float("inf")


def compare(fr: FleetRun, w: Window) -> list[Row]:
    """Measured beside the model (scripts/fleet_model.py) for every API the run exercises."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import fleet_model

    from agent import config

    lab = config.load(fr.tmp / "agent0.toml")
    n = len(fr.agents)
    at_lab = fleet_model.calls_per_agent_hour(lab, n)
    defaults = fleet_model.calls_per_agent_hour(fleet_model.fleet_config(), 1000, groups=10)
    totals = fr.totals()
    rows = []
    per_event = {"s3:ListObjectsV2 agents/": 3600.0 / lab.probe.discover_interval,
                 "s3:ListObjectsV2 learned/": 3600.0 / lab.fleet.refresh_interval}
    for api in STEADY:
        if api in EVENTS:
            events = w.events.get(EVENTS[api], 0.0)
            measured = w.calls.get(api, 0.0) / events if events else 0.0
            model, unit = at_lab[api] / per_event[api], "/event"
        else:
            measured, model, unit = w.per_agent_hour.get(api, 0.0), at_lab[api], "/agent-h"
        ratio = measured / model if model else 0.0
        rows.append(Row(api, measured, model, unit, ratio * defaults[api]))
    for api in PER_START:
        measured = totals.get(api, 0) / n
        rows.append(Row(api, measured, 1.0, "/start", measured * defaults[api]))
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"  {'API':<34} {'measured':>12} {'model':>10} {'ratio':>7} {'per agent-hour at defaults':>28}"]
    for r in rows:
        lines.append(f"  {r.api:<34} {r.measured:>9.2f}{r.unit:<8} {r.model:>10.2f} {r.ratio:>7.2f} "
                     f"{r.at_defaults:>28.4f}")
    return "\n".join(lines)


def bench(report: Any, agents: int = 20, warmup: float = 20.0, seconds: float = 120.0) -> None:
    """`make bench BENCH=fleet`: the fleet run, longer, and the table it checks (then docs/fleet.md's
    extrapolation, from the same model)."""
    import tempfile

    sys.path.insert(0, str(ROOT / "scripts"))
    import gen_fleet_arithmetic

    with tempfile.TemporaryDirectory(prefix="burstwatch-fleet-") as tmp, FleetRun(Path(tmp), agents) as fr:
        print(f"fleet: {agents} daemons (own IMDSv2, identity, zone, loopback address), one moto behind a "
              f"counting proxy; {warmup:g} s warm-up, {seconds:g} s measured", flush=True)
        fr.start()
        time.sleep(warmup)
        w = fr.window(seconds)
        rows = compare(fr, w)
        print(table(rows), flush=True)
        with_id, without = fr.cloudwatch_metrics()
        same, cross, probes = fr.probe_bytes_by_zone()
        objects = fr.s3_objects()
        for r in rows:
            report(f"fleet {r.api} ratio", r.ratio)
            report(f"fleet {r.api} per agent-hour at defaults", r.at_defaults)
        report("fleet cloudwatch metrics with InstanceId", with_id)
        report("fleet cloudwatch metrics without InstanceId", without)
        report("fleet probes", probes)
        report("fleet same-zone probe bytes", same)
        report("fleet cross-zone probe bytes", cross)
        for area, n in sorted(objects.items()):
            report(f"fleet s3 objects {area}", n)
        report("fleet agents that exited", len(fr.alive()))
    print("\nextrapolated (docs/fleet.md, generated from the code's defaults):\n", flush=True)
    print(gen_fleet_arithmetic.region(), flush=True)
