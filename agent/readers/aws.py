"""boto3 clients configured the one way burstwatch uses AWS: botocore's standard retry mode, short timeouts."""

from __future__ import annotations

from typing import Any, Optional


def client(service: str, region: Optional[str], endpoint_url: Optional[str] = None,
           max_attempts: int = 3, connect_timeout: float = 3.0, read_timeout: float = 10.0) -> Any:
    """A boto3 client with botocore's `standard` retry mode (retries throttling and 5xx with backoff).

    Credentials come from boto3's default chain (the instance profile on EC2); `endpoint_url` points
    at moto in tests and at VPC endpoints in private subnets."""
    import boto3  # imported late: ~0.3 s, and most runs never call AWS
    from botocore.config import Config

    cfg = Config(region_name=region, retries={"mode": "standard", "max_attempts": max_attempts},
                 connect_timeout=connect_timeout, read_timeout=read_timeout)
    return boto3.session.Session().client(service, endpoint_url=endpoint_url, config=cfg)
