"""The ECS install (packaging/ecs/, scripts/gen_ecs.py): not stale, valid against botocore's ECS model
(RegisterTaskDefinition, CreateService; enums included), registered in moto in server mode with a DAEMON
service, and holding what docs/ecs.md promises (host network, the project's image and user, read-only root, no
added capability, the state directory on a host volume, the Kubernetes role's permissions)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.validate import ParamValidator

from agent import __version__
from agent import config as configmod
from tests.conftest import ROOT

ECS = ROOT / "packaging" / "ecs"
CONTAINERFILE = ROOT / "packaging" / "container" / "Containerfile"
MODEL = botocore.session.get_session().get_service_model("ecs")


def _load(name: str) -> dict[str, Any]:
    return json.loads((ECS / name).read_text())  # type: ignore[no-any-return]


def _enum_errors(value: Any, shape: Any, path: str = "") -> list[str]:
    """Enum members botocore's ParamValidator does not check (it validates types, names and ranges)."""
    errors = []
    if shape.type_name == "structure" and isinstance(value, dict):
        for k, v in value.items():
            if k in shape.members:
                errors += _enum_errors(v, shape.members[k], f"{path}.{k}")
    elif shape.type_name == "list" and isinstance(value, list):
        for i, v in enumerate(value):
            errors += _enum_errors(v, shape.member, f"{path}[{i}]")
    elif shape.type_name == "string" and shape.enum and value not in shape.enum:
        errors.append(f"{path}: {value!r} not in {shape.enum}")
    return errors


def _validate(params: dict[str, Any], operation: str) -> list[str]:
    shape = MODEL.operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    return ([report.generate_report()] if report.has_errors() else []) + _enum_errors(params, shape)


def test_generated_files_are_current() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_ecs.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name, operation", [("task-definition.json", "RegisterTaskDefinition"),
                                             ("service.json", "CreateService")])
def test_valid_against_botocores_ecs_model(name: str, operation: str) -> None:
    assert _validate(_load(name), operation) == []


def test_the_validation_can_fail() -> None:
    td = _load("task-definition.json")
    bad_key = copy.deepcopy(td)
    bad_key["containerDefinitions"][1]["readOnlyRootFilesystem"] = True      # the field is readonlyRoot...
    assert _validate(bad_key, "RegisterTaskDefinition")
    bad_enum = copy.deepcopy(td)
    bad_enum["networkMode"] = "hostNetwork"
    assert _validate(bad_enum, "RegisterTaskDefinition")
    bad_service = dict(_load("service.json"), schedulingStrategy="DAEMONSET")
    assert _validate(bad_service, "CreateService")


def test_the_task_is_what_docs_ecs_promises() -> None:
    td = _load("task-definition.json")
    assert td["networkMode"] == "host" and td["requiresCompatibilities"] == ["EC2"]
    init, agent = td["containerDefinitions"]
    uid = re.search(r"ARG BURSTWATCH_UID=(\d+)", CONTAINERFILE.read_text())[1]  # type: ignore[index]
    assert agent["user"] == f"{uid}:{uid}" and init["user"] == f"0:{uid}"
    assert agent["essential"] and not init["essential"]
    assert agent["dependsOn"] == [{"containerName": init["name"], "condition": "SUCCESS"}]
    for c in (init, agent):
        assert c["image"] == f"ACCOUNT.dkr.ecr.REGION.amazonaws.com/burstwatch:{__version__}"
        assert c["readonlyRootFilesystem"] is True and c["privileged"] is False
        assert c["dockerSecurityOptions"] == ["no-new-privileges"]
        assert c["linuxParameters"]["capabilities"] == {"drop": ["ALL"]}       # nothing added
    # The command is the Containerfile's CMD; the config directory read-only, the state directory the
    # agent's default state_dir on the host.
    cmd = json.loads(re.search(r"^CMD (.+)$", CONTAINERFILE.read_text(), re.M)[1])  # type: ignore[index]
    assert agent["command"] == cmd
    volumes = {v["name"]: v["host"]["sourcePath"] for v in td["volumes"]}
    mounts = {m["containerPath"]: (volumes[m["sourceVolume"]], m["readOnly"]) for m in agent["mountPoints"]}
    state_dir = configmod.Config().state_dir
    assert mounts == {state_dir: (state_dir, False), "/etc/burstwatch": ("/etc/burstwatch", True)}
    assert init["mountPoints"] == [m for m in agent["mountPoints"] if m["containerPath"] == state_dir]
    assert f"chgrp {uid} {state_dir} && chmod 2770 {state_dir}" in init["command"]
    port = int(configmod.Config().metrics.listen.rpartition(":")[2])
    assert agent["portMappings"] == [{"containerPort": port, "hostPort": port, "protocol": "tcp"}]
    assert f"127.0.0.1:{port}/" in " ".join(agent["healthCheck"]["command"])
    # The task role: the Kubernetes role's permissions, assumable by ECS tasks of the account only.
    assert _load("task-role-permissions-policy.json") == json.loads(
        (ROOT / "packaging" / "kubernetes" / "iam" / "permissions-policy.json").read_text())
    [stmt] = _load("task-role-trust-policy.json")["Statement"]
    assert stmt["Principal"] == {"Service": "ecs-tasks.amazonaws.com"} and stmt["Action"] == "sts:AssumeRole"
    assert td["taskRoleArn"] == "arn:aws:iam::ACCOUNT:role/burstwatch-task"
    assert _load("service.json")["schedulingStrategy"] == "DAEMON"


def test_registers_and_runs_as_a_daemon_service_in_moto(moto: str, tmp_path: Any) -> None:
    """moto in server mode: the task definition generated for an account and region registers, and a
    DAEMON service of it is created in a cluster."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_ecs.py"), "--account", "111122223333",
                          "--region", "eu-west-1", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    td = json.loads((tmp_path / "task-definition.json").read_text())
    assert _validate(td, "RegisterTaskDefinition") == []
    ecs = boto3.client("ecs", region_name="eu-west-1", endpoint_url=moto, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    registered = ecs.register_task_definition(**td)["taskDefinition"]
    assert registered["family"] == "burstwatch" and registered["revision"] == 1
    assert registered["networkMode"] == "host" and registered["status"] == "ACTIVE"
    assert registered["containerDefinitions"] == ecs.describe_task_definition(
        taskDefinition="burstwatch:1")["taskDefinition"]["containerDefinitions"]
    agent = registered["containerDefinitions"][1]
    assert agent["readonlyRootFilesystem"] is True and agent["linuxParameters"]["capabilities"] == {"drop": ["ALL"]}
    assert agent["image"] == f"111122223333.dkr.ecr.eu-west-1.amazonaws.com/burstwatch:{__version__}"

    ecs.create_cluster(clusterName="fleet")
    svc = json.loads((tmp_path / "service.json").read_text())
    assert _validate(svc, "CreateService") == []
    created = ecs.create_service(**dict(svc, cluster="fleet"))["service"]
    [described] = ecs.describe_services(cluster="fleet", services=["burstwatch"])["services"]
    assert created["schedulingStrategy"] == described["schedulingStrategy"] == "DAEMON"
    assert described["taskDefinition"] == registered["taskDefinitionArn"]
    assert described["launchType"] == "EC2" and described["status"] == "ACTIVE"
