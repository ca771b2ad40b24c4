"""Sampling steps, one module each (netdev, ethtool, shaping), run in order by pipeline.Sampler; never fatal."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from agent.readers.errors import NotSupported

log = logging.getLogger(__name__)


class Collector(Protocol):
    name: str

    def collect(self, *args: Any) -> Any:
        """Read once; raise NotSupported when there is nothing to read here."""


@dataclass
class CollectorStatus:
    success: bool = False
    duration: float = 0.0
    supported: bool = True


def run_collector(collector: Collector, status: dict[str, CollectorStatus], *args: Any,
                  clock: Callable[[], float] = time.perf_counter) -> Any:
    """Run one step (`collector.collect(*args)`), record its success and duration, and return its reading
    (None on failure): the one wrapper that times every step, like node_exporter's execute()."""
    start = clock()
    st = status.setdefault(collector.name, CollectorStatus())
    try:
        result = collector.collect(*args)
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

