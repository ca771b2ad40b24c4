"""Peer discovery through the fleet's S3 bucket: register this agent, list a bounded window of its zone's."""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, Optional

from agent.models.peer_registry import (
    REGISTER_INTERVAL,
    WINDOW_KEYS,
    AgentEntry,
    agent_document,
    agent_key,
    agents_prefix,
    fresh,
    parse_agent_key,
    zone_prefix,
)

log = logging.getLogger(__name__)


class PeerRegistry:
    """`<prefix>agents/az=<zone>/<id>_<ip>_<port>_<type>.json`, one object per agent (docs/fleet.md, "Peer
    discovery"). `discover()` PUTs this agent's object when REGISTER_INTERVAL has passed (at the first call,
    then as a heartbeat), then lists one page of `window` keys of its zone from a random point (wrapping to
    the partition's start when the page runs past its end), so agents sample different peers and a
    discovery costs one or two LISTs whatever the fleet's size. With `cross_az_share` > 0 it also lists
    the zones (one LIST with a delimiter) and a window of one other zone, chosen at random.

    S3 requests are counted by action in `requests` (list, put), what the fleet arithmetic predicts."""

    def __init__(self, client_factory: Callable[[], Any], bucket: str, prefix: str, *, zone: str,
                 instance_id: str, host: str, port: int, instance_type: Optional[str],
                 region: Optional[str], agent_version: str, cross_az_share: float = 0.0,
                 window: int = WINDOW_KEYS, register_interval: float = REGISTER_INTERVAL,
                 wall: Callable[[], float] = time.time, rng: Optional[random.Random] = None) -> None:
        self._factory = client_factory
        self._client: Any = None
        self.bucket = bucket
        self.prefix = prefix
        self.zone = zone
        self.instance_id = instance_id
        self.key = agent_key(prefix, zone, instance_id, host, port, instance_type)
        self.body = lambda now: agent_document(instance_id, host, port, instance_type, zone, region, now,
                                               agent_version)
        self.cross_az_share = cross_az_share
        self.window = max(1, window)
        self.register_interval = register_interval
        self.wall = wall
        self.rng = rng or random.Random()
        self.last_register = 0.0
        self.requests = {"list": 0, "put": 0}
        self._fits: dict[str, bool] = {}        # zone -> its partition fitted one page at the last listing

    def client(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def discover(self) -> list[AgentEntry]:
        """Fresh entries of this zone's window (and of one other zone's with cross_az_share > 0), without
        this agent. Raises on S3 errors: the probe service keeps its last good list."""
        now = self.wall()
        if now - self.last_register >= self.register_interval:
            self.register(now)
        found = self.list_zone(self.zone, now)
        if self.cross_az_share > 0:
            others = [z for z in self.zones() if z != self.zone]
            if others:
                found += self.list_zone(self.rng.choice(others), now)
        return [e for e in found if e.instance_id != self.instance_id and fresh(e, now)]

    def register(self, now: float) -> None:
        self.requests["put"] += 1
        self.client().put_object(Bucket=self.bucket, Key=self.key, Body=self.body(now),
                                 ContentType="application/json")
        self.last_register = now
        log.debug("registry: registered s3://%s/%s", self.bucket, self.key)

    def zones(self) -> list[str]:
        """The zones that have a partition (one LIST of the common prefixes under agents/)."""
        top = agents_prefix(self.prefix)
        self.requests["list"] += 1
        page = self.client().list_objects_v2(Bucket=self.bucket, Prefix=top, Delimiter="/", MaxKeys=100)
        out = []
        for cp in page.get("CommonPrefixes", []):
            name = str(cp.get("Prefix", ""))[len(top):].rstrip("/")
            if name.startswith("az="):
                out.append(name[len("az="):])
        return out

    def list_zone(self, zone: str, now: float) -> list[AgentEntry]:
        """One window of a zone's partition: from a random instance id, wrapped to the start when short."""
        part = zone_prefix(self.prefix, zone)
        objects: list[dict[str, Any]] = []
        truncated = True
        if self._fits.get(zone, True):
            # A partition that fitted one page last time is listed whole from its start: one LIST.
            objects, truncated = self._list(part, self.window, None)
            self._fits[zone] = not truncated
        if truncated:
            start = f"{part}i-{self.rng.getrandbits(68):017x}"
            objects, truncated = self._list(part, self.window, start)
            if not truncated and len(objects) < self.window:
                more, _ = self._list(part, self.window - len(objects), None)
                objects += [o for o in more if str(o["Key"]) <= start]
        out = []
        for obj in objects:
            modified = obj.get("LastModified")
            stamp = float(modified.timestamp()) if modified is not None and hasattr(modified, "timestamp") else now
            entry = parse_agent_key(str(obj["Key"]), zone, stamp)
            if entry is not None:
                out.append(entry)
        return out

    def _list(self, part: str, max_keys: int, start_after: Optional[str]) -> tuple[list[dict[str, Any]], bool]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": part, "MaxKeys": max_keys}
        if start_after is not None:
            kwargs["StartAfter"] = start_after
        self.requests["list"] += 1
        page = self.client().list_objects_v2(**kwargs)
        return list(page.get("Contents", [])), bool(page.get("IsTruncated"))
