"""discover() end to end: a real IMDSv2 server, a sysfs fixture, moto over HTTP; and its /metrics view."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent import config as configmod
from agent.discovery import InstanceInfo, describe_profile, discover, profile_for
from agent.exporters.instance import InstanceView
from agent.models.profile import GBIT
from agent.readers import ec2api
from tests.conftest import free_port
from tests.support.imds_server import FakeEni, ImdsServer, metadata_tree

SYSFS = str(Path(__file__).resolve().parent / "fixtures" / "sysfs")
ENIS = (
    FakeEni("0a:1b:2c:3d:4e:02", device_number=1, interface_id="eni-second", vpc_cidrs=("10.0.0.0/16",),
            local_ipv4s=("10.0.2.9",)),
    FakeEni("0a:1b:2c:3d:4e:01", device_number=0, interface_id="eni-primary",
            vpc_cidrs=("10.0.0.0/16", "100.64.0.0/16")),
    FakeEni("0a:1b:2c:3d:4e:03", device_number=2, interface_id="eni-in-a-container"),  # not in this netns
)


def cfg_for(tmp_path: Path, endpoint: str, extra: str = "", timeout: float = 1.0,
            retries: int = 2) -> configmod.Config:
    return configmod.parse(f'state_dir = "{tmp_path}"\n{extra}\n[imds]\nendpoint = "{endpoint}"\n'
                           f"timeout = {timeout}\nretries = {retries}\n")


def moto_api(moto: str) -> ec2api.ClientFactory:
    return ec2api.client_factory(moto)


def dead_api() -> ec2api.ClientFactory:
    return ec2api.client_factory(f"http://127.0.0.1:{free_port()}")


def scrape(info: InstanceInfo | None) -> tuple[CollectorRegistry, str]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(InstanceView(lambda: info))
    return reg, generate_latest(reg).decode()


def test_on_ec2_end_to_end(moto: str, tmp_path: Path) -> None:
    tree = metadata_tree(instance_type="c5.4xlarge", region="eu-west-1", availability_zone="eu-west-1b",
                         availability_zone_id="euw1-az3", enis=ENIS)
    with ImdsServer(tree) as srv:
        info = discover(cfg_for(tmp_path, srv.url), sysfs=SYSFS, api_factory=moto_api(moto))
        assert srv.token_puts == 1                              # one token for the whole discovery
    assert info.on_ec2
    assert info.identity == ("i-0123456789abcdef0", "c5.4xlarge", "eu-west-1", "eu-west-1b", "euw1-az3")
    assert [e.interface_id for e in info.enis] == ["eni-primary", "eni-second", "eni-in-a-container"]
    assert info.interfaces == ["ens5", "ens6"]                  # primary first; the VLAN never wins
    assert info.eni_interfaces == {"0a:1b:2c:3d:4e:01": "ens5", "0a:1b:2c:3d:4e:02": "ens6"}
    assert info.vpc_cidrs == ["10.0.0.0/16", "100.64.0.0/16"]
    p = info.profile
    assert (p.instance_type, p.baseline_bytes_per_second, p.peak_bytes_per_second) == ("c5.4xlarge", 5 * GBIT,
                                                                                     10 * GBIT)
    assert (p.baseline_source, p.peak_source, p.bucket_source) == ("api", "api", "default")
    assert p.bucket_bytes == 5 * GBIT * 3600
    assert info.sources["imds"] == "v2" and info.sources["api"] == "fresh"
    assert info.sources["instance_type"] == "imds" and info.sources["type_entry"] == "api"
    # the same figures; the test moto (5.0.22) predates the queue counts that the catalogue's source carries
    assert info.type_entry is info.api_entry and info.catalogue_entry is not None
    assert info.catalogue_entry.cards[0].default_ena_queues == 8 and info.api_entry.default_ena_queues is None
    assert (info.catalogue_entry.baseline_gbps, info.catalogue_entry.peak_gbps) == (5.0, 10.0) == \
        (info.api_entry.baseline_gbps, info.api_entry.peak_gbps)
    assert (tmp_path / "instance-type-c5.4xlarge.json").exists()

    reg, text = scrape(info)
    assert reg.get_sample_value("burstwatch_instance_info", {
        "instance_id": "i-0123456789abcdef0", "instance_type": "c5.4xlarge", "region": "eu-west-1",
        "availability_zone": "eu-west-1b", "availability_zone_id": "euw1-az3", "on_ec2": "true"}) == 1.0
    for d in ("in", "out"):
        assert reg.get_sample_value("burstwatch_bandwidth_baseline_bytes_per_second",
                                    {"direction": d, "source": "api"}) == 625_000_000.0
        assert reg.get_sample_value("burstwatch_bandwidth_peak_bytes_per_second",
                                    {"direction": d, "source": "api"}) == 1_250_000_000.0
        assert reg.get_sample_value("burstwatch_bandwidth_burstable", {"direction": d}) == 1.0
        assert reg.get_sample_value("burstwatch_network_card_baseline_bytes_per_second",
                                    {"network_card": "0", "direction": d, "source": "api"}) == 625_000_000.0
    assert reg.get_sample_value("burstwatch_instance_discovery_info", {
        "imds": "v2", "instance_type_source": "imds", "type_data_source": "api", "api": "fresh"}) == 1.0
    assert reg.get_sample_value("burstwatch_imds_requests_total", {"request": "token", "result": "ok"}) == 1.0
    assert reg.get_sample_value("burstwatch_imds_up") == 1.0
    assert "burstwatch_instance_discovery_duration_seconds" in text


def test_api_down_uses_the_catalogue(tmp_path: Path) -> None:
    with ImdsServer(metadata_tree(instance_type="m5.large", enis=ENIS[:2])) as srv:
        info = discover(cfg_for(tmp_path, srv.url), sysfs=SYSFS, api_factory=dead_api())
    assert info.on_ec2 and info.api_entry is None
    assert info.sources["api"] == "unreachable" and info.sources["type_entry"] == "catalogue"
    p = info.profile
    assert (p.baseline_bytes_per_second, p.peak_bytes_per_second) == (0.75 * GBIT, 10 * GBIT)
    assert (p.baseline_source, p.peak_source, p.bucket_source) == ("catalogue", "catalogue", "default")
    reg, _ = scrape(info)
    assert reg.get_sample_value("burstwatch_bandwidth_peak_bytes_per_second",
                                {"direction": "out", "source": "catalogue"}) == 1_250_000_000.0


def test_multi_card_instance(moto: str, tmp_path: Path) -> None:
    enis = (FakeEni("0a:1b:2c:3d:4e:02", device_number=0, network_card_index=1, interface_id="eni-card1"),
            FakeEni("0a:1b:2c:3d:4e:01", device_number=0, network_card_index=0, interface_id="eni-card0"))
    with ImdsServer(metadata_tree(instance_type="p4d.24xlarge", enis=enis)) as srv:
        info = discover(cfg_for(tmp_path, srv.url), sysfs=SYSFS, api_factory=moto_api(moto))
    assert info.interfaces == ["ens5", "ens6"] and [e.network_card_index for e in info.enis] == [0, 1]
    p = info.profile
    assert len(p.cards) == 4 and p.cards_source == "api"
    assert p.never_exhausts and p.bucket_source == "none" and not p.bursts
    assert "never exhausts" in describe_profile(p)
    reg, _ = scrape(info)
    assert reg.get_sample_value("burstwatch_bandwidth_burstable", {"direction": "in"}) == 0.0
    assert reg.get_sample_value("burstwatch_network_card_peak_bytes_per_second",
                                {"network_card": "3", "direction": "out", "source": "api"}) == 100 * GBIT


def test_config_overrides_imds_and_catalogue(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    extra = ('[instance]\ntype = "r4.large"\n'
             "[instance.bandwidth]\npeak_gbps = 5.0\nburst_bucket_gbit = 1000.0\n")
    with ImdsServer(metadata_tree(instance_type="m5.large", enis=ENIS[:1])) as srv:
        with caplog.at_level(logging.WARNING, logger="agent.discovery"):
            info = discover(cfg_for(tmp_path, srv.url, extra), sysfs=SYSFS, api_factory=dead_api())
    assert "overrides the type IMDS reports (m5.large)" in caplog.text
    p = info.profile
    assert p.instance_type == "r4.large" and info.sources["instance_type"] == "config"
    assert (p.baseline_bytes_per_second, p.baseline_source) == (0.75 * GBIT, "catalogue")
    assert (p.peak_bytes_per_second, p.peak_source) == (5 * GBIT, "config")
    assert (p.bucket_bytes, p.bucket_source) == (1000 * GBIT, "config")


def test_off_ec2_says_so_once_and_runs_on_the_config(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    extra = '[instance]\ntype = "m5.large"\n[instance.bandwidth]\nbaseline_gbps = 0.1\n'
    with ImdsServer(hang=True) as srv:
        with caplog.at_level(logging.DEBUG):
            t0 = time.monotonic()
            info = discover(cfg_for(tmp_path, srv.url, extra, timeout=0.2, retries=1), sysfs=SYSFS)
            elapsed = time.monotonic() - t0
        assert srv.count("PUT") == 2 and srv.count("GET") == 0   # 1 + retries token attempts, then done
    assert not info.on_ec2 and info.identity is None and info.interfaces == [] and info.vpc_cidrs == []
    assert info.sources["imds"] == "unreachable" and info.sources["api"] == "skipped"
    p = info.profile
    assert (p.baseline_bytes_per_second, p.baseline_source) == (0.1 * GBIT, "config")
    assert (p.peak_bytes_per_second, p.peak_source) == (10 * GBIT, "catalogue")
    mine = [r for r in caplog.records if r.name == "agent.discovery" and r.levelno >= logging.INFO]
    assert len(mine) == 1 and mine[0].levelno == logging.INFO and "not on EC2" in mine[0].getMessage()
    assert elapsed < 3.0                                        # 2 x 0.2 s + 0.1 s backoff, generously
    reg, _ = scrape(info)
    assert reg.get_sample_value("burstwatch_instance_info", {
        "instance_id": "", "instance_type": "m5.large", "region": "", "availability_zone": "",
        "availability_zone_id": "", "on_ec2": "false"}) == 1.0
    assert reg.get_sample_value("burstwatch_imds_up") == 0.0
    assert reg.get_sample_value("burstwatch_imds_requests_total",
                                {"request": "token", "result": "timeout"}) == 2.0


def test_startup_cost_without_imds_at_the_defaults(tmp_path: Path) -> None:
    """The shipped defaults (timeout 1 s, 2 retries) against an IMDS that never answers: 3 attempts."""
    cfg = configmod.parse(f'state_dir = "{tmp_path}"\n')
    assert (cfg.imds.timeout, cfg.imds.retries) == (1.0, 2)
    with ImdsServer(hang=True) as srv:
        cfg = configmod.parse(f'state_dir = "{tmp_path}"\n[imds]\nendpoint = "{srv.url}"\n')
        t0 = time.monotonic()
        info = discover(cfg, sysfs=SYSFS)
        elapsed = time.monotonic() - t0
        assert srv.count("PUT") == 3 and len(srv.requests) == 3
    assert not info.on_ec2
    # 3 x 1 s timeouts + 0.1 + 0.2 s backoff = 3.3 s expected; bound generously for a busy CI machine.
    assert 3.0 <= elapsed < 8.0, elapsed
    assert info.discovery_seconds == pytest.approx(elapsed, abs=0.5)


def test_imds_disabled(tmp_path: Path) -> None:
    with ImdsServer(disabled=True) as srv:
        info = discover(cfg_for(tmp_path, srv.url), sysfs=SYSFS)
        assert len(srv.requests) == 1
    assert not info.on_ec2 and info.sources["imds"] == "disabled"


def test_imds_off_in_config_sends_nothing(tmp_path: Path) -> None:
    with ImdsServer() as srv:
        cfg = configmod.parse(f'state_dir = "{tmp_path}"\n[imds]\nenabled = false\nendpoint = "{srv.url}"\n')
        info = discover(cfg, sysfs=SYSFS)
        assert srv.requests == []
    assert info.sources["imds"] == "off" and info.imds_stats is None
    _, text = scrape(info)
    assert "burstwatch_imds_" not in text
    assert "burstwatch_bandwidth_baseline_bytes_per_second{" not in text   # nothing known, nothing invented
    assert 'burstwatch_bandwidth_burstable{direction="in"} 0.0' in text


def test_broken_answers_never_raise(tmp_path: Path) -> None:
    tree = metadata_tree(enis=ENIS[:1])
    del tree["meta-data/instance-type"]
    with ImdsServer(tree) as srv:
        info = discover(cfg_for(tmp_path, srv.url), sysfs=SYSFS)
    assert not info.on_ec2 and info.sources["imds"] == "error"

    tree = metadata_tree(enis=ENIS[:1])
    with ImdsServer(tree) as srv:                              # sysfs missing: on EC2, no interfaces
        info = discover(cfg_for(tmp_path, srv.url), sysfs=str(tmp_path / "no-sysfs"), api_factory=dead_api())
    assert info.on_ec2 and info.interfaces == [] and len(info.enis) == 1


def test_profile_for_a_reloaded_config(moto: str, tmp_path: Path) -> None:
    with ImdsServer(metadata_tree(instance_type="c5.4xlarge", enis=ENIS[:1])) as srv:
        info = discover(cfg_for(tmp_path, srv.url), sysfs=SYSFS, api_factory=moto_api(moto))
        assert len(srv.requests) > 0
        seen = len(srv.requests)
        same = profile_for(cfg_for(tmp_path, srv.url), info)
        assert same == info.profile and same.baseline_source == "api"
        bigger = profile_for(cfg_for(tmp_path, srv.url, '[instance.bandwidth]\nburst_bucket_gbit = 50.0\n'),
                             info)
        assert (bigger.bucket_bytes, bigger.bucket_source) == (50 * GBIT, "config")
        other = profile_for(cfg_for(tmp_path, srv.url, '[instance]\ntype = "t3.micro"\n'), info)
        assert (other.instance_type, other.baseline_bytes_per_second, other.baseline_source) == (
            "t3.micro", 0.064 * GBIT, "catalogue")
        assert len(srv.requests) == seen                        # nothing asked of IMDS again


def test_view_without_info_is_empty() -> None:
    _, text = scrape(None)
    assert "burstwatch_" not in text
