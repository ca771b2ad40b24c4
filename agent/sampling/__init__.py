"""Sampling steps, one module each (netdev, ethtool, shaping), run in order by pipeline.Sampler; never fatal."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from agent.readers.errors import NotSupported

log = logging.getLogger(__name__)


class Step(Protocol):
    name: str

    def run(self, *args: Any) -> Any:
        """Read once; raise NotSupported when there is nothing to read here."""


@dataclass
class StepStatus:
    success: bool = False
    duration: float = 0.0
    supported: bool = True


def run_step(step: Step, status: dict[str, StepStatus], *args: Any,
                  clock: Callable[[], float] = time.perf_counter) -> Any:
    """Run one step (`step.run(*args)`), record its success and duration, and return its reading
    (None on failure): the one wrapper that times every step, like node_exporter's execute()."""
    start = clock()
    st = status.setdefault(step.name, StepStatus())
    try:
        result = step.run(*args)
    except NotSupported as exc:
        if st.supported:
            log.debug("step=%s not supported here: %s", step.name, exc)
        st.success, st.supported, result = False, False, None
    except Exception:
        log.exception("step=%s failed", step.name)
        st.success, st.supported, result = False, True, None
    else:
        st.success, st.supported = True, True
    st.duration = clock() - start
    return result

