"""`burstwatch probe` and `burstwatch responder`: argument handling, exit codes, text and JSON output."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.commands import probe as cli
from agent.commands import probe_options as options
from tests.support.iperf3 import free_port, iperf3_client, iperf3_server, responder, wait_listening

ROOT = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_probe_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("target", "expect"), [
    ("10.0.1.23", ("10.0.1.23", None)),
    ("10.0.1.24:5202", ("10.0.1.24", 5202)),
    ("peer.example", ("peer.example", None)),
    ("[fd00::1]:5201", ("fd00::1", 5201)),
    ("[fd00::1]", ("fd00::1", None)),
    ("fd00::1", ("fd00::1", None)),
])
def test_split_target(target: str, expect: tuple) -> None:
    assert options.split_target(target) == expect


@pytest.mark.parametrize("bad", ["", ":5201", "host:0", "host:70000", "host:http", "[fd00::1", "[::1]x"])
def test_split_target_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        options.split_target(bad)


def test_parse_bitrate_and_units() -> None:
    assert options.parse_bitrate("100M") == 100_000_000
    assert options.parse_bitrate("1.5g") == 1_500_000_000
    assert options.parse_bitrate("2500") == 2500
    for bad in ("-1M", "fast", "nanM"):
        with pytest.raises(ValueError):
            options.parse_bitrate(bad)
    assert cli.fmt_bytes(1.17 * 1024 ** 3) == "1.17 GBytes"
    assert cli.fmt_rate(9.41e9) == "9.41 Gbits/sec"
    assert cli.fmt_rate(941e6) == " 941 Mbits/sec"


@pytest.mark.parametrize("argv", [["host:99999"], ["host", "--streams", "0"], ["host", "--time", "0"],
                                  ["host:5202", "--port", "5203"], ["host", "--streams", "500"],
                                  ["host", "--bidir", "-R"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.cmd_probe(parse(*argv)) == 2
    assert "burstwatch probe:" in capsys.readouterr().err


def test_unreachable_peer_exits_1_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # nothing listens there
    assert cli.cmd_probe(parse(f"127.0.0.1:{port}", "-t", "1", "--json")) == 1
    out = capsys.readouterr()
    assert f"peer 127.0.0.1:{port}: cannot connect" in out.err
    assert json.loads(out.out)["error"].startswith(f"peer 127.0.0.1:{port}")  # --json still prints JSON


def test_text_and_json_against_iperf3(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with iperf3_server(port):
        assert cli.cmd_probe(parse("127.0.0.1", "--port", str(port), "-t", "1", "-P", "2")) == 0
        text = capsys.readouterr().out
        assert cli.cmd_probe(parse(f"127.0.0.1:{port}", "-t", "1", "-P", "2", "-R", "--json")) == 0
        doc = json.loads(capsys.readouterr().out)
    assert f"Connecting to host 127.0.0.1, port {port}" in text
    assert "[SUM]" in text and " sender" in text and " receiver" in text and "Gbits/sec" in text
    assert doc["start"]["test_start"]["reverse"] == 1 and doc["end"]["sum_received"]["bytes"] > 0


def test_bidir_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`burstwatch probe --bidir` (issue 13, row 9): iperf3's role tags in text, its keys in JSON."""
    port = free_port()
    with iperf3_server(port, one_off=True):
        assert cli.cmd_probe(parse(f"127.0.0.1:{port}", "-t", "1", "-P", "2", "--bidir")) == 0
        text = capsys.readouterr().out
    with responder() as r:
        assert cli.cmd_probe(parse(f"127.0.0.1:{r.address[1]}", "-t", "1", "-P", "1", "--bidir", "--json")) == 0
        doc = json.loads(capsys.readouterr().out)
    assert "[ ID][Role] Interval" in text
    for line in ("[SUM][TX-C]", "[SUM][RX-C]"):
        assert f"{line}   0.00-" in text and text.count(line) >= 3, text  # intervals, sender, receiver
    assert doc["end"]["sum_received"]["bytes"] > 0 and doc["end"]["sum_received_bidir_reverse"]["bytes"] > 0
    assert doc["start"]["test_start"]["bidir"] == 1


def test_udp_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with responder() as r:
        assert cli.cmd_probe(parse(f"127.0.0.1:{r.address[1]}", "-u", "-b", "5M", "-t", "1", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["start"]["test_start"]["protocol"] == "UDP"
    assert 4e6 < doc["end"]["sum_received"]["bits_per_second"] < 6e6 * 4  # 4 streams x 5 Mbit/s at most


def test_standalone_responder_serves_iperf3_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / "burstwatch.toml"
    # IMDS off: the subprocess has no conftest guard, and the responder would ask IMDS for its type.
    conf.write_text('[imds]\nenabled = false\n[responder]\nlisten = "127.0.0.1:1"\nallow = ["10.0.0.0/8"]\n'
                    'max_duration = 5.0\n')
    script = textwrap.dedent(f"""
        import argparse, sys
        from agent.commands import probe as cli
        ns = argparse.Namespace(config={str(conf)!r}, listen="127.0.0.1:{port}", allow=["127.0.0.0/8"])
        sys.exit(cli.cmd_responder(ns))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_listening(port)
        ok = iperf3_client("127.0.0.1", port, "-t", "1")
        capped = iperf3_client("127.0.0.1", port, "-t", "6")  # over the config file's max_duration
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert ok.returncode == 0, ok.stderr
    assert capped.returncode == 1 and "test authorization failed" in capped.stderr
    assert proc.returncode == 0, err
    assert "responder stopped: 1 tests completed, 0 aborted, 1 refused" in err


def test_standalone_responder_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.cmd_responder(argparse.Namespace(config=None, listen="nonsense", allow=None)) == 2
    assert cli.cmd_responder(argparse.Namespace(config=None, listen="127.0.0.1:5201", allow=["10.0.0.0/33"])) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[responder]\nmax_streams = 0\n")
    assert cli.cmd_responder(argparse.Namespace(config=str(bad), listen=None, allow=None)) == 2
    err = capsys.readouterr().err
    assert "--listen" in err and "--allow" in err and "max_streams" in err
