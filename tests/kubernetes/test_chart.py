"""The Helm chart: helm lint, every rendered object valid for each EKS-supported Kubernetes version (strict
schemas; prometheus-operator's own CRD schemas for its objects), the privileges the pod asks for, its
config accepted by the agent, and the plain manifests and rules copy not stale."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from agent import config as configmod
from tests.conftest import ROOT
from tests.kubernetes.chart import CHART, CRDS, EKS_VERSIONS, FULL_VALUES, helm, one, render

VALUE_SETS = {"default": None, "full": FULL_VALUES}


def test_helm_lint_is_clean(tmp_path: Path) -> None:
    values = tmp_path / "full.yaml"
    values.write_text(yaml.safe_dump(FULL_VALUES), encoding="utf-8")
    for extra in ([], ["--values", str(values)]):
        proc = helm("lint", "--strict", str(CHART), *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # The only message allowed is INFO's "icon is recommended" (no icon is published).
        assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
        assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def _crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema of prometheus-operator's CRDs (`make test-deps` fetches them)."""
    files = sorted(CRDS.glob("monitoring.coreos.com_*.yaml"))
    if len(files) < 3:
        pytest.fail(f"prometheus-operator CRDs missing in {CRDS}: `make test-deps` fetches them")
    out = {}
    for f in files:
        crd = yaml.safe_load(f.read_text(encoding="utf-8"))
        for v in crd["spec"]["versions"]:
            schema = dict(v["schema"]["openAPIV3Schema"])
            out[(f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])] = schema
    return out


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected, as the API server prunes-and-warns (kubectl --strict)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_object_validates_on_every_eks_version(name: str, tmp_path: Path) -> None:
    crds = _crd_schemas()
    counts: dict[str, int] = {}
    errors: list[str] = []
    for version in EKS_VERSIONS:
        objects = render(VALUE_SETS[name], kube_version=f"{version}.0", tmp=tmp_path)
        for obj in objects:
            key = (obj["apiVersion"], obj["kind"])
            if key in crds:
                # metadata is the API server's to check (ObjectMeta), not the CRD's.
                body = {k: v for k, v in obj.items() if k != "metadata"}
                try:
                    jsonschema.Draft7Validator(_strict(crds[key])).validate(body)
                except jsonschema.ValidationError as exc:
                    errors.append(f"{version} {obj['kind']}: {exc.message} at {list(exc.path)}")
            else:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    errors.append(f"{version} {obj['kind']}: {exc.message} at {list(exc.path)}")
                except kubernetes_validate.SchemaNotFoundError as exc:
                    # An object no schema checks would pass unseen: that is a failure too.
                    errors.append(f"{version}: {exc.message}")
            counts[version] = counts.get(version, 0) + 1
    assert not errors, "\n".join(errors)
    kinds = {o["kind"] for o in render(VALUE_SETS[name], tmp=tmp_path)}
    expected = {"ServiceAccount", "ConfigMap", "DaemonSet"} | (
        {"Service", "ServiceMonitor", "PodMonitor", "PrometheusRule"} if name == "full" else set())
    assert kinds == expected
    assert counts == {v: len(expected) for v in EKS_VERSIONS}
    print(f"{name}: {len(expected)} objects x {len(EKS_VERSIONS)} versions validated, 0 errors")


def test_an_invalid_object_is_caught() -> None:
    """The strict check above can fail: a misspelt field in the pod template is an error on every version."""
    ds = one(render(), "DaemonSet")
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    for version in EKS_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(ds, version, strict=True)


def test_an_invalid_monitor_is_caught(tmp_path: Path) -> None:
    """And so can the CRD check: a misspelt endpoint field in the ServiceMonitor."""
    sm = one(render(FULL_VALUES, tmp=tmp_path), "ServiceMonitor")
    sm["spec"]["endpoints"][0]["intervall"] = "1s"
    schema = _strict(_crd_schemas()[(sm["apiVersion"], sm["kind"])])
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        jsonschema.Draft7Validator(schema).validate({k: v for k, v in sm.items() if k != "metadata"})


def test_iam_examples_are_valid_policies() -> None:
    for f in sorted((ROOT / "packaging" / "kubernetes" / "iam").glob("*.json")):
        doc = json.loads(f.read_text(encoding="utf-8"))
        assert doc["Version"] == "2012-10-17" and doc["Statement"], f
    perms = json.loads((ROOT / "packaging" / "kubernetes" / "iam" / "permissions-policy.json").read_text())
    actions = {a for s in perms["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    # CloudWatch, the fleet's S3 and discovery (docs/install.md, "IAM permissions").
    assert {"cloudwatch:PutMetricData", "ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "s3:PutObject",
            "s3:GetObject", "s3:ListBucket"} <= actions


def _pod(objects: list[dict]) -> dict:
    return one(objects, "DaemonSet")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_default_pod_needs_no_capability_and_is_read_only() -> None:
    objects = render()
    pod = _pod(objects)
    assert pod["hostNetwork"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10786
    assert pod["automountServiceAccountToken"] is False
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    # The init container runs as uid 0 to own the hostPath, but with no capability at all.
    (init,) = pod["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    # State on the node, config from the ConfigMap, the node name from the downward API.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["state"]["hostPath"] == {"path": "/var/lib/burstwatch", "type": "DirectoryOrCreate"}
    assert volumes["config"]["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["BURSTWATCH_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Every node, with requests and limits and both probes on the metrics port.
    assert {"operator": "Exists"} in pod["tolerations"]
    assert set(agent["resources"]) == {"requests", "limits"}
    assert agent["livenessProbe"]["httpGet"] == {"path": "/", "port": "metrics"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}
    assert [p["containerPort"] for p in agent["ports"]] == [9786]


@pytest.mark.parametrize("values, refusal", [
    # containerd gives the non-root agent no ambient capability: an added one never reached it.
    ({"extraCapabilities": ["NET_BIND_SERVICE"]}, "extraCapabilities"),
    ({"responder": {"enabled": True, "port": 520}}, "responder.port"),
    ({"metrics": {"port": 80}}, "metrics.port"),
    # The pod holds hostPort metrics.port: a surge pod would wait Pending on its node forever.
    ({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
     "updateStrategy.rollingUpdate.maxSurge"),
    ({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}}},
     "updateStrategy.rollingUpdate.maxSurge"),
])
def test_schema_refuses_what_cannot_work(values: dict, refusal: str, tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values), encoding="utf-8")
    proc = helm("template", "x", str(CHART), "--values", str(f))
    assert proc.returncode != 0 and refusal in proc.stderr, proc.stderr


@pytest.mark.parametrize("address, host", [("0.0.0.0", None), ("::", None), ("127.0.0.1", "127.0.0.1"),
                                           ("10.0.1.23", "10.0.1.23"), ("::1", "::1")])
def test_probes_follow_the_metrics_address(address: str, host: str | None, tmp_path: Path) -> None:
    """The kubelet probes the pod's IP (the node's, on the host network) unless httpGet.host says otherwise:
    a /metrics bound to 127.0.0.1 alone would fail every probe and be restarted forever."""
    (agent,) = _pod(render({"metrics": {"address": address}}, tmp=tmp_path))["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"].get("host") == host and agent[probe]["httpGet"]["port"] == "metrics"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_config_is_accepted_by_the_agent(name: str, tmp_path: Path) -> None:
    text = one(render(VALUE_SETS[name], tmp=tmp_path), "ConfigMap")["data"]["burstwatch.toml"]
    cfg = configmod.parse(text)
    assert cfg.state_dir == "/var/lib/burstwatch"
    if name == "default":
        assert cfg.metrics.listen == "0.0.0.0:9786" and cfg.responder.enabled is False
    else:
        assert cfg.metrics.listen == "0.0.0.0:29786" and cfg.metrics.max_connections == 64
        assert cfg.responder.enabled is True and cfg.responder.listen == "0.0.0.0:25201"
        assert cfg.responder.allow == ["10.0.0.0/8", "192.168.0.0/16"] and cfg.responder.max_tests_per_hour == 6
        assert cfg.sample_interval == 2.0 and cfg.cloudwatch.enabled is True


def test_prometheus_rule_carries_the_shipped_rules(tmp_path: Path) -> None:
    rule = one(render(FULL_VALUES, tmp=tmp_path), "PrometheusRule")
    shipped = yaml.safe_load((ROOT / "packaging" / "prometheus" / "burstwatch.rules.yml").read_text(encoding="utf-8"))
    groups = rule["spec"]["groups"]
    assert groups[: len(shipped["groups"])] == shipped["groups"]
    assert groups[-1]["rules"][0]["alert"] == "BurstwatchTestAlert"


def test_generated_files_are_fresh() -> None:
    """packaging/kubernetes/*.yaml and the chart's copy of the rules match what the chart renders now."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_kubernetes.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
