"""This instance's Auto Scaling group: its `aws:autoscaling:groupName` tag, from IMDS or ec2:DescribeTags."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from agent.readers import aws

log = logging.getLogger(__name__)

# The tag EC2 Auto Scaling puts on every instance it launches (AWS tags the instance with its group's name).
ASG_TAG = "aws:autoscaling:groupName"

ImdsGet = Callable[[str], Optional[str]]     # a `latest/`-relative IMDS path -> its text, None when absent


def autoscaling_group_name(instance_id: Optional[str], imds_get: Optional[ImdsGet],
                           ec2: Optional[Callable[[], Any]] = None) -> Optional[str]:
    """The instance's Auto Scaling group, from its `aws:autoscaling:groupName` tag.

    First through IMDS (`meta-data/tags/instance/...`, free, but only when instance metadata tags are
    enabled), else through ec2:DescribeTags when `ec2` (a client factory) is given. IMDS's
    `autoscaling/target-lifecycle-state` tells the lifecycle state, not the group's name."""
    if imds_get is not None:
        try:
            listing = imds_get("meta-data/tags/instance")
            if listing is not None:
                keys = [k.strip() for k in listing.splitlines()]
                if ASG_TAG not in keys:
                    return None           # tags are visible and this one is absent: no group
                value = imds_get(f"meta-data/tags/instance/{ASG_TAG}")
                if value:
                    return value.strip()
        except Exception as exc:
            log.debug("cloudwatch: instance tags from IMDS unavailable: %s", exc)
    if ec2 is None or not instance_id:
        return None
    try:
        resp = ec2().describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]},
                                            {"Name": "key", "Values": [ASG_TAG]}])
    except Exception as exc:
        log.warning("cloudwatch: cannot look up the Auto Scaling group (ec2:DescribeTags, or enable "
                    "instance metadata tags); publishing without AutoScalingGroupName: %s error: %s",
                    aws.classify(exc).kind, exc)
        return None
    for tag in resp.get("Tags", []):
        if tag.get("Key") == ASG_TAG and tag.get("Value"):
            return str(tag["Value"])
    return None
