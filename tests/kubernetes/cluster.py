"""A real single-node Kubernetes for the cluster tier: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd and a kubelet, all on this machine, built by `make test-deps` into .tools/kubernetes
(Makefile, "A real single-node cluster"). The facts it rests on: ../shared/kubernetes-cluster.md.

The whole cluster runs in a network namespace of its own (NETNS, made by `start()`): etcd, the control plane,
containerd and the kubelet are started in it (`nsenter --net`: the network namespace only, so the kubelet,
containerd and runc still share the host's mounts), and every kubectl, helm and HTTP request of the tests
goes from inside it (`in_ns`, `ns_argv`). Nothing of the cluster's is sent from or to the
host's own namespace. Everything listens on the namespace's loopback except the kubelet's server, which
listens on the node's address: a 10.x /24 on a veth pair with both ends inside the namespace (NODE_IP; the
kubelet refuses a loopback node IP, and this kernel has no dummy driver). The "node network" that the
host-network pods share is therefore this namespace: their /metrics, probes and `lo` are its. Pods on the
pod network would get 10.244.0.0/24 on the cni0 bridge, also inside the namespace. There is no kube-proxy
and no cluster DNS: a DaemonSet on the host network needs neither.

`Cluster.stop()` undoes everything the cluster did to the host, whatever state a test left it in, and
`leftovers()` lists what it could not: processes, mounts, network namespaces (its own and the pods'), the
node's links and cni0, KUBE-*/CNI-* iptables chains (in the host's namespace: those the kubelet makes in
NETNS go with it), the sysctls the kubelet changes, and the directories it and containerd create.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar

import pytest
import yaml

from tests.conftest import ROOT
from tests.support.lab import run_in_ns

T = TypeVar("T")

VERSION = "v1.34.4"
BIN = ROOT / ".tools" / "kubernetes" / VERSION / "bin"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "etcd", "pause")
NODE = "burstwatch-lab-node"
# The cluster's own network namespace, named per run (two runs on one machine do not share one).
NETNS = f"bwk8s-{os.getpid()}"
# The node's address, on a veth inside NETNS only (10.x, never used from the host's namespace).
NODE_IP = "10.251.0.10"
NODE_LINK = "bwk8s0"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# This tier's ports, away from the defaults (2379, 6443, 10250, ...) so nothing else on the machine clashes.
ETCD_PORT, ETCD_PEER_PORT, API_PORT = 22379, 22380, 26443
KUBELET_PORT, KUBELET_HEALTHZ_PORT, CM_PORT, SCHED_PORT = 20250, 20248, 20257, 20259
# The kubelet sets the first three (it wants overcommit and a panic on oops; not per namespace), the bridge
# plugin the last (per namespace: it sets NETNS's, and the host's must stay as it was).
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "net.ipv4.ip_forward")
# Directories the kubelet, containerd's shims and the CNI plugins make outside the cluster's own directory.
HOST_DIRS = (Path("/var/lib/cni"), Path("/run/containerd"), Path("/var/log/containers"), Path("/var/log/pods"),
             Path("/var/run/netns"), Path("/etc/kubernetes"), Path("/opt/containerd"))
IPTABLES = ("iptables", "ip6tables")


def require_cluster_tools() -> None:
    """Fail (not skip) when a part is missing: `make test-deps` builds and installs them all."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a kubelet and containerd (CI runs as root)")
    missing = [str(BIN / b) for b in BINARIES if not (BIN / b).exists()]
    missing += [t for t in ("containerd", "ctr", "runc", "openssl", "iptables-save") if shutil.which(t) is None]
    missing += [p for p in ("/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback",
                            "/usr/lib/cni/portmap") if not os.path.exists(p)]
    if missing:
        pytest.fail(f"missing {missing}: `make test-deps` builds and installs them")


def _run(*args: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def ns_argv(*argv: str) -> list[str]:
    """argv run in the cluster's network namespace (and only that namespace: mounts stay the host's)."""
    return ["nsenter", f"--net=/run/netns/{NETNS}", "--", *argv]


def in_ns(fn: Callable[[], T], timeout: float = 60.0) -> T:
    """fn called on a thread in the cluster's network namespace: sockets it opens are the namespace's."""
    return run_in_ns(NETNS, fn, timeout=timeout)


def _sysctl(name: str) -> str:
    return Path("/proc/sys", *name.split(".")).read_text().strip()


def _chains(in_cluster_ns: bool = False) -> set[str]:
    """Every KUBE-*/CNI-* iptables chain, as "COMMAND TABLE CHAIN": the host's, or the cluster namespace's."""
    out = set()
    for cmd in IPTABLES:
        if shutil.which(f"{cmd}-save") is None:
            continue
        table = ""
        argv = ns_argv(f"{cmd}-save") if in_cluster_ns else [f"{cmd}-save"]
        for line in _run(*argv, check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith((":KUBE-", ":CNI-")):
                out.add(f"{cmd} {table} {line[1:].split()[0]}")
    return out


# Other tests on this machine make namespaces, veths, mounts and chains of their own at the same time: only
# what is the cluster's by name or place is looked at and removed.
CLUSTER_MOUNTS = ("/run/containerd/", "/var/lib/cni/", "/var/run/netns/cni-", "/run/netns/cni-",
                  f"/run/netns/{NETNS}", f"/var/run/netns/{NETNS}")


def _mounts(under: str) -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = {line.split()[4] for line in f}
    return {m for m in points if m.startswith((under.rstrip("/") + "/", *CLUSTER_MOUNTS))}


def _netns() -> set[str]:
    d = Path("/var/run/netns")
    return {p.name for p in d.iterdir() if p.name.startswith("cni-") or p.name == NETNS} if d.is_dir() else set()


def _links() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()} & {"cni0", NODE_LINK, NODE_LINK + "p"}


def _procs_under(prefix: str) -> list[int]:
    """Processes whose command line names `prefix` (the cluster's directory or binaries): ours only."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if prefix in cmd:
            pids.append(int(p.name))
    return pids


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Cluster:
    """One node's control plane, runtime and kubelet under `work`; `start()` then `stop()` (always)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.pki = work / "pki"
        self.logs = work / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.sysctls = {n: _sysctl(n) for n in SYSCTLS}
        self.chains_before = _chains()
        self.mounts_before = _mounts(str(work))
        self.netns_before = _netns()
        self.links_before = _links()
        self.dirs_before = {d: d.exists() for d in HOST_DIRS}
        self.kubeconfig = work / "admin.kubeconfig"
        self.socket = work / "containerd" / "containerd.sock"
        self.timings: dict[str, float] = {}
        self.undone: list[str] = []
        self.netns_made = False

    # -- certificates ----------------------------------------------------------------------------------
    def _cert(self, name: str, cn: str, org: str = "", sans: str = "", server: bool = False) -> None:
        key, csr, crt, ext = (self.pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
        subj = f"/CN={cn}" + (f"/O={org}" if org else "")
        _run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-subj", subj, "-out", str(csr))
        usage = "serverAuth" if server else "clientAuth"
        ext.write_text(f"keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n"
                       + (f"subjectAltName={sans}\n" if sans else ""))
        _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.pki / "ca.crt"),
             "-CAkey", str(self.pki / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
             "-out", str(crt))

    def _kubeconfig(self, name: str, user: str) -> Path:
        path = self.work / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": f"https://127.0.0.1:{API_PORT}",
                                                     "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": str(self.pki / f"{name}.crt"),
                                              "client-key": str(self.pki / f"{name}.key")}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}]}))
        return path

    def _pki(self) -> None:
        self.pki.mkdir(parents=True)
        _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(self.pki / "ca.key"), "-subj", "/CN=burstwatch-lab-ca", "-days", "2",
             "-out", str(self.pki / "ca.crt"))
        _run("openssl", "genrsa", "-out", str(self.pki / "sa.key"), "2048")
        _run("openssl", "rsa", "-in", str(self.pki / "sa.key"), "-pubout", "-out", str(self.pki / "sa.pub"))
        self._cert("apiserver", "kube-apiserver", server=True,
                   sans=f"IP:127.0.0.1,IP:10.96.0.1,IP:{NODE_IP},DNS:localhost,DNS:kubernetes,"
                        "DNS:kubernetes.default,DNS:kubernetes.default.svc")
        self._cert("kubelet-serving", NODE, server=True, sans=f"IP:{NODE_IP},IP:127.0.0.1,DNS:{NODE}")
        self._cert("admin", "admin", "system:masters")
        self._cert("kubelet", f"system:node:{NODE}", "system:nodes")
        self._cert("controller-manager", "system:kube-controller-manager")
        self._cert("scheduler", "system:kube-scheduler")
        self._cert("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")

    # -- processes -------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.log", "wb")
        # Its own session, so a signal to pytest's process group does not reach it before stop() does.
        # In the cluster's network namespace: nsenter execs argv, so the pid is the process's own.
        self.procs[name] = subprocess.Popen(ns_argv(*argv), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _wait(self, what: str, cond: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise AssertionError(f"{name} exited {p.returncode} while waiting for {what}:\n"
                                         + self.log_tail(name))
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout} s")
            time.sleep(0.2)

    def log_tail(self, name: str, n: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""

    def kubectl(self, *args: str, timeout: float = 60, check: bool = True,
                input: Optional[str] = None) -> subprocess.CompletedProcess:
        return _run(*ns_argv(str(BIN / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args), timeout=timeout,
                    check=check, input=input)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def _api_ready(self) -> bool:
        return self.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0

    def _node_ready(self) -> bool:
        proc = self.kubectl("get", "node", NODE, "-o",
                            "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False, timeout=10)
        return proc.stdout.strip() == "True"

    def start(self) -> None:
        t0 = time.monotonic()
        self.logs.mkdir(parents=True)
        self._pki()
        # The cluster's namespace, its loopback up, and a veth pair with both ends inside it (this kernel has
        # no dummy driver): the node's address on one end; deleting the namespace deletes both.
        _run("ip", "netns", "add", NETNS)
        self.netns_made = True
        _run("ip", "-n", NETNS, "link", "set", "lo", "up")
        _run("ip", "-n", NETNS, "link", "add", NODE_LINK, "type", "veth", "peer", "name", NODE_LINK + "p")
        _run("ip", "-n", NETNS, "addr", "add", f"{NODE_IP}/24", "dev", NODE_LINK)
        _run("ip", "-n", NETNS, "link", "set", NODE_LINK + "p", "up")
        _run("ip", "-n", NETNS, "link", "set", NODE_LINK, "up")
        pki = self.pki
        self._spawn("etcd", [str(BIN / "etcd"), "--data-dir", str(self.work / "etcd"), "--name", "lab",
                             f"--listen-client-urls=http://127.0.0.1:{ETCD_PORT}",
                             f"--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}",
                             f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                             f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                             f"--initial-cluster=lab=http://127.0.0.1:{ETCD_PEER_PORT}",
                             "--unsafe-no-fsync"])
        self._spawn("kube-apiserver", [
            str(BIN / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=127.0.0.1", f"--secure-port={API_PORT}", f"--advertise-address={NODE_IP}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--allow-privileged=true", "--enable-admission-plugins=NodeRestriction",
            f"--client-ca-file={pki / 'ca.crt'}", f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}", "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--profiling=false", "--enable-priority-and-fairness=false"])
        self._kubeconfig("admin", "admin")
        self._wait("the API server's /readyz", self._api_ready, 90)
        self._spawn("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), f"--kubeconfig={self._kubeconfig('controller-manager', 'cm')}",
            "--controllers=*", "--use-service-account-credentials=true", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={CM_PORT}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}"])
        self._spawn("kube-scheduler", [
            str(BIN / "kube-scheduler"), f"--kubeconfig={self._kubeconfig('scheduler', 'scheduler')}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={SCHED_PORT}"])
        self.timings["control plane"] = time.monotonic() - t0
        self._containerd()
        self._kubelet()
        self._wait("the node Ready", self._node_ready, 120)
        self.timings["cluster up"] = time.monotonic() - t0

    def _containerd(self) -> None:
        c = self.work / "containerd"
        (self.work / "cni" / "net.d").mkdir(parents=True)
        # A conf_dir of our own: /etc/cni/net.d holds podman's networks, which containerd would take first.
        (self.work / "cni" / "net.d" / "10-lab.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "burstwatch-lab", "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "dataDir": str(self.work / "cni" / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
                {"type": "loopback"}]}))
        (c / "root").mkdir(parents=True)
        (c / "config.toml").write_text(f"""version = 2
root = "{c / 'root'}"
state = "{c / 'state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: the -998 OOM score containerd gives the pause container is refused
  # ("runc create failed: can't get final child's PID from pipe: EOF") unless restricted to our own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # PID 1 is not systemd and the host is on cgroup v1.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.work / 'cni' / 'net.d'}"
""")
        self._spawn("containerd", ["containerd", "--config", str(c / "config.toml")])
        self._wait("containerd's socket", lambda: self._ctr("version", check=False).returncode == 0, 30)

    def _ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run("ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args, check=check,
                    timeout=timeout)

    def import_image(self, archive: Path) -> None:
        self._ctr("images", "import", str(archive), timeout=300)

    def _kubelet(self) -> None:
        k = self.work / "kubelet"
        k.mkdir()
        pki = self.pki
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": KUBELET_HEALTHZ_PORT,
            "cgroupDriver": "cgroupfs", "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(pki / "kubelet-serving.crt"), "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
            # Low thresholds, so a busy shared disk or memory does not evict the pods under test.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.work / "pod-logs"), "resolvConf": "/etc/resolv.conf",
            "registerNode": True, "serializeImagePulls": False, "maxPods": 20,
            # Status updates often enough that a test sees a probe's verdict within seconds.
            "nodeStatusUpdateFrequency": "4s", "syncFrequency": "5s", "fileCheckFrequency": "5s",
        }
        (k / "config.yaml").write_text(yaml.safe_dump(cfg))
        self._spawn("kubelet", [
            str(BIN / "kubelet"), f"--config={k / 'config.yaml'}",
            f"--kubeconfig={self._kubeconfig('kubelet', NODE)}", f"--root-dir={k / 'root'}",
            f"--cert-dir={k / 'pki'}", f"--hostname-override={NODE}", f"--node-ip={NODE_IP}", "--v=1"])

    def memory_mib(self) -> dict[str, float]:
        """RSS of each process of the cluster, and of containerd's shims together."""
        out = {name: rss_mib(p.pid) for name, p in self.procs.items() if p.poll() is None}
        out["shims"] = sum(rss_mib(pid) for pid in self._shims())
        return out

    def _shims(self) -> list[int]:
        return [pid for pid in _procs_under(str(self.socket)) if pid not in {p.pid for p in self.procs.values()}]

    # -- teardown --------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Pods first through the kubelet (so CNI and the volume plugins undo their part), then each process
        by its own pid, then what is left on the host. Never raises: every step runs."""
        errors: list[str] = []
        # What the cluster changed on the host, as found before undoing it (the test prints it).
        self.undone = self.leftovers()
        if self.netns_made and Path(f"/run/netns/{NETNS}").exists():
            # The kubelet's chains are in the cluster's namespace, and go with it.
            self.undone += [f"iptables in {NETNS}: {c}" for c in sorted(_chains(in_cluster_ns=True))]

        def step(what: str, fn: Callable[[], object]) -> None:
            try:
                fn()
            except Exception as exc:
                errors.append(f"{what}: {exc}")

        # No controller to make new pods while the kubelet stops the old ones.
        for name in ("kube-controller-manager", "kube-scheduler"):
            step(f"stop {name}", lambda name=name: self._stop_proc(name))
        if self.procs.get("kube-apiserver") is not None and self.procs["kube-apiserver"].poll() is None:
            step("delete pods", lambda: self.kubectl("delete", "pods", "--all", "--all-namespaces", "--wait=true",
                                                     "--grace-period=5", "--timeout=60s", timeout=90, check=False))
        if "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            step("kubelet stops its pods", lambda: self._wait_no_tasks(60))
        for name in ("kubelet", "kube-apiserver"):
            step(f"stop {name}", lambda name=name: self._stop_proc(name))
        # Anything the kubelet left running: kill and delete the tasks and containers, then containerd.
        if "containerd" in self.procs and self.procs["containerd"].poll() is None:
            step("remove containers", self._remove_containers)
        step("stop containerd", lambda: self._stop_proc("containerd"))
        step("stop etcd", lambda: self._stop_proc("etcd"))
        for pid in _procs_under(str(self.work)) + _procs_under(str(self.socket)):
            step(f"kill leftover {pid}", lambda pid=pid: os.kill(pid, signal.SIGKILL))
        step("unmount", self._unmount)
        # The cluster's namespace before the pods' (_netns() names both): its leftovers killed first.
        step("cluster netns", self._remove_own_netns)
        step("netns", self._remove_netns)
        step("links", self._remove_links)
        step("iptables", self._remove_chains)
        for name, value in self.sysctls.items():
            step(f"sysctl {name}", lambda name=name, value=value:
                 Path("/proc/sys", *name.split(".")).write_text(value))
        for d, existed in self.dirs_before.items():
            if not existed:
                step(f"rm {d}", lambda d=d: shutil.rmtree(d, ignore_errors=True))
        if errors:
            print("cluster teardown errors:\n  " + "\n  ".join(errors))

    def _tasks(self) -> list[str]:
        return self._ctr("tasks", "ls", "-q", check=False).stdout.split()

    def running_tasks(self) -> list[str]:
        return [line.split()[0] for line in self._ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
                if "RUNNING" in line.split()]

    def _wait_no_tasks(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.running_tasks() and time.monotonic() < deadline:
            time.sleep(0.5)

    def _remove_containers(self) -> None:
        for task in self._tasks():
            self._ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        time.sleep(0.5)
        for task in self._tasks():
            self._ctr("tasks", "rm", "-f", task, check=False)
        for c in self._ctr("containers", "ls", "-q", check=False).stdout.split():
            self._ctr("containers", "rm", c, check=False)

    def _stop_proc(self, name: str) -> None:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def _unmount(self) -> None:
        for m in sorted(_mounts(str(self.work)) - self.mounts_before, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)

    def _remove_netns(self) -> None:
        for ns in _netns() - self.netns_before:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)

    def _remove_own_netns(self) -> None:
        """The cluster's namespace, with what is in it (node veth, cni0, the kubelet's KUBE-* chains and the
        bridge plugin's ip_forward): anything still running in it first (by pid), then the namespace."""
        if not self.netns_made or not Path(f"/run/netns/{NETNS}").exists():
            return
        for pid in _run("ip", "netns", "pids", NETNS, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _run("ip", "netns", "delete", NETNS)

    def _remove_links(self) -> None:
        for link in _links() - self.links_before:
            subprocess.run(["ip", "link", "delete", link], capture_output=True, timeout=30)

    def _remove_chains(self) -> None:
        """The chains the kubelet (KUBE-*) and the CNI plugins (CNI-*) made: the rules that jump to them
        from other chains first, then the chains (ours only: what existed before stays)."""
        new = _chains() - self.chains_before
        for entry in sorted(new):
            cmd, table, chain = entry.split()
            rules = _run(f"{cmd}-save", "-t", table, check=False).stdout.splitlines()
            for rule in rules:
                parts = shlex.split(rule)
                if rule.startswith("-A ") and (("-j" in parts and parts[parts.index("-j") + 1] == chain)
                                              or ("-g" in parts and parts[parts.index("-g") + 1] == chain)):
                    subprocess.run([cmd, "-w", "-t", table, "-D", *parts[1:]], capture_output=True, timeout=30)
        for entry in sorted(new):
            cmd, table, chain = entry.split()
            subprocess.run([cmd, "-w", "-t", table, "-F", chain], capture_output=True, timeout=30)
        for entry in sorted(new):
            cmd, table, chain = entry.split()
            subprocess.run([cmd, "-w", "-t", table, "-X", chain], capture_output=True, timeout=30)

    def leftovers(self) -> list[str]:
        """What the cluster left on the host after stop(): empty when the host is as it was."""
        out = [f"process {pid}" for pid in _procs_under(str(self.work)) + _procs_under(str(self.socket))]
        out += [f"mount {m}" for m in _mounts(str(self.work)) - self.mounts_before]
        out += [f"netns {n}" for n in _netns() - self.netns_before]
        if self.netns_made and Path(f"/run/netns/{NETNS}").exists():
            out += [f"process {pid} in {NETNS}" for pid in
                    _run("ip", "netns", "pids", NETNS, check=False).stdout.split()]
        out += [f"link {n}" for n in _links() - self.links_before]
        out += [f"iptables {c}" for c in _chains() - self.chains_before]
        out += [f"sysctl {n}={_sysctl(n)} (was {v})" for n, v in self.sysctls.items() if _sysctl(n) != v]
        out += [f"dir {d}" for d, existed in self.dirs_before.items() if not existed and d.exists()]
        return out
