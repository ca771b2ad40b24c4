"""The ECS task definition's containers run for real with podman, as the ECS agent would run them with Docker:
the image built from the Containerfile on the .deb; every container setting of packaging/ecs/task-definition.json
translated to `podman run` options (a setting the translation does not know fails the test); the "host" network
a lab namespace the containers join, holding a veth with an ENI's MAC and the test IMDSv2 server. The init
container hands the root-owned host directory to the agent's group with no capability, the agent runs as uid
10786 with no capability on a read-only root, sees the namespace's interface and its ENI ID, passes the task's
health check, saves its state on stop, and the next task restores it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_until
from tests.support.credit_lab import parse_metrics
from tests.support.daemon_config import toml_text
from tests.support.imds_server import FakeEni, ImdsServer, metadata_tree
from tests.support.lab import Lab, run_in_ns
from tests.support.podman import podman
from tests.support.project_image import Image

pytestmark = [pytest.mark.slow, pytest.mark.netns]

TASK = ROOT / "packaging" / "ecs" / "task-definition.json"
MAC = "0a:1b:2c:3d:4e:71"
ENI = FakeEni(MAC, interface_id="eni-0a1b2c3d4e5f60071")
METRICS = "http://127.0.0.1:9786/metrics"
UID = 10786


def _linux_parameters(value: dict[str, Any]) -> list[str]:
    unknown = set(value) - {"capabilities", "tmpfs"}
    assert not unknown, f"untranslated linuxParameters {unknown}"
    args = []
    for cap in value["capabilities"].get("drop", []):
        args += ["--cap-drop", cap]
    for cap in value["capabilities"].get("add", []):
        args += ["--cap-add", cap]
    for t in value.get("tmpfs", []):
        args += ["--tmpfs", f"{t['containerPath']}:size={t['size']}m," + ",".join(t.get("mountOptions", []))]
    return args


# Container definition key -> the `podman run` options the ECS agent's Docker HostConfig amounts to.
TRANSLATE: dict[str, Any] = {
    "user": lambda v, _: ["--user", v],
    "entryPoint": lambda v, _: ["--entrypoint", json.dumps(v)],
    "readonlyRootFilesystem": lambda v, _: [f"--read-only={str(v).lower()}"],
    "privileged": lambda v, _: [f"--privileged={str(v).lower()}"],
    "dockerSecurityOptions": lambda v, _: [a for opt in v for a in ("--security-opt", opt)],
    "linuxParameters": lambda v, _: _linux_parameters(v),
    "mountPoints": lambda v, vols: [a for m in v for a in (
        "-v", f"{vols[m['sourceVolume']]}:{m['containerPath']}" + (":ro" if m["readOnly"] else ""))],
    "memory": lambda v, _: ["--memory", f"{v}m"],
    "memoryReservation": lambda v, _: ["--memory-reservation", f"{v}m"],
    "stopTimeout": lambda v, _: ["--stop-timeout", str(v)],
    "command": lambda v, _: [],                  # after the image, below
}
# Keys with no `podman run` option: identity, ordering (played by the test), informational in host mode,
# the health check (run by the test as the ECS agent runs it), a CPU reservation of the scheduler's.
NO_RUNTIME_EFFECT = {"name", "image", "essential", "dependsOn", "portMappings", "healthCheck", "cpu"}


def run_args(c: dict[str, Any], volumes: dict[str, Path], netns: str, name: str, image: str) -> list[str]:
    """`podman run` options for one ECS container definition. Every key is translated or listed in
    NO_RUNTIME_EFFECT; any other key fails, so a setting added to the task is never silently left out."""
    unknown = set(c) - set(TRANSLATE) - NO_RUNTIME_EFFECT
    assert not unknown, f"container {c['name']}: no translation for {unknown}"
    # Docker's --read-only mounts nothing writable; podman's adds tmpfs on /tmp, /var/tmp and /run.
    args = ["--name", name, "--network", f"ns:/run/netns/{netns}", "--read-only-tmpfs=false"]
    for key, value in c.items():
        if key in TRANSLATE:
            args += TRANSLATE[key](value, volumes)
    return [*args, image, *c.get("command", [])]


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _udp(lab: Lab, ns: str, src: str, dst: str, nbytes: int) -> None:
    sock = run_in_ns(ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        sock.bind((src, 0))
        for _ in range(nbytes // 1400):
            sock.sendto(b"x" * 1400, (dst, 9999))
    finally:
        sock.close()


def test_the_task_runs_as_ecs_would_run_it(image: Image, tmp_path: Path) -> None:
    td = json.loads(TASK.read_text())
    assert td["networkMode"] == "host"
    init, agent = td["containerDefinitions"]
    # The host's directories: a missing sourcePath is created by Docker as root:root 0755.
    host = Path(tempfile.mkdtemp(prefix="bw-ecs-", dir="/var/tmp"))
    state, config = host / "var-lib-burstwatch", host / "etc-burstwatch"
    state.mkdir(mode=0o755)
    config.mkdir(mode=0o755)
    paths = {v["host"]["sourcePath"]: v["name"] for v in td["volumes"]}
    volumes = {paths["/var/lib/burstwatch"]: state, paths["/etc/burstwatch"]: config}
    imds = ImdsServer(metadata_tree(enis=(ENI,)))
    suffix = os.getpid()
    names = [f"bw-ecs-init-{suffix}", f"bw-ecs-agent-{suffix}"]
    try:
        with Lab() as lab:
            a, b = lab.host("a"), lab.host("b")
            lab.link(a, b, "10.98.0.1/24", "10.98.0.2/24", names=("eth0", "eth0"))
            lab.run(a, "ip", "link", "set", "eth0", "address", MAC)
            run_in_ns(a, imds.start)
            # Off EC2: the lab's IMDS (reachable on loopback in the shared namespace), a fixed profile.
            (config / "burstwatch.toml").write_text(toml_text({
                "sample_interval": 0.5,
                "imds": {"endpoint": imds.url, "timeout": 0.5},
                "instance": {"type": "m5.large", "describe_api": False},
                "credits": {"save_interval": 1.0},
            }))

            def start() -> None:
                # dependsOn: the agent starts once the init container exited 0 (SUCCESS).
                assert agent["dependsOn"] == [{"containerName": init["name"], "condition": "SUCCESS"}]
                podman("rm", "-f", *names, check=False)
                done = podman("run", *run_args(init, volumes, a, names[0], image.tag), timeout=120)
                assert done.returncode == 0
                podman("run", "-d", *run_args(agent, volumes, a, names[1], image.tag), timeout=120)
                wait_until(lambda: _up(lab, a), 60, "/metrics from the agent's container")

            start()
            st = state.stat()
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, UID, 0o2770), st
            text = lab.http_get(a, METRICS)
            assert (f'burstwatch_interface_info{{device_index="0",eni_id="{ENI.interface_id}",interface="eth0",'
                    f'mac="{MAC}",network_card="0"}} 1.0') in text
            assert 'start="fresh"' in text
            key = 'burstwatch_interface_bytes_total{direction="in",interface="eth0"}'
            before = parse_metrics(text)[key]
            _udp(lab, b, "10.98.0.2", "10.98.0.1", 2_000_000)
            wait_until(lambda: parse_metrics(lab.http_get(a, METRICS))[key] >= before + 2_000_000, 15,
                       "eth0's counters moving (the namespace's interface, seen from the container)")

            pid = int(podman("inspect", "--format", "{{.State.Pid}}", names[1]).stdout)
            s = _status(pid)
            assert s["Uid"].split()[:2] == [str(UID), str(UID)] and s["CapEff"] == "0000000000000000"
            assert s["CapPrm"] == "0000000000000000" and s["NoNewPrivs"] == "1"
            touch = podman("exec", names[1], "/usr/bin/python3", "-c", "open('/usr/probe', 'w')", check=False)
            assert touch.returncode != 0 and b"Read-only file system" in touch.stderr
            # The task's health check, as the ECS agent runs it (CMD form: the rest is argv).
            check = agent["healthCheck"]["command"]
            assert check[0] == "CMD"
            assert podman("exec", names[1], *check[1:], check=False).returncode == 0

            # Stop within the task's stopTimeout; the state on the host volume carries on into the next task.
            wait_until(lambda: (state / "credits.json").exists(), 20, "credit state saved")
            t0 = time.monotonic()
            podman("stop", names[1], timeout=60)
            assert time.monotonic() - t0 < agent["stopTimeout"]
            assert (state / "credits.json").stat().st_uid == UID
            start()
            assert 'start="restored"' in lab.http_get(a, METRICS)
    finally:
        podman("rm", "-f", *names, check=False)
        imds.stop()
        shutil.rmtree(host, ignore_errors=True)


def _up(lab: Lab, ns: str) -> bool:
    try:
        return "burstwatch_credit_remaining_bytes" in lab.http_get(ns, METRICS)
    except OSError:
        return False
