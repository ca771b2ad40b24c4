"""boto3 clients configured the one way burstwatch uses AWS, and the one classifier of their errors."""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional


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


# -- what went wrong ------------------------------------------------------------------------------------

# Error kinds every AWS caller acts on; `burstwatch_cloudwatch_errors_total{kind}` counts these names.
ERROR_KINDS = ("throttling", "credentials", "network", "server", "too_large", "rejected", "config", "other")
THROTTLING_CODES = frozenset({"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                              "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
                              "LimitExceededException", "SlowDown"})
# "Not allowed" or "not signed right": the role, its policy or the clock needs fixing, not the request.
# EC2 says UnauthorizedOperation where other services say AccessDenied; RequestExpired is a signature
# outside its validity window (clock skew).
CREDENTIAL_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
                              "UnrecognizedClientException", "InvalidClientTokenId", "InvalidAccessKeyId",
                              "ExpiredToken", "ExpiredTokenException", "RequestExpired", "SignatureDoesNotMatch",
                              "MissingAuthenticationToken", "IncompleteSignature", "NotAuthorized"})
SERVER_CODES = frozenset({"InternalServiceFault", "InternalFailure", "ServiceUnavailable"})
# The pre-2022 answer of PutMetricData to a batch over the datum limit: "The collection MetricData must not
# have a size greater than 20."
_STATED_LIMIT = re.compile(r"must not have a size greater than (\d+)")


class AwsError(NamedTuple):
    """One failed AWS call, classified. `code` is the service's error code ("" when no answer came back:
    no credentials, network, configuration); `limit` is a request size limit the endpoint stated."""

    kind: str
    code: str = ""
    limit: Optional[int] = None


def _classify_answer(response: dict[str, Any]) -> AwsError:
    """What an error answer from the service (botocore's ClientError.response) means."""
    err = response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    limit = _STATED_LIMIT.search(str(err.get("Message", "")))
    if limit:
        return AwsError("too_large", code, int(limit.group(1)))
    if code in THROTTLING_CODES or status == 429:
        return AwsError("throttling", code)
    if code in CREDENTIAL_CODES or status in (401, 403):
        return AwsError("credentials", code)
    if status == 413 or code == "RequestEntityTooLarge":
        return AwsError("too_large", code)
    if status >= 500 or code in SERVER_CODES:
        return AwsError("server", code)
    return AwsError("rejected", code)


def classify(exc: BaseException) -> AwsError:
    """What a boto3 call's exception means (botocore imported late: most runs never call AWS).

    Kinds (ERROR_KINDS): throttling, credentials (refused, or none to be had: `code` tells which), network
    (no answer), server (5xx), too_large (413 or a stated limit), rejected (the request itself is bad),
    config (no region), other. Only `rejected` means that sending the same request again cannot work."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        return _classify_answer(exc.response)
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError)):
        return AwsError("credentials")
    # ConnectionError covers refused, DNS, connect timeouts, proxy and TLS failures; HTTPClientError covers
    # read timeouts and connections closed mid-answer.
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError)):
        return AwsError("network")
    if isinstance(exc, bx.NoRegionError):
        return AwsError("config")
    return AwsError("other")
