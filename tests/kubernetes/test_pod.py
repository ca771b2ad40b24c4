"""The image and the chart's pod, run for real with podman: the image built from the Containerfile on the
.deb, its size; the DaemonSet's pod template played as a Pod on the host's network with the chart's
ConfigMap: the host's interfaces on /metrics and their counters moving, non-root with no capability on a
read-only root, the probes' endpoints, credit state kept across `kube down` and a second `play`, and its
RSS against the same daemon run from the .deb's files."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest
import yaml

from tests.conftest import ROOT, require_root_tools, wait_until
from tests.kubernetes.chart import one, render
from tests.packaging.debroot import build, copy_tree
from tests.support.credit_lab import parse_metrics
from tests.support.launch import launcher_argv, unit_env
from tests.support.podman import build_image, ensure_base_image, podman, require_podman

pytestmark = pytest.mark.slow

CONTAINERFILE = ROOT / "packaging" / "container" / "Containerfile"
# The Containerfile names the real registry's image; here the debootstrap base stands in for it.
FROM_NAME = "docker.io/library/debian:12-slim"
METRICS_PORT = 29786          # this tier's ports (the systemd tests use 19786/15201)
RESPONDER_PORT = 25201
IMAGE_LIMIT_BYTES = 200 * 1000 * 1000
UID = 10786
NODE = "lab-node-1"


def _default_interface() -> str:
    with open("/proc/net/route", encoding="utf-8") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == "00000000":
                return fields[0]
    return "lo"


class Image(NamedTuple):
    tag: str
    deb: Path


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    require_podman()
    require_root_tools("dpkg-buildpackage", "dh", "fakeroot", "dpkg-deb")
    base = ensure_base_image()
    tag = f"localhost/burstwatch-k8s-test:{os.getpid()}"
    work = tmp_path_factory.mktemp("image")
    deb = build("deb", copy_tree(work / "tree"), work / "out")
    context = work / "context"
    context.mkdir()
    shutil.copy(deb, context / deb.name)
    podman("tag", base, FROM_NAME)
    try:
        # layers=False: no cached image of the build stage is left behind (podman keeps one otherwise).
        build_image(CONTAINERFILE, context, tag, layers=False)
        yield Image(tag, deb)
    finally:
        podman("rmi", "-f", tag, check=False)
        # Only the stand-in name: `podman untag IMAGE` alone would strip every name of the shared base.
        podman("untag", FROM_NAME, FROM_NAME, check=False)


def test_image_size_and_what_it_can_do(image: Image) -> None:
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image.tag).stdout)
    print(f"image size: {size / 1e6:.1f} MB")
    assert size <= IMAGE_LIMIT_BYTES
    # The pruned botocore still builds every client the agent uses (and sts, for IRSA).
    code = ("import boto3; s = boto3.session.Session(region_name='us-east-1'); "
            "[s.client(n) for n in ('ec2', 'cloudwatch', 's3', 'sts')]; print('clients ok')")
    out = podman("run", "--rm", "--network", "none", "--entrypoint", "/usr/bin/python3", image.tag, "-c", code)
    assert b"clients ok" in out.stdout
    out = podman("run", "--rm", "--network", "none", image.tag, "--version")
    assert re.search(rb"\d+\.\d+\.\d+", out.stdout + out.stderr)


def _pod_yaml(image: str, state_dir: Path, tmp: Path, interface: str) -> tuple[str, str]:
    """The chart's ConfigMap and its DaemonSet's pod template as a Pod (podman does not play DaemonSets)."""
    repo, tag = image.rsplit(":", 1)
    values = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "metrics": {"port": METRICS_PORT},
        "responder": {"port": RESPONDER_PORT},
        # Off EC2: no IMDS (never the real one from a test), a fixed profile, loopback to move traffic on.
        "config": f'interfaces = ["lo", "{interface}"]\n[imds]\nenabled = false\n[instance]\ntype = "m5.large"\n',
    }
    objects = render(values, tmp=tmp)
    cm = one(objects, "ConfigMap")
    ds = one(objects, "DaemonSet")
    name = f"bw-k8s-{os.getpid()}"
    spec = ds["spec"]["template"]["spec"]
    for v in spec["volumes"]:
        if v["name"] == "state":
            v["hostPath"]["path"] = str(state_dir)
    # podman 4.3 turns every containerPort into a published port, which host networking refuses; on a
    # kubelet they are informational with hostNetwork. The probes then name the port by number.
    for c in spec["containers"]:
        ports = {p["name"]: p["containerPort"] for p in c.pop("ports")}
        for probe in ("livenessProbe", "readinessProbe"):
            c[probe]["httpGet"]["port"] = ports[c[probe]["httpGet"]["port"]]
        # podman has no node: the downward API's spec.nodeName becomes the value a kubelet would give.
        for e in c["env"]:
            if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                e.pop("valueFrom")
                e["value"] = NODE
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": ds["spec"]["template"]["metadata"]["labels"],
                        # podman 4.3 races removing a "once" init container that it still sees running;
                        # "always" keeps it (stopped) instead. A kubelet runs it once per pod start too.
                        "annotations": {"io.podman.annotations.init.container.type": "always"}},
           "spec": spec}
    return name, yaml.safe_dump_all([cm, pod], sort_keys=False)


def _scrape(path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}{path}", timeout=5) as r:
        assert r.status == 200
        return r.read().decode()


def _up() -> bool:
    try:
        return "burstwatch_credit_remaining_bytes" in _scrape()
    except OSError:
        return False


def _loopback_traffic(nbytes: int) -> None:
    """Move `nbytes` over loopback (the only traffic a test may make on the host's own interfaces)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def sink() -> None:
        conn, _ = srv.accept()
        with conn:
            while conn.recv(1 << 20):
                pass

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    chunk = b"\0" * (1 << 20)
    with socket.create_connection(srv.getsockname()) as c:
        for _ in range(nbytes // len(chunk)):
            c.sendall(chunk)
    t.join(30)
    srv.close()


def _main_pid(pod: str) -> int:
    ctr = f"{pod}-burstwatch"
    return int(podman("inspect", "--format", "{{.State.Pid}}", ctr).stdout)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _rss_kib(pid: int) -> int:
    return int(_status(pid)["VmRSS"].split()[0])


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15, in clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _deb_daemon_rss(deb: Path, config: str, tmp: Path, settle: float) -> int:
    """RSS of the same daemon from the .deb's files (dpkg-deb -x), started by its launcher in its unit's
    environment on the host's Debian python3 and libraries (the same Debian 12 packages the image installs),
    after `settle` seconds."""
    root = tmp / "deb-root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=60)
    state = tmp / "deb-state"
    state.mkdir()
    cfg = tmp / "deb.toml"
    cfg.write_text(config.replace("/var/lib/burstwatch", str(state))
                   .replace(f":{METRICS_PORT}", f":{METRICS_PORT + 1}"), encoding="utf-8")
    units = list(root.glob("**/systemd/system/burstwatch.service"))
    assert len(units) == 1, units
    proc = subprocess.Popen([*launcher_argv(root / "usr/lib/burstwatch", root / "usr/bin/burstwatch"),
                             "run", "--config", str(cfg)], env=unit_env(units[0]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        assert proc.poll() is None, "the .deb's daemon exited"
        return _rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


def test_pod_from_the_chart(image: Image, tmp_path: Path) -> None:
    interface = _default_interface()
    state_dir = Path(tempfile.mkdtemp(prefix="bw-k8s-state-", dir="/var/tmp"))
    os.rmdir(state_dir)      # the kubelet creates a missing hostPath (DirectoryOrCreate): so does podman
    name, doc = _pod_yaml(image.tag, state_dir, tmp_path, interface)
    play = tmp_path / "pod.yaml"
    play.write_text(doc, encoding="utf-8")
    try:
        podman("kube", "play", str(play), timeout=300)
        wait_until(_up, 60, "/metrics from the pod")
        # /metrics shows the host's interfaces (hostNetwork), and loopback's counters move with traffic.
        text = _scrape()
        m = parse_metrics(text)
        key = 'burstwatch_interface_bytes_total{direction="in",interface="lo"}'
        assert key in m and f'interface="{interface}"' in text
        before = m[key]
        _loopback_traffic(400 << 20)
        wait_until(lambda: parse_metrics(_scrape())[key] >= before + (400 << 20), 15, "lo counters moving")
        # The probes' endpoints.
        assert "Metrics" in _scrape("/")
        # Non-root, no capability, read-only root, node name label.
        pid = _main_pid(name)
        st = _status(pid)
        assert st["Uid"].split()[:2] == [str(UID), str(UID)] and st["CapEff"] == "0000000000000000"
        assert st["CapPrm"] == "0000000000000000" and st["NoNewPrivs"] == "1"
        touch = podman("exec", f"{name}-burstwatch", "/usr/bin/python3", "-c",
                       "open('/usr/probe', 'w')", check=False)
        assert touch.returncode != 0 and b"Read-only file system" in touch.stderr
        assert podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}",
                      f"{name}-burstwatch").stdout.strip() == b"true"
        assert 'start="fresh"' in text
        assert re.search(r'^burstwatch_instance_info\{[^}]*node="lab-node-1"', text, re.M)
        # Spend credit on loopback well above m5.large's baseline, then let a save land.
        _loopback_traffic(2 << 30)
        wait_until(lambda: (state_dir / "credits.json").exists(), 20, "credit state saved")
        time.sleep(6)   # credits.save_interval = 5 s
        spent, spent_at = parse_metrics(_scrape()), time.monotonic()
        rss_pod = _rss_kib(pid)
        podman("kube", "down", str(play), timeout=120)
        assert not _up()

        # Second play: the state on the hostPath carries on.
        podman("kube", "play", str(play), timeout=300)
        wait_until(_up, 60, "/metrics after the second play")
        again_text = _scrape()
        again, gap = parse_metrics(again_text), time.monotonic() - spent_at
        assert 'start="restored"' in again_text
        rem = 'burstwatch_credit_remaining_bytes{direction="in"}'
        bucket = 'burstwatch_credit_bucket_bytes{direction="in"}'
        assert spent[rem] < spent[bucket]                  # traffic spent credit in the first pod
        # The second pod continues from the saved estimate: at most the refill at the baseline since the
        # last scrape (the gap is credited at the baseline), never a full bucket.
        baseline = next(v for k, v in again.items()
                        if k.startswith('burstwatch_bandwidth_baseline_bytes_per_second{direction="in"'))
        assert again[rem] <= spent[rem] + baseline * gap * 1.05
        assert again[rem] < again[bucket]
        print(f"state: remaining in {spent[rem]:.0f} before down, {again[rem]:.0f} after play "
              f"(bucket {again[bucket]:.0f})")
        # Idle CPU of the pod's daemon (for the chart's requests), over 10 s of 1 s samples.
        pid2 = _main_pid(name)
        cpu0, t0 = _cpu_seconds(pid2), time.monotonic()
        time.sleep(10)
        idle_cpu = (_cpu_seconds(pid2) - cpu0) / (time.monotonic() - t0)
        print(f"idle CPU: {1000 * idle_cpu:.1f} millicores")
        assert idle_cpu < 0.1

        # RSS: the pod's daemon against the same daemon from the .deb's files, same config and age.
        cfg = one(yaml.safe_load_all(doc), "ConfigMap")["data"]["burstwatch.toml"]
        rss_deb = _deb_daemon_rss(image.deb, cfg, tmp_path, settle=20)
        print(f"RSS: pod {rss_pod} KiB, .deb {rss_deb} KiB ({100.0 * (rss_pod - rss_deb) / rss_deb:+.1f} %)")
        assert abs(rss_pod - rss_deb) <= 0.10 * rss_deb
    finally:
        podman("kube", "down", str(play), check=False, timeout=120)
        shutil.rmtree(state_dir, ignore_errors=True)
