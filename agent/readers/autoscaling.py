"""This instance's Auto Scaling group: its `aws:autoscaling:groupName` tag, from IMDS or ec2:DescribeTags."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from agent import aws
from agent.writers.statefile import JsonStore

log = logging.getLogger(__name__)

# The tag EC2 Auto Scaling puts on every instance it launches (AWS tags the instance with its group's name).
ASG_TAG = "aws:autoscaling:groupName"

# The cache of DescribeTags' answer under state_dir (autoscaling_group_name's `cache`).
CACHE_FILE = "autoscaling-group.json"
CACHE_FORMAT = "burstwatch-autoscaling-group/1"

ImdsGet = Callable[[str], Optional[str]]     # a `latest/`-relative IMDS path -> its text, None when absent


def from_imds(imds_get: Optional[ImdsGet]) -> tuple[Optional[str], bool]:
    """(group, answered) from IMDS instance tags: answered is False when tags are not enabled (or IMDS is
    off), and then the group is unknown, not absent."""
    if imds_get is None:
        return None, False
    try:
        listing = imds_get("meta-data/tags/instance")
        if listing is None:
            return None, False
        keys = [k.strip() for k in listing.splitlines()]
        if ASG_TAG not in keys:
            return None, True             # tags are visible and this one is absent: no group
        value = imds_get(f"meta-data/tags/instance/{ASG_TAG}")
        return (value.strip(), True) if value else (None, False)
    except Exception as exc:
        log.debug("cloudwatch: instance tags from IMDS unavailable: %s", exc)
        return None, False


def from_describe_tags(instance_id: str, ec2: Callable[[], Any]) -> tuple[Optional[str], bool]:
    """(group, answered) from ec2:DescribeTags: one call for all of this instance's tags (a non-mutating
    action: EC2's bucket of 100 tokens refilling at 20 a second, per account and Region).

    An empty answer is not "no group": DescribeTags answers an instance id it does not hold — one in another
    Region, asked from the wrong endpoint — with no tags and no error, exactly as it answers an instance
    without tags. So it asks for every tag, not only the group's: a tag of the instance itself in the answer
    proves the Region holds it, and only then is the group's absence an answer. EC2 Auto Scaling tags each
    instance it launches with the group, so an instance with no tags at all is in no group either; it is
    simply asked again at the next start (one call per start, on instances outside Auto Scaling only)."""
    try:
        resp = ec2().describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]}])
    except Exception as exc:
        log.warning("cloudwatch: cannot look up the Auto Scaling group (ec2:DescribeTags, or enable "
                    "instance metadata tags); publishing without AutoScalingGroupName: %s error: %s",
                    aws.classify(exc).kind, exc)
        return None, False
    own = [t for t in resp.get("Tags", []) if t.get("ResourceId") == instance_id]
    if not own:
        log.info("cloudwatch: DescribeTags knows no tags of instance_id=%s (none, or asked in another Region "
                 "than the instance's); publishing without AutoScalingGroupName, not cached", instance_id)
        return None, False
    for tag in own:
        if tag.get("Key") == ASG_TAG and tag.get("Value"):
            return str(tag["Value"]), True
    return None, True


def autoscaling_group_name(instance_id: Optional[str], imds_get: Optional[ImdsGet],
                           ec2: Optional[Callable[[], Any]] = None,
                           cache: Optional[Path] = None, region: Optional[str] = None) -> Optional[str]:
    """The instance's Auto Scaling group, from its `aws:autoscaling:groupName` tag.

    First through IMDS (`meta-data/tags/instance/...`, free, but only when instance metadata tags are
    enabled), else from `cache` (a JSON file under state_dir: the answer DescribeTags gave this same
    instance before a restart, in the same `region`), else through ec2:DescribeTags when `ec2` (a client
    factory for `region`, the instance's own: another Region does not know the instance) is given, whose
    answer, when it proves the instance known there, is then cached: at fleet scale each instance draws on
    EC2's request bucket once in its life, not at every restart (docs/cloudwatch.md, "The Auto Scaling
    group"). IMDS's
    `autoscaling/target-lifecycle-state` tells the lifecycle state, not the group's name."""
    name, answered = from_imds(imds_get)
    if answered or not instance_id:
        return name
    store = JsonStore(cache, CACHE_FORMAT) if cache is not None else None
    doc = store.load() if store is not None else None
    # A cache without the Region (written by a version that asked [cloudwatch] region: its "no group" may be
    # another Region's empty answer) or from another Region is asked again.
    if doc is not None and doc.get("instance_id") == instance_id and doc.get("region") == region:
        group = doc.get("group")
        return str(group) if group else None
    if ec2 is None:
        return None
    name, answered = from_describe_tags(instance_id, ec2)
    if answered and store is not None:
        store.save({"instance_id": instance_id, "region": region, "group": name, "source": "describe_tags",
                    "time": time.time()})
    return name
