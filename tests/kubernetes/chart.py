"""The Helm chart for the Kubernetes tests: helm itself, rendering with values, and the objects it renders."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tests.conftest import ROOT

CHART = ROOT / "packaging" / "helm" / "burstwatch"
HELM = ROOT / ".tools" / "bin" / "helm"
CRDS = ROOT / ".tools" / "crds"
# Amazon EKS's release calendar as read on 2026-11-27 (docs/kubernetes.md, "Supported Kubernetes versions"):
# each version's end of standard and of extended support, UTC. AWS: "Understand the Kubernetes version
# lifecycle on EKS", https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html
# #kubernetes-release-calendar (1.31-1.35; 1.35 as mirrored by endoflife.date/amazon-eks). 1.36: EKS
# release 2026-06-02 (devopsdreams.blogspot.com, 2026-08-16; not yet in our copy of AWS's table), ends by
# AWS's rule of 14 + 12 months. A version leaves the list on its end of extended support ("On the end of
# extended support date, you can no longer create new Amazon EKS clusters with the unsupported version").
EKS_CALENDAR_READ = datetime.date(2026, 11, 27)
EKS_CALENDAR: dict[str, tuple[datetime.date, datetime.date]] = {
    # version: (end of standard support, end of extended support)
    "1.30": (datetime.date(2025, 7, 23), datetime.date(2026, 7, 23)),
    "1.31": (datetime.date(2025, 11, 26), datetime.date(2026, 11, 26)),
    "1.32": (datetime.date(2026, 3, 23), datetime.date(2027, 3, 23)),
    "1.33": (datetime.date(2026, 7, 29), datetime.date(2027, 7, 29)),
    "1.34": (datetime.date(2026, 12, 2), datetime.date(2027, 12, 2)),
    "1.35": (datetime.date(2027, 3, 27), datetime.date(2028, 3, 27)),
    "1.36": (datetime.date(2027, 8, 2), datetime.date(2028, 8, 2)),
}


def eks_versions(today: datetime.date) -> tuple[str, ...]:
    """The versions EKS supports on `today` (standard or extended), oldest first."""
    return tuple(v for v, (_, extended) in EKS_CALENDAR.items() if today < extended)


# Validated on the day the tests run, so a version drops out on its end date without an edit here
# (tests/kubernetes/test_eks_versions.py fails when the calendar needs reading again).
EKS_VERSIONS = eks_versions(datetime.datetime.now(datetime.timezone.utc).date())

# Non-default values that switch on every optional object and branch of the templates.
FULL_VALUES: dict[str, Any] = {
    "image": {"repository": "123456789012.dkr.ecr.us-east-1.amazonaws.com/burstwatch", "tag": "0.1.0"},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/burstwatch"}},
    "metrics": {"port": 29786, "extraConfig": "max_connections = 64"},
    "responder": {"enabled": True, "port": 25201, "allow": ["10.0.0.0/8", "192.168.0.0/16"],
                  "extraConfig": "max_tests_per_hour = 6"},
    "config": 'sample_interval = 2.0\ninterfaces = ["eth0"]\n[cloudwatch]\nenabled = true\nregion = "us-east-1"\n'
              '[probe]\npeers = ["10.0.1.23:25201"]\n',
    "state": {"init": False},
    "priorityClassName": "system-node-critical",
    "extraEnv": [{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}],
    "podAnnotations": {"example.com/team": "network"},
    "podLabels": {"team": "network"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "eks.amazonaws.com/compute-type", "operator": "NotIn",
                               "values": ["fargate"]}]}]}}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "podMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True, "testAlert": True, "labels": {"release": "kube-prometheus-stack"}},
}


def require_helm() -> Path:
    if not HELM.exists():
        pytest.fail(f"{HELM} missing: `make test-deps` builds it from the Go module proxy")
    return HELM


def helm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(require_helm()), *args], capture_output=True, text=True, timeout=timeout)


def render(values: Optional[dict[str, Any]] = None, kube_version: Optional[str] = None,
           tmp: Optional[Path] = None, release: str = "burstwatch", namespace: str = "burstwatch") -> list[dict]:
    """`helm template` with `values` (written to a file in `tmp`) as a list of objects."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", kube_version]
    if values:
        assert tmp is not None, "values need a directory to be written to"
        f = tmp / "values.yaml"
        f.write_text(yaml.safe_dump(values), encoding="utf-8")
        args += ["--values", str(f)]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(objects: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj
