"""One bounded read of the type's partition: a LIST window, GETs of new keys only, parsed records cached."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from agent.models.fleet import MAX_OBJECT_BYTES, LearnedRecord, Rejected, parse_object, type_prefix

log = logging.getLogger(__name__)


class ReadFailed(Exception):
    """A LIST or GET failed: `action` is the S3 action (s3:ListBucket, s3:GetObject), `cause` the exception."""

    def __init__(self, action: str, target: str, cause: BaseException) -> None:
        super().__init__(f"{action} {target}: {cause}")
        self.action = action
        self.target = target
        self.cause = cause


@dataclass
class ReadResult:
    """What one read found: the records of the window's objects, and what it cost."""

    records: list[LearnedRecord] = field(default_factory=list)
    keys: int = 0                       # keys in the window
    fetched: int = 0                    # objects read with GET this time
    rejected: dict[str, int] = field(default_factory=dict)   # new rejections this time, by reason
    requests: dict[str, int] = field(default_factory=dict)   # list / get
    error: Optional[ReadFailed] = None  # the request that failed (the read stopped there)


class PartitionReader:
    """Reads `<prefix>learned/type=<type>/` within a budget: one LIST page of at most `max_objects` keys
    per read (docs/fleet.md, "Reading and adopting"). A partition that fits in one page is listed from its start; a
    bigger one from a StartAfter point chosen at random once per run, so agents sample different parts
    of it but re-list the same window each time, wrapping to the start when the window runs past the end
    (then a second LIST fills the rest of the page). Only keys not seen before are fetched: parsed records
    are cached by key, and rejected keys remembered too, so a refresh of an unchanged partition costs one
    LIST and no GET. The cache holds only the current window's keys."""

    def __init__(self, bucket: str, prefix: str, instance_type: str, max_objects: int,
                 max_age_seconds: float, rng: Optional[random.Random] = None) -> None:
        self.bucket = bucket
        self.instance_type = instance_type
        self.partition = type_prefix(prefix, instance_type)
        self.max_objects = max(1, max_objects)
        self.max_age_seconds = max_age_seconds
        self.rng = rng or random.Random()
        self.start_after: Optional[str] = None     # None: list from the start (the partition fits a page)
        self._records: dict[str, list[LearnedRecord]] = {}
        self._skipped: dict[str, str] = {}         # key -> why it is not fetched (a reason, or "stale")

    def _random_start(self) -> str:
        # Instance ids are "i-" and 17 hex digits: a uniform point among them is a uniform sample of
        # the instances (other names, "unknown" or a hostname, are reached by the wrap).
        return f"{self.partition}i-{self.rng.getrandbits(68):017x}"

    def _list(self, client: Any, res: ReadResult, max_keys: int,
              start_after: Optional[str]) -> tuple[list[dict[str, Any]], bool]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.partition, "MaxKeys": max_keys}
        if start_after is not None:
            kwargs["StartAfter"] = start_after
        res.requests["list"] = res.requests.get("list", 0) + 1
        try:
            page = client.list_objects_v2(**kwargs)
        except Exception as exc:  # botocore raises many kinds; the caller classifies
            raise ReadFailed("s3:ListBucket", f"s3://{self.bucket}/{self.partition}", exc) from exc
        return list(page.get("Contents", [])), bool(page.get("IsTruncated"))

    def window(self, client: Any, res: ReadResult) -> list[dict[str, Any]]:
        """The listing entries of this read's window (at most max_objects)."""
        if self.start_after is None:
            objects, truncated = self._list(client, res, self.max_objects, None)
            if not truncated:
                return objects
            self.start_after = self._random_start()
            log.info("fleet: partition s3://%s/%s holds more than %d objects; reading a window from %s",
                     self.bucket, self.partition, self.max_objects, self.start_after)
        objects, truncated = self._list(client, res, self.max_objects, self.start_after)
        if not truncated and len(objects) < self.max_objects:
            more, _ = self._list(client, res, self.max_objects - len(objects), None)
            objects += [o for o in more if o["Key"] <= self.start_after]
        return objects

    def read(self, client: Any, now: float) -> ReadResult:
        """List the window and fetch its new objects. The first failed request stops the read and is
        in `error` (what was fetched before it stays cached; after a failed LIST, `records` is empty)."""
        res = ReadResult()
        try:
            listed = self.window(client, res)
        except ReadFailed as exc:
            res.error = exc
            return res
        res.keys = len(listed)
        present = {o["Key"] for o in listed}
        # Objects gone from the window (deleted by a lifecycle rule, or past its end) leave the cache.
        for cache in (self._records, self._skipped):
            for key in [k for k in cache if k not in present]:
                del cache[key]
        try:
            for obj in listed:
                self._fetch(client, obj, now, res)
        except ReadFailed as exc:
            res.error = exc
        res.records = [r for key in sorted(self._records) if key in present for r in self._records[key]]
        return res

    def _reject(self, key: str, reason: str, detail: str, res: ReadResult) -> None:
        self._skipped[key] = reason
        res.rejected[reason] = res.rejected.get(reason, 0) + 1
        log.warning("fleet: s3://%s/%s ignored (%s): %s", self.bucket, key, reason, detail)

    def _fetch(self, client: Any, obj: dict[str, Any], now: float, res: ReadResult) -> None:
        key = str(obj["Key"])
        if key in self._records or key in self._skipped:
            return
        size = int(obj.get("Size") or 0)
        if size > MAX_OBJECT_BYTES:
            self._reject(key, "garbage", f"{size} bytes, more than {MAX_OBJECT_BYTES}", res)
            return
        if "/" in key[len(self.partition):]:
            self._reject(key, "foreign", "not directly in the type's partition", res)
            return
        modified = obj.get("LastModified")
        if modified is not None and hasattr(modified, "timestamp") and \
                modified.timestamp() < now - self.max_age_seconds:
            self._skipped[key] = "stale"          # every record in it is older than max_age: not worth a GET
            return
        res.requests["get"] = res.requests.get("get", 0) + 1
        try:
            body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read(MAX_OBJECT_BYTES + 1)
        except Exception as exc:  # botocore raises many kinds; the caller classifies
            raise ReadFailed("s3:GetObject", f"s3://{self.bucket}/{key}", exc) from exc
        res.fetched += 1
        try:
            self._records[key] = parse_object(key, body, self.instance_type)
        except Rejected as rej:
            self._reject(key, rej.reason, rej.detail, res)

