"""A fleet you can run here (docs/fleet.md, "The fleet run"): 20 real daemons, each with its own IMDSv2 server,
instance id, zone and loopback address, publish to CloudWatch, share learned buckets and find their peers
through one moto server behind a counting proxy. The requests per agent-hour must match the model behind
docs/fleet.md's tables (scripts/fleet_model.py at the lab's config) within +/- 20 %, and no probe may cross
a zone. `make bench BENCH=fleet` runs the same fleet longer and prints the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.fleet_run import PER_START, STEADY, FleetRun, compare, table

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 20
WARMUP = 12.0          # every agent up, registered and probing
WINDOW = 30.0          # steady state at lab scale: ~15 discoveries, ~7 flushes per agent


def test_twenty_daemons_stay_on_the_model_and_in_their_zone(tmp_path: Path) -> None:
    import time

    from agent.models import cw_cost

    with FleetRun(tmp_path, agents_n=AGENTS) as fr:
        fr.start()
        time.sleep(WARMUP)
        w = fr.window(WINDOW)
        rows = compare(fr, w)
        print(table(rows), file=sys.stderr)
        assert fr.alive() == [], "agents exited: see their logs under " + str(tmp_path)

        for r in rows:
            if r.unit == "/event":
                assert 0.8 <= r.ratio <= 1.2, (r, table(rows))
            elif r.api in STEADY:
                # Wall clock on a shared 2-core machine: the lab's 4-s flushes stretch when it is loaded.
                assert 0.5 <= r.ratio <= 1.5, (r, table(rows))
            else:
                assert r.api in PER_START and r.measured <= 1.2, (r, table(rows))
        assert all(r.measured >= 0.8 for r in rows if r.api in ("s3:PutObject agents/", "ec2:DescribeInstanceTypes"))

        # Same-AZ peers by default: probes ran, and none crossed a zone.
        same, cross, probes = fr.probe_bytes_by_zone()
        assert probes > 0 and same > 0
        assert cross == 0

        # S3: one registry object per agent, one access-check object each, nothing learned on `lo`.
        objects = fr.s3_objects()
        assert objects.get("agents/") == AGENTS and objects.get("access-check/") == AGENTS, objects

        # CloudWatch: the metrics without InstanceId are the group's (one group: the instance type), as the
        # cost model counts them; those with it are bounded by every agent publishing its own set.
        with_id, without = fr.cloudwatch_metrics()
        print(f"cloudwatch metrics: {with_id} with InstanceId, {without} without; s3 objects {objects}; "
              f"probes {probes}: {same:.0f} bytes in-zone, {cross:.0f} across", file=sys.stderr)
        from agent import config

        lab = config.load(tmp_path / "agent0.toml").cloudwatch
        model = cw_cost.cloudwatch_cost(AGENTS, 1, lab, peers=1, hot_fraction=1.0)
        assert 0.8 * model.group_metrics <= without <= 1.2 * model.group_metrics + 2 * AGENTS, (without, model)
        assert with_id <= AGENTS * cw_cost.metrics_per_set(lab, peers=AGENTS, group=False), with_id
