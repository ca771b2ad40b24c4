"""The CloudWatch publisher's third job: send the backlog with PutMetricData and count how it goes (requests,
errors by kind, datapoints published and failed), logging each kind of error once per episode."""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Optional

from agent.aws import ERROR_KINDS, classify
from agent.cloudwatch.backlog import SpooledBacklog
from agent.models.cw_aggregate import BatchLimits

log = logging.getLogger(__name__)

ClientFactory = Callable[..., Any]


class Sender:
    """Sends the backlog's batches, oldest first, and keeps the counters the Prometheus view renders
    (under the backlog's lock, shared with scrapes). Runs in the publisher's thread."""

    def __init__(self, namespace: str, region: Optional[str], endpoint_url: Optional[str], backlog: SpooledBacklog,
                 client_factory: ClientFactory, max_attempts: int, wall: Callable[[], float]) -> None:
        self.namespace = namespace
        self.region = region
        self.endpoint_url = endpoint_url
        self.backlog = backlog
        self.limits = BatchLimits()
        self._client_factory = client_factory
        self._max_attempts = max_attempts
        self._wall = wall
        self._lock: threading.Lock = backlog.lock
        self.published = 0
        self.failed = 0
        self.requests = {"success": 0, "error": 0}
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.last_success = 0.0
        self._logged: set[str] = set()
        self._client: Any = None
        self._final_client: Any = None

    def send(self, final: bool, stopping: Callable[[], bool], deadline: float) -> Optional[str]:
        """Send batches until the backlog is empty or a request fails (kept for the next flush). The final
        send stops at `deadline`; the others stop once `stopping()` (the final flush takes over). Returns
        the kind of the error that stopped it (ERROR_KINDS), None when it did not fail."""
        if not self._clients():
            return "config"
        while True:
            if final and time.monotonic() >= deadline:
                return None
            if not final and stopping():
                return None
            with self._lock:
                batch = self.backlog.backlog.peek_batch(self.namespace, self.limits)
            if not batch:
                return None
            client = self._final_client if final else self._client
            try:
                client.put_metric_data(Namespace=self.namespace, MetricData=[d.to_api() for d in batch])
            except Exception as exc:
                kind = classify(exc).kind
                if not self._failed(len(batch), exc):
                    return kind  # keep the backlog; the next flush tries again
                continue
            self.backlog.settle(len(batch), count=functools.partial(self._sent, len(batch)))
            if self._logged:
                log.info("cloudwatch: publishing works again (after %s errors)", ", ".join(sorted(self._logged)))
                self._logged.clear()

    def _sent(self, n: int) -> None:
        self.published += n
        self.requests["success"] += 1
        self.last_success = self._wall()

    def _failed(self, n: int, exc: BaseException) -> bool:
        """Count a failed request of `n` datums; True when the next batch should be tried at once (the
        batch was too large and the limits shrank, or it was rejected and dropped)."""
        err = classify(exc)
        kind, limit = err.kind, err.limit
        with self._lock:
            self.failed += n
            self.requests["error"] += 1
        self.error(kind, exc)
        if kind == "too_large" and ((limit and self.limits.limit_datums(limit))
                                    or (not limit and self.limits.halve())):
            log.warning("cloudwatch: endpoint takes at most %d datapoints / %d bytes per request",
                        self.limits.max_datums, self.limits.max_bytes)
            return True
        if kind in ("rejected", "too_large"):
            self.backlog.settle(n, "rejected")
            return True
        return False

    def _clients(self) -> bool:
        if self._client is not None:
            return True
        try:
            self._client = self._client_factory(self.region, self.endpoint_url, max_attempts=self._max_attempts)
            # For the last flush at SIGTERM: no retry (botocore's max_attempts counts retries), short
            # timeouts, so stop() keeps its deadline.
            self._final_client = self._client_factory(self.region, self.endpoint_url, max_attempts=0,
                                                      connect_timeout=0.5, read_timeout=1.0)
        except Exception as exc:
            self._client = None
            self.error(classify(exc).kind, exc)
            return False
        return True

    def error(self, kind: str, exc: BaseException) -> None:
        """Count every error; log the first of each kind until publishing works again (no log storm)."""
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
        if kind in self._logged:
            log.debug("cloudwatch: %s error again: %s", kind, exc)
            return
        self._logged.add(kind)
        level = logging.ERROR if kind in ("rejected", "config", "other") else logging.WARNING
        log.log(level, "cloudwatch: %s error, datapoints kept in the backlog (%d); further %s errors "
                "are only counted until publishing works again: %s", kind, len(self.backlog), kind, exc)
