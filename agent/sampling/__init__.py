"""Collectors: one module each, listed in COLLECTORS; a collector's failure never fails a sample."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from agent.readers.errors import NotSupported

log = logging.getLogger(__name__)


class Collector(Protocol):
    name: str

    def collect(self) -> Any:
        """Read once; raise NotSupported when there is nothing to read here."""


@dataclass
class CollectorStatus:
    success: bool = False
    duration: float = 0.0
    supported: bool = True


def run_collector(collector: Collector, status: dict[str, CollectorStatus],
                  clock: Callable[[], float] = time.perf_counter) -> Any:
    """Run one collector, record its success and duration, and return its reading (None on failure)."""
    start = clock()
    st = status.setdefault(collector.name, CollectorStatus())
    try:
        result = collector.collect()
    except NotSupported as exc:
        if st.supported:
            log.debug("collector=%s not supported here: %s", collector.name, exc)
        st.success, st.supported, result = False, False, None
    except Exception:
        log.exception("collector=%s failed", collector.name)
        st.success, st.supported, result = False, True, None
    else:
        st.success, st.supported = True, True
    st.duration = clock() - start
    return result


# The registry: name -> module that defines it. Adding a collector is a new module plus one line here.
COLLECTORS = {
    "netdev": "agent.sampling.netdev",
}
