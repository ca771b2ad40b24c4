"""burstwatch_instance_info's `node` label: from BURSTWATCH_NODE_NAME (the chart's downward API env), and
absent, with the series unchanged, everywhere else."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.discovery import NODE_NAME_ENV
from agent.exporters.instance import InstanceView
from tests.exporters.exposition import instance


def _info_line(node_env: str | None, monkeypatch: pytest.MonkeyPatch) -> str:
    if node_env is None:
        monkeypatch.delenv(NODE_NAME_ENV, raising=False)
    else:
        monkeypatch.setenv(NODE_NAME_ENV, node_env)
    info = dataclasses.replace(instance())      # node_name is read when discovery builds InstanceInfo
    reg = CollectorRegistry()
    reg.register(InstanceView(lambda: info))
    (line,) = [x for x in generate_latest(reg).decode().splitlines() if x.startswith("burstwatch_instance_info{")]
    return line


def test_node_label_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    line = _info_line("ip-10-0-1-23.ec2.internal", monkeypatch)
    assert 'node="ip-10-0-1-23.ec2.internal"' in line and 'instance_id="i-0abc"' in line


@pytest.mark.parametrize("env", [None, ""])
def test_no_node_label_off_kubernetes(env: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    line = _info_line(env, monkeypatch)
    assert "node=" not in line
    assert line == ('burstwatch_instance_info{availability_zone="us-east-1a",availability_zone_id="use1-az1",'
                    'instance_id="i-0abc",instance_type="m5.large",on_ec2="true",region="us-east-1"} 1.0')
