"""The responder's admission: whether this host runs a test now, given its caps, its credits and its budget."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from agent.config import ResponderConfig
from agent.iperf3.params import TestParams
from agent.models.probe_cost import CreditSource, ProfileSource, credit_state
from agent.models.serving_budget import ServingBudget, responder_budget
from agent.responder.policy import budget_refusal, check_caps, credit_refusal, expected_bytes
from agent.responder.stats import ResponderStats

if TYPE_CHECKING:
    from agent.models.profile import BandwidthProfile

log = logging.getLogger(__name__)

T = TypeVar("T")


class Admission:
    """Decides, once a client's parameters are in, whether its test runs. This host's latest credit readings
    and bandwidth profile come from the wiring; without them the host is credit-blind and only the hourly
    budget applies (docs/probes.md, "Credit guard")."""

    def __init__(self, stats: ResponderStats, credits: Optional[CreditSource] = None,
                 profile: Optional[ProfileSource] = None) -> None:
        self.stats = stats
        self._credits = credits
        self._profile = profile

    def admit(self, cfg: ResponderConfig, source: str, params: TestParams) -> None:
        """Raise Refused for a test this responder will not run now: over a cap (for good), or, answered
        as busy, one that would drain a bucket under the credit floor or overspend the hourly budget."""
        profile = self._read("profile", self._profile)
        peak = profile.peak_bytes_per_second if profile is not None else None
        check_caps(params, cfg, peak)
        expected = expected_bytes(params, peak, cfg)
        # Only a size with a burst bucket has credits to guard: an unknown profile, or one whose baseline
        # equals its peak, is credit-blind, and there only the budget applies.
        if profile is not None and profile.bursts:
            refusal = credit_refusal(params, credit_state(self._read("credits", self._credits)), expected,
                                     cfg.credit_floor)
            if refusal is not None:
                raise refusal
        budget = self._budget(cfg, profile)
        refusal = budget_refusal(params, expected, self.stats.served.used(), self.stats.served.used(source), budget,
                                 source)
        if refusal is not None:
            raise refusal

    def budget(self, cfg: ResponderConfig) -> ServingBudget:
        """The hourly budget in force: sized to the profile as it is now, so it follows a reload or the
        fleet's consensus without the responder being told (docs/probes.md, "Credit guard")."""
        return self._budget(cfg, self._read("profile", self._profile))

    @staticmethod
    def _budget(cfg: ResponderConfig, profile: Optional[BandwidthProfile]) -> ServingBudget:
        if profile is None:
            return responder_budget(cfg, None, None)
        return responder_budget(cfg, profile.baseline_bytes_per_second, profile.peak_bytes_per_second)

    @staticmethod
    def _read(what: str, source: Optional[Callable[[], T]]) -> Optional[T]:
        """A figure from the wiring; one that cannot be read counts as unknown (the budget still applies)."""
        if source is None:
            return None
        try:
            return source()
        except Exception:
            log.exception("responder: cannot read this host's %s; serving as credit-blind", what)
            return None
