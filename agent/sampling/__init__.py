"""Sampling steps, one module each (netdev, ethtool, shaping, credits, allowances), run in order by
pipeline.Sampler; never fatal. The per-sample models' steps (credits, allowances) share ModelStep."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from agent.readers.errors import NotSupported

log = logging.getLogger(__name__)


class Step(Protocol):
    name: str

    def run(self, *args: Any) -> Any:
        """Read once; raise NotSupported when there is nothing to read here."""


class ModelStep(Protocol):
    """A step that keeps a per-sample model (credits, allowances): what the wiring does for each of them, in
    one loop (agent/wiring.py), and what a new one provides (docs/architecture.md, "A new per-sample model").

    `section` names its config section, whose new value reconfigure() takes on a reload; save() runs at
    shutdown (and from keep()); learned() is what it learned for the fleet, and `on_learned` the fleet's
    hand-off, called by keep() on the sampling thread (it must only queue)."""

    name: str
    section: str
    on_learned: Optional[Callable[[], None]]

    def run(self, *args: Any) -> Any: ...

    def save(self) -> None: ...

    def reconfigure(self, section: Any) -> None: ...

    def learned(self) -> Any: ...


def keep(step: ModelStep, learned: bool, due: bool) -> None:
    """After a model step's sample: save when it learned something or a save is `due`, then hand what it
    learned to `on_learned`, whose fault never stops the sampling."""
    if learned or due:
        step.save()
    if learned and step.on_learned is not None:
        try:
            step.on_learned()
        except Exception:  # a publisher's fault must never stop the sampling
            log.exception("step=%s: publishing what it learned failed", step.name)


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

