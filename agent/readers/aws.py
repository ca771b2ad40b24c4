"""Kept only for agent/wiring.py until it imports agent.aws (issue 29): the AWS client factory moved there."""

from __future__ import annotations

from agent.aws import ERROR_KINDS, AwsError, classify, client

__all__ = ["ERROR_KINDS", "AwsError", "classify", "client"]
