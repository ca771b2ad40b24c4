"""The image, run with podman: built from the Containerfile on the .deb (tests/kubernetes/conftest.py), its
size, and the AWS clients its pruned botocore still builds. The chart's pod itself runs on a real kubelet
(test_cluster.py), which replaced the `podman kube play` of its template."""

from __future__ import annotations

import re

import pytest

from tests.support.podman import podman
from tests.support.project_image import Image

pytestmark = pytest.mark.slow

IMAGE_LIMIT_BYTES = 200 * 1000 * 1000


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
