"""The iperf3-compatible probe engine: protocol, streams, sockets, client (`run_probe`) and JSON report."""

from __future__ import annotations

from agent.iperf3.client import ProbeError, ProbeRequest, run_probe
from agent.iperf3.report import ProbeSummary, summarize

__all__ = ["ProbeError", "ProbeRequest", "ProbeSummary", "run_probe", "summarize"]
