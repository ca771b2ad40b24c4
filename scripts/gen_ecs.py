#!/usr/bin/env python3
"""Write the ECS install (packaging/ecs/): the task definition of a DAEMON service, its CreateService input and
the task role's policies (docs/ecs.md).

    scripts/gen_ecs.py             # rewrite packaging/ecs/ (placeholders ACCOUNT, REGION, BUCKET)
    scripts/gen_ecs.py --check     # exit 1 naming every stale file (tests/packaging/test_ecs.py)
    scripts/gen_ecs.py --account 111122223333 --region eu-west-1 --out DIR
                                   # the same files with your account and region, for `aws ecs ... file://`

The task mirrors the Helm chart's pod (packaging/helm/burstwatch): host networking, the image built from
packaging/container/Containerfile, uid 10786, read-only root, every capability dropped, /tmp in memory, the
state directory on a host volume handed to the agent's group by a capability-less init container.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "packaging" / "ecs"
IAM = ROOT / "packaging" / "kubernetes" / "iam"
sys.path.insert(0, str(ROOT))
from docregion import write_files  # noqa: E402 (beside this script)

from agent import __version__  # noqa: E402 (the image tag is the agent's version, as the chart's appVersion)

FAMILY = "burstwatch"
UID = 10786            # the image's user (Containerfile BURSTWATCH_UID), as the chart's values.yaml
STATE = "/var/lib/burstwatch"
CONFIG_DIR = "/etc/burstwatch"
METRICS_PORT = 9786


def image(account: str, region: str) -> str:
    """The image pushed to the account's ECR (docs/ecs.md, "Install"), tagged with the agent's version."""
    return f"{account}.dkr.ecr.{region}.amazonaws.com/burstwatch:{__version__}"


def task_definition(account: str = "ACCOUNT", region: str = "REGION") -> dict[str, Any]:
    """RegisterTaskDefinition's input."""
    img = image(account, region)
    hardening = {
        "readonlyRootFilesystem": True,
        "privileged": False,
        "dockerSecurityOptions": ["no-new-privileges"],
    }
    state_init = {
        # The host directory the Docker daemon creates for a missing sourcePath belongs to root: uid 0 (its
        # owner) may chgrp it to a group it is in and chmod it without any capability, as the chart's init
        # container does; the agent (uid 10786, gid 10786) then writes there.
        "name": "state-dir",
        "image": img,
        "essential": False,
        "user": f"0:{UID}",
        "entryPoint": ["/bin/sh", "-c"],
        "command": [f"chgrp {UID} {STATE} && chmod 2770 {STATE}"],
        **hardening,
        "linuxParameters": {"capabilities": {"drop": ["ALL"]}},
        "mountPoints": [{"sourceVolume": "state", "containerPath": STATE, "readOnly": False}],
        "cpu": 0,
        "memory": 32,
    }
    agent = {
        "name": "burstwatch",
        "image": img,
        "essential": True,
        "user": f"{UID}:{UID}",
        "command": ["run", "--config", f"{CONFIG_DIR}/burstwatch.toml"],
        "dependsOn": [{"containerName": "state-dir", "condition": "SUCCESS"}],
        **hardening,
        # No capability: ethtool's get requests, /proc/net/dev, netlink and tc reads need none, ports are
        # above 1023 (docs/ecs.md, "Privileges"). /tmp in memory as in the chart (16 MiB).
        "linuxParameters": {"capabilities": {"drop": ["ALL"]},
                            "tmpfs": [{"containerPath": "/tmp", "size": 16,
                                       "mountOptions": ["nosuid", "nodev", "noexec"]}]},
        # With host networking the port is the host's; listed so the console and Service Connect show it.
        "portMappings": [{"containerPort": METRICS_PORT, "hostPort": METRICS_PORT, "protocol": "tcp"}],
        "mountPoints": [
            {"sourceVolume": "state", "containerPath": STATE, "readOnly": False},
            # An empty or missing host directory means the defaults (a missing file at the default path).
            {"sourceVolume": "config", "containerPath": CONFIG_DIR, "readOnly": True},
        ],
        "healthCheck": {
            "command": ["CMD", "python3", "-c",
                        f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{METRICS_PORT}/', "
                        "timeout=4)"],
            "interval": 30, "timeout": 5, "retries": 3, "startPeriod": 15,
        },
        # The daemon saves its credit state on SIGTERM and exits within 2 s (the chart: 10 s grace).
        "stopTimeout": 10,
        # A reservation and a hard limit, as the chart's requests and limits (64 Mi / 160 Mi).
        "cpu": 32,
        "memoryReservation": 64,
        "memory": 160,
    }
    return {
        "family": FAMILY,
        "taskRoleArn": f"arn:aws:iam::{account}:role/burstwatch-task",
        "executionRoleArn": f"arn:aws:iam::{account}:role/ecsTaskExecutionRole",
        # host: the task shares the container instance's network namespace, so it sees the instance's ENIs
        # and their counters; awsvpc would give it an ENI (and a namespace) of its own (docs/ecs.md).
        "networkMode": "host",
        "requiresCompatibilities": ["EC2"],
        "containerDefinitions": [state_init, agent],
        "volumes": [
            {"name": "state", "host": {"sourcePath": STATE}},
            {"name": "config", "host": {"sourcePath": CONFIG_DIR}},
        ],
        "placementConstraints": [],
    }


def service(cluster: str = "CLUSTER") -> dict[str, Any]:
    """CreateService's input: one task on every container instance of the cluster."""
    return {
        "cluster": cluster,
        "serviceName": FAMILY,
        "taskDefinition": FAMILY,
        "launchType": "EC2",
        "schedulingStrategy": "DAEMON",
        # A daemon service replaces a task in place: stop the old one first (the port is the host's).
        "deploymentConfiguration": {"maximumPercent": 100, "minimumHealthyPercent": 0},
        "enableECSManagedTags": True,
        "propagateTags": "SERVICE",
    }


def trust_policy(account: str = "ACCOUNT", region: str = "REGION") -> dict[str, Any]:
    """Who may assume the task role: ECS tasks of this account (the confused-deputy conditions AWS shows
    for task roles: aws:SourceAccount and aws:SourceArn)."""
    return {
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": "ecs-tasks.amazonaws.com"},
            "Action": "sts:AssumeRole",
            "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:ecs:{region}:{account}:*"},
                          "StringEquals": {"aws:SourceAccount": account}},
        }],
    }


def permissions_policy() -> str:
    """The same permissions as the Kubernetes install's role (packaging/kubernetes/iam/), one source."""
    return (IAM / "permissions-policy.json").read_text(encoding="utf-8")


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def expected(account: str = "ACCOUNT", region: str = "REGION", out: Path = OUT) -> dict[Path, str]:
    return {
        out / "task-definition.json": dump(task_definition(account, region)),
        out / "service.json": dump(service()),
        out / "task-role-trust-policy.json": dump(trust_policy(account, region)),
        out / "task-role-permissions-policy.json": permissions_policy(),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when packaging/ecs/ is stale")
    ap.add_argument("--account", default="ACCOUNT")
    ap.add_argument("--region", default="REGION")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    return write_files(expected(args.account, args.region, args.out), args.check, "scripts/gen_ecs.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
