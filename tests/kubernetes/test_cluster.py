"""The chart on a real cluster: `helm install` into a real API server (admission, RBAC, Pod Security), the
DaemonSet controller and the scheduler placing the pod, a real kubelet on containerd running it (probes,
restarts, downward API, seccomp RuntimeDefault, hostPath), a rolling `helm upgrade` on the host network, the
prometheus-operator objects accepted by a server with their CRDs, and `helm uninstall` leaving the node clean.

The cluster (tests/kubernetes/cluster.py) runs in a network namespace of its own, with a 10.x node address
inside it: every kubectl, helm and HTTP request here (the node's /metrics and /-/ready, its loopback, the
traffic the agent counts on `lo`) goes from inside that namespace, so the host-network pod is reached on the
node's network exactly as on a node, and nothing is sent in the host's own namespace. The cluster lives for
this module and is torn down even when a test fails;
its teardown fails the module when anything it made is left on the host. Figures (cluster up, rollout,
rolling update, the control plane's memory) are printed: `pytest -s` shows them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from tests.kubernetes.chart import CHART, CRDS, require_helm
from tests.kubernetes.cluster import BIN, NODE, NODE_IP, PAUSE_IMAGE, Cluster, in_ns, ns_argv, require_cluster_tools
from tests.support.credit_lab import parse_metrics
from tests.support.launch import launcher_argv, unit_env
from tests.support.podman import build_image, podman
from tests.support.project_image import Image

pytestmark = pytest.mark.slow

NS = "burstwatch"
RELEASE = "burstwatch"
DS = "burstwatch"
METRICS_PORT = 29786          # this tier's ports (the systemd tests use 19786/15201)
RESPONDER_PORT = 25201
UID = 10786
# Stated times. The hand run: the DaemonSet ready 2.3-2.5 s after `helm install`, a rolling update in
# 2.5-3.8 s; the bounds leave room for 6 other test sessions on 2 cores.
ROLLOUT_S = 90
# The lab's probe timing (values.yaml keeps the EC2 defaults: liveness after 10 s then every 30 s,
# readiness every 15 s), so that a verdict comes within seconds here.
LAB_PROBES = {"livenessProbe": {"initialDelaySeconds": 2, "periodSeconds": 3},
              "readinessProbe": {"periodSeconds": 2}}


class Lab:
    def __init__(self, cluster: Cluster, image: str, state: Path, work: Path) -> None:
        self.cluster, self.image, self.state, self.work = cluster, image, state, work

    def values(self, config_extra: str = "", **over: Any) -> Path:
        """Values that work off EC2: no IMDS (never the real one from a test), a fixed instance type, loopback
        as the interface, the state in a test directory, the image imported (never pulled)."""
        repo, tag = self.image.rsplit(":", 1)
        values: dict[str, Any] = {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "metrics": {"port": METRICS_PORT},
            "responder": {"port": RESPONDER_PORT},
            "state": {"hostPath": str(self.state)},
            "config": ('interfaces = ["lo"]\n' + config_extra
                       + '[imds]\nenabled = false\n[instance]\ntype = "m5.large"\n'),
            **LAB_PROBES,
        }
        for k, v in over.items():
            values[k] = {**values[k], **v} if isinstance(v, dict) and isinstance(values.get(k), dict) else v
        f = self.work / f"values-{time.monotonic_ns()}.yaml"
        f.write_text(yaml.safe_dump(values), encoding="utf-8")
        return f

    def helm(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        # In the cluster's namespace: the API server listens on its loopback.
        proc = subprocess.run(ns_argv(str(require_helm()), f"--kubeconfig={self.cluster.kubeconfig}", *args),
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: {proc.stderr}")
        return proc

    def rollout(self, timeout: float = ROLLOUT_S) -> float:
        t0 = time.monotonic()
        proc = self.cluster.kubectl("-n", NS, "rollout", "status", f"daemonset/{DS}", f"--timeout={int(timeout)}s",
                                    timeout=timeout + 30, check=False)
        assert proc.returncode == 0, f"rollout: {proc.stdout}{proc.stderr}\n{self.describe()}"
        return time.monotonic() - t0

    def pods(self) -> list[dict]:
        return self.cluster.get("-n", NS, "pods", "-l", "app.kubernetes.io/name=burstwatch")["items"]

    def pod(self) -> dict:
        pods = [p for p in self.pods() if p["metadata"].get("deletionTimestamp") is None]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def describe(self) -> str:
        return (self.cluster.kubectl("-n", NS, "describe", "pods", check=False).stdout[-4000:]
                + self.cluster.log_tail("kubelet", 3000))

    def main_pid(self, pod: dict) -> int:
        """The agent's pid on the host, from containerd's task of the pod's container."""
        (status,) = pod["status"]["containerStatuses"]
        cid = status["containerID"].split("://", 1)[1]
        for line in self.cluster._ctr("tasks", "ls").stdout.splitlines()[1:]:
            fields = line.split()
            if fields[0] == cid:
                return int(fields[1])
        raise AssertionError(f"no task for {cid}")


def _scrape(host: str = NODE_IP, path: str = "/metrics", port: int = METRICS_PORT) -> str:
    """GET from inside the cluster's namespace: the node's address and its loopback are there."""
    def get() -> str:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as r:
            return r.read().decode()  # type: ignore[no-any-return]

    return in_ns(get, timeout=10)


def _answers(host: str = NODE_IP) -> bool:
    try:
        return "burstwatch_credit_remaining_bytes" in _scrape(host)
    except OSError:
        return False


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _loopback_traffic(nbytes: int) -> None:
    """Move `nbytes` over the node's loopback, the cluster namespace's `lo` that the agent samples (called
    through in_ns)."""
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


def _wait(what: str, cond: Any, timeout: float, lab: Optional[Lab] = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s" + (f"\n{lab.describe()}" if lab else ""))
        time.sleep(0.2)


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


def _pause_image(tmp: Path, cluster: Cluster) -> None:
    """registry.k8s.io/pause:3.10 from the module's own pause.c (built by make into .tools), FROM scratch."""
    ctx = tmp / "pause"
    ctx.mkdir()
    shutil.copy(BIN / "pause", ctx / "pause")
    (ctx / "Containerfile").write_text('FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n')
    tag = "localhost/burstwatch-pause-test:lab"
    build_image(ctx / "Containerfile", ctx, tag, layers=False)
    try:
        podman("save", "-o", str(tmp / "pause.tar"), tag)
    finally:
        podman("rmi", "-f", tag, check=False)
    cluster.import_image(tmp / "pause.tar")
    cluster._ctr("images", "tag", "--force", tag, PAUSE_IMAGE)


@pytest.fixture(scope="module")
def lab(image: Image) -> Iterator[Lab]:
    require_cluster_tools()
    require_helm()
    work = Path(tempfile.mkdtemp(prefix="bw-cluster-", dir="/var/tmp"))
    state = work / "hostpath-state"       # the chart's hostPath, never /var/lib/burstwatch
    cluster = Cluster(work / "k8s")
    try:
        cluster.start()
        t0 = time.monotonic()
        _pause_image(work, cluster)
        podman("save", "-o", str(work / "burstwatch.tar"), image.tag)
        cluster.import_image(work / "burstwatch.tar")
        cluster.timings["images imported"] = time.monotonic() - t0
        yield Lab(cluster, image.tag, state, work)
    finally:
        cluster.stop()
        left = cluster.leftovers()
        changed = [u for u in cluster.undone if not u.startswith("process")]
        print(f"cluster timings: {cluster.timings}\nchanges found and undone at teardown: {changed}")
        if not left:
            shutil.rmtree(work, ignore_errors=True)
        assert not left, f"the cluster left on the host: {left} (logs in {work})"


def test_install_rolls_out_and_serves_metrics_with_the_node_name(lab: Lab) -> None:
    t0 = time.monotonic()
    lab.helm("install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace", "--values", str(lab.values()))
    took = time.monotonic() - t0
    took += lab.rollout()
    lab.cluster.timings["daemonset ready after helm install"] = took
    print(f"DaemonSet ready {took:.1f} s after helm install; cluster up in {lab.cluster.timings['cluster up']:.1f} s")
    pod = lab.pod()
    assert pod["spec"]["nodeName"] == NODE
    # /metrics on the node's address (hostNetwork), from the node's network namespace.
    text = _scrape()
    assert "burstwatch_credit_remaining_bytes" in text
    assert re.search(rf'^burstwatch_instance_info\{{[^}}]*node="{NODE}"', text, re.M), text[:2000]
    mem = lab.cluster.memory_mib()
    print("memory (RSS, MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in mem.items())
          + f"; in all {sum(mem.values()):.0f}")


def test_pod_runs_unprivileged_with_a_read_only_root(lab: Lab) -> None:
    pid = lab.main_pid(lab.pod())
    st = _status(pid)
    assert st["Uid"].split()[:2] == [str(UID), str(UID)], st["Uid"]
    assert st["CapEff"] == "0000000000000000" and st["CapPrm"] == "0000000000000000", st
    assert st["NoNewPrivs"] == "1"
    assert st["Seccomp"] == "2", "containerd's RuntimeDefault seccomp filter"
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
        root = [line.split() for line in f if line.split()[4] == "/"]
    assert root and "ro" in root[-1][5].split(","), root


def test_kubelet_liveness_and_readiness_pass(lab: Lab) -> None:
    def counts() -> dict[tuple[str, str], float]:
        """The kubelet's own probe counters for the container (its /metrics/probes, through the API server)."""
        raw = lab.cluster.kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/metrics/probes").stdout
        out: dict[tuple[str, str], float] = {}
        for line in raw.splitlines():
            m = re.match(r'prober_probe_total\{([^}]*)\} (\S+)', line)
            if m and 'container="burstwatch"' in m.group(1):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                out[(labels["probe_type"], labels["result"])] = out.get(
                    (labels["probe_type"], labels["result"]), 0) + float(m.group(2))
        return out

    _wait("a successful liveness and readiness probe",
          lambda: min(counts().get((t, "successful"), 0) for t in ("Liveness", "Readiness")) >= 1, 30, lab)
    c = counts()
    assert c.get(("Liveness", "failed"), 0) == 0 and c.get(("Readiness", "failed"), 0) == 0, c
    (status,) = lab.pod()["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status


def test_state_in_the_hostpath_survives_deleting_the_pod(lab: Lab) -> None:
    name = lab.pod()["metadata"]["name"]
    in_ns(lambda: _loopback_traffic(2 << 30), timeout=120)   # spend credit well above m5.large's baseline
    saved = lab.state / "credits.json"
    _wait("credit state saved", saved.exists, 20, lab)
    time.sleep(6)   # credits.save_interval = 5 s: a save after the traffic
    spent, spent_at = parse_metrics(_scrape()), time.monotonic()
    lab.cluster.kubectl("-n", NS, "delete", "pod", name, "--wait=true", timeout=60)
    lab.rollout()
    _wait("/metrics from the replacement pod", _answers, 60, lab)
    assert lab.pod()["metadata"]["name"] != name
    text = _scrape()
    again, gap = parse_metrics(text), time.monotonic() - spent_at
    assert 'start="restored"' in text
    rem, bucket = 'burstwatch_credit_remaining_bytes{direction="in"}', 'burstwatch_credit_bucket_bytes{direction="in"}'
    assert spent[rem] < spent[bucket]
    baseline = next(v for k, v in again.items()
                    if k.startswith('burstwatch_bandwidth_baseline_bytes_per_second{direction="in"'))
    # At most the refill at the baseline over the gap, and over one more sample: each scrape reads the
    # daemon's last sample, up to one sample_interval (1 s, the default here) older than the scrape.
    assert again[rem] <= spent[rem] + baseline * (gap + 1.0) * 1.05 and again[rem] < again[bucket]


def test_the_pods_daemon_costs_what_the_debs_does(lab: Lab, image: Image, tmp_path: Path) -> None:
    """The pod's daemon RSS against the same daemon from the .deb's files, same config; its idle CPU (for the
    chart's requests; docs/kubernetes.md, "Resources")."""
    pid = lab.main_pid(lab.pod())
    cpu0, t0 = _cpu_seconds(pid), time.monotonic()
    time.sleep(10)
    idle_cpu = (_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    rss_pod = _rss_kib(pid)
    cfg = lab.cluster.get("-n", NS, "configmap", DS)["data"]["burstwatch.toml"]
    rss_deb = _deb_daemon_rss(image.deb, cfg, tmp_path, settle=20)
    print(f"idle CPU: {1000 * idle_cpu:.1f} millicores; RSS: pod {rss_pod} KiB, .deb {rss_deb} KiB "
          f"({100.0 * (rss_pod - rss_deb) / rss_deb:+.1f} %)")
    assert idle_cpu < 0.1
    assert abs(rss_pod - rss_deb) <= 0.10 * rss_deb


def test_upgrade_with_a_new_config_rolls_the_daemonset_on_the_host_port(lab: Lab) -> None:
    old = lab.pod()
    old_pid = lab.main_pid(old)
    t0 = time.monotonic()
    lab.helm("upgrade", RELEASE, str(CHART), "--namespace", NS,
             "--values", str(lab.values(config_extra="sample_interval = 2.0\n")))
    took = time.monotonic() - t0 + lab.rollout()
    lab.cluster.timings["rolling update"] = took
    print(f"rolling update in {took:.1f} s")
    new = lab.pod()
    assert new["metadata"]["name"] != old["metadata"]["name"]
    assert new["metadata"]["annotations"]["checksum/config"] != old["metadata"]["annotations"]["checksum/config"]
    (status,) = new["status"]["containerStatuses"]
    # The old pod freed port 9786's stand-in before the new one bound it: no failed start, no restart.
    assert status["ready"] and status["restartCount"] == 0, status
    assert "lastState" not in status or not status["lastState"], status
    new_pid = lab.main_pid(new)
    assert new_pid != old_pid
    logs = lab.cluster.kubectl("-n", NS, "logs", new["metadata"]["name"]).stdout
    assert "Address already in use" not in logs
    assert _answers()


def test_probes_follow_a_loopback_metrics_address(lab: Lab) -> None:
    """metrics.address 127.0.0.1: the kubelet probes 127.0.0.1 (the node's loopback: hostNetwork), not the
    node's IP, so the pod becomes Ready instead of being restarted forever."""
    lab.helm("upgrade", RELEASE, str(CHART), "--namespace", NS,
             "--values", str(lab.values(metrics={"address": "127.0.0.1"})))
    lab.rollout()
    assert _answers("127.0.0.1") and not _answers(NODE_IP)
    (status,) = lab.pod()["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status


def test_a_responder_that_cannot_listen_is_never_ready(lab: Lab) -> None:
    """The responder's port taken: the agent runs on (burstwatch_responder_listening 0) but /-/ready answers
    503, so the kubelet never marks the pod Ready and the rollout does not complete."""
    def take_port() -> socket.socket:
        s = socket.socket()   # made in the node's namespace, where the pod's responder listens
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", RESPONDER_PORT))
        s.listen(1)
        return s

    blocker = in_ns(take_port)
    try:
        lab.helm("upgrade", RELEASE, str(CHART), "--namespace", NS,
                 "--values", str(lab.values(responder={"enabled": True})))
        _wait("the new pod's /metrics", _answers, 60, lab)
        text = _scrape()
        assert "burstwatch_responder_listening 0.0" in text
        with pytest.raises(urllib.error.HTTPError) as err:
            _scrape(path="/-/ready")
        assert err.value.code == 503 and b"responder" in err.value.read()
        # Proof that the kubelet has judged it, not a pause: three failed readiness probes (the lab's
        # period is 2 s), counted in the pod's Unhealthy events.
        name = lab.pod()["metadata"]["name"]

        def failed_readiness() -> int:
            events = lab.cluster.get("-n", NS, "events", "--field-selector",
                                     f"involvedObject.name={name},reason=Unhealthy")["items"]
            return sum(e.get("count") or (e.get("series") or {}).get("count") or 1
                       for e in events if "Readiness probe failed" in e.get("message", ""))

        _wait("three failed readiness probes", lambda: failed_readiness() >= 3, 30, lab)
        (status,) = lab.pod()["status"]["containerStatuses"]
        assert not status["ready"] and status["restartCount"] == 0, status
    finally:
        blocker.close()
    # The port free again, a restart of the pod listens, and it is Ready.
    lab.cluster.kubectl("-n", NS, "delete", "pod", lab.pod()["metadata"]["name"], "--wait=true", timeout=60)
    lab.rollout()
    assert _scrape(path="/-/ready").strip() == "ready"
    assert "burstwatch_responder_listening 1.0" in _scrape()


def test_baseline_pod_security_rejects_the_pod(lab: Lab) -> None:
    """docs/kubernetes.md: a namespace at the `baseline` level refuses the pod for its host network, hostPath
    and hostPort (the last filled in by the API server from the containerPort on the host network)."""
    lab.cluster.kubectl("create", "namespace", "bw-baseline")
    lab.cluster.kubectl("label", "namespace", "bw-baseline", "pod-security.kubernetes.io/enforce=baseline")
    try:
        ds = lab.cluster.get("-n", NS, "daemonset", DS)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bw-baseline", "namespace": "bw-baseline"},
               "spec": {**ds["spec"]["template"]["spec"], "serviceAccountName": "default"}}
        proc = lab.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
        assert proc.returncode != 0
        for word in ("host namespaces", "hostPath volumes", "hostPort"):
            assert word in proc.stderr, proc.stderr
    finally:
        lab.cluster.kubectl("delete", "namespace", "bw-baseline", "--wait=false", check=False)


def test_servicemonitor_and_prometheusrule_accepted_with_the_crds(lab: Lab) -> None:
    crds = sorted(CRDS.glob("monitoring.coreos.com_*.yaml"))
    assert crds, f"{CRDS}: `make test-deps` fetches prometheus-operator's CRDs"
    for crd in crds:
        lab.cluster.kubectl("apply", "--server-side", "-f", str(crd))
    lab.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        *[f"crd/{yaml.safe_load(c.read_text())['metadata']['name']}" for c in crds], timeout=90)
    lab.helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "--values", str(lab.values(
        serviceMonitor={"enabled": True}, podMonitor={"enabled": True},
        prometheusRule={"enabled": True, "testAlert": True})))
    lab.rollout()
    sm = lab.cluster.get("-n", NS, "servicemonitor", DS)
    pr = lab.cluster.get("-n", NS, "prometheusrule", DS)
    pm = lab.cluster.get("-n", NS, "podmonitor", DS)
    assert sm["spec"]["endpoints"] and pm["spec"]["podMetricsEndpoints"]
    assert any(r.get("alert") == "BurstwatchTestAlert" for g in pr["spec"]["groups"] for r in g["rules"])


def test_uninstall_leaves_the_node_clean(lab: Lab) -> None:
    pid = lab.main_pid(lab.pod())
    lab.helm("uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout", "60s")
    _wait("no burstwatch pod", lambda: not lab.pods(), 60, lab)
    _wait("the agent's process gone", lambda: not Path(f"/proc/{pid}").exists(), 30, lab)
    assert not _answers() and not _answers("127.0.0.1")
    kinds = ["daemonset", "configmap", "serviceaccount", "service"]
    # The prometheus-operator kinds exist once their CRDs are installed (this module's test above does).
    served = lab.cluster.kubectl("api-resources", "--api-group=monitoring.coreos.com", "-o", "name").stdout.split()
    kinds += [k for k in ("servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com",
                          "prometheusrules.monitoring.coreos.com") if k in served]
    for kind in kinds:
        items = lab.cluster.get("-n", NS, kind, "-l", "app.kubernetes.io/instance=" + RELEASE)["items"]
        assert not items, (kind, items)
    # The kubelet stopped the pod's containers and its sandbox (their records go at its next container GC,
    # a minute later) and removed the pod's directories (volumes unmounted).
    _wait("no running task", lambda: not lab.cluster.running_tasks(), 60, lab)
    pods_dir = lab.cluster.work / "kubelet" / "root" / "pods"
    _wait("no pod directories", lambda: not any(pods_dir.iterdir()), 60, lab)
    # The credit state on the hostPath stays: it is the node's, not the release's (docs/kubernetes.md).
    assert (lab.state / "credits.json").exists()
    print(f"figures: {lab.cluster.timings}")
