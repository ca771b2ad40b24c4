"""Check: may this instance list, write and read the fleet's learned buckets in S3 (docs/fleet.md, "IAM")?"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from typing import Any, Optional

from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, SKIP, WARN, Verdict

log = logging.getLogger(__name__)

NAME = "fleet_access"
# Its cadence in the daemon (daily) is in agent/checks/__init__.py's INTERVALS.

DOC = "docs/fleet.md#iam"
LIST, PUT, GET = "s3:ListBucket", "s3:PutObject", "s3:GetObject"
# The check writes here, beside learned/ and never under it: a reader of the learned/ partitions (the
# fleet service, Athena) never sees these objects. One key per instance, overwritten on every run.
ACCESS_DIR = "access-check/"
CHECK_FORMAT = "burstwatch-access-check/1"
# Outcomes that mean "S3 did not answer usefully": the agent retries these itself, so WARN, not FAIL.
_TRANSIENT = ("network", "server", "throttling")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def normalise_prefix(prefix: str) -> str:
    """The configured prefix as keys use it: "" stays "", anything else ends in exactly one "/"."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def bucket_arn(bucket: str) -> str:
    return f"arn:aws:s3:::{bucket}"


def policy_document(bucket: str, prefix: str) -> dict[str, Any]:
    """The least-privilege policy for fleet learning (the one docs/fleet.md#iam prints for BUCKET and the
    default prefix): objects anywhere under the prefix (learned/ for the fleet, access-check/ for this
    check), and a listing restricted to the learned/ partitions, the only one the agent lists."""
    prefix = normalise_prefix(prefix)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "BurstwatchFleetObjects", "Effect": "Allow", "Action": [PUT, GET],
             "Resource": f"{bucket_arn(bucket)}/{prefix}*"},
            {"Sid": "BurstwatchFleetList", "Effect": "Allow", "Action": LIST,
             "Resource": bucket_arn(bucket),
             "Condition": {"StringLike": {"s3:prefix": f"{prefix}learned/*"}}},
        ],
    }


def _who(ctx: CheckContext) -> str:
    # InstanceFacts may carry the instance id (discovery's identity); off EC2 the hostname names the object.
    name = getattr(ctx.instance, "instance_id", None) or socket.gethostname() or "unknown"
    return _UNSAFE.sub("_", str(name))


def _error(exc: BaseException) -> tuple[str, str]:
    """(kind, code) of a failed S3 call, as agent.aws.classify sees it (S3 says "AccessDenied")."""
    from agent.aws import classify

    err = classify(exc)
    return err.kind, err.code


def run(ctx: CheckContext) -> list[Verdict]:
    cfg = ctx.config.fleet
    if not cfg.enabled:
        return [Verdict(NAME, "", SKIP, "fleet.enabled = false: no learned buckets are shared", {})]
    bucket = cfg.bucket or ""
    prefix = normalise_prefix(cfg.prefix)
    region = cfg.region or getattr(ctx.instance, "region", None)
    key = f"{prefix}{ACCESS_DIR}{_who(ctx)}.json"
    learned = f"{prefix}learned/"
    arns = {LIST: f"{bucket_arn(bucket)} (s3:prefix {learned})", PUT: f"{bucket_arn(bucket)}/{key}",
            GET: f"{bucket_arn(bucket)}/{key}"}
    ev: dict[str, Any] = {"bucket": bucket, "prefix": prefix, "region": region, "endpoint_url": cfg.endpoint_url,
                          "key": key, "actions": {}}
    actions: dict[str, str] = ev["actions"]      # action -> allowed | denied | untested | <error kind>

    from agent import aws

    # Two attempts and short timeouts: an unreachable endpoint costs seconds, not the child's whole budget.
    s3 = aws.client("s3", region, cfg.endpoint_url, max_attempts=2, connect_timeout=3.0, read_timeout=5.0)

    def call(action: str, fn: Any, **kw: Any) -> tuple[Optional[dict[str, Any]], Optional[tuple[str, str]]]:
        try:
            res: dict[str, Any] = fn(**kw)
            if "Body" in res:
                res["Body"].read()
        except Exception as exc:  # classified: a check reports AWS trouble, it never raises it
            log.debug("fleet_access: %s on %s failed: %s", action, arns[action], exc)
            return None, _error(exc)
        return res, None

    failures: list[tuple[str, str, str]] = []    # (action, kind, code) of the calls that failed

    def outcome(action: str, err: Optional[tuple[str, str]]) -> None:
        if err is None:
            actions[action] = "allowed"
            return
        kind, code = err
        actions[action] = "denied" if kind == "credentials" and code == "AccessDenied" else kind
        failures.append((action, kind, code))

    listing, err = call(LIST, s3.list_objects_v2, Bucket=bucket, Prefix=learned, MaxKeys=1)
    outcome(LIST, err)
    if err is not None and err[0] in _TRANSIENT + ("config",):
        return [_unreachable(failures[-1], cfg.endpoint_url, bucket, ev)]
    if err is not None and err[0] == "credentials" and err[1] != "AccessDenied":
        return [_no_credentials(failures[-1], ev)]
    sample = next((o["Key"] for o in (listing or {}).get("Contents", [])), None)   # a learned/ object, if any
    body = json.dumps({"format": CHECK_FORMAT, "writer": _who(ctx), "checked_at": time.time()}).encode()
    _put, put_err = call(PUT, s3.put_object, Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    outcome(PUT, put_err)
    _got, get_err = call(GET, s3.get_object, Bucket=bucket, Key=key)
    if put_err is not None and get_err is not None and get_err[1] == "NoSuchKey":
        get_err = None   # S3 says "no such key" only to a caller allowed to GetObject it
    elif put_err is not None and get_err is not None and get_err[1] == "AccessDenied":
        # Nothing was written, and S3 answers a GET of a missing key with 403 whether or not GetObject is
        # allowed when the caller may not list that key's prefix (our policy lists learned/ only): read the
        # object the listing returned instead, its first byte only.
        if sample is None:
            actions[GET] = "untested"
            get_err = None
        else:
            arns[GET] = f"{bucket_arn(bucket)}/{sample}"
            _got, get_err = call(GET, s3.get_object, Bucket=bucket, Key=sample, Range="bytes=0-0")
    if actions.get(GET) != "untested":
        outcome(GET, get_err)
    ev["arns"] = dict(arns)
    return [_verdict(failures, actions, arns, cfg.endpoint_url, bucket, prefix, ev)]


def _unreachable(f: tuple[str, str, str], endpoint: Optional[str], bucket: str, ev: dict[str, Any]) -> Verdict:
    action, kind, code = f
    where = endpoint or "S3's regional endpoint"
    if kind == "config":
        return Verdict(NAME, "", FAIL, f"no AWS region for the S3 client: set [fleet] region (the bucket {bucket}'s "
                       "region)", ev, "# [fleet]\n# region = \"us-east-1\"")
    what = {"network": "no answer", "server": f"server error {code}".strip(),
            "throttling": f"throttled ({code})"}[kind]
    return Verdict(NAME, "", WARN, f"S3 unreachable at {where} ({what} to {action} on bucket {bucket}): the agent "
                   "keeps learned buckets spooled and retries; access not verified", ev,
                   f"aws s3api list-objects-v2 --bucket {bucket} --prefix {ev['prefix']}learned/ --max-keys 1"
                   + (f" --endpoint-url {endpoint}" if endpoint else "")
                   + "   # from this instance: a VPC without a NAT needs an S3 gateway endpoint")


def _no_credentials(f: tuple[str, str, str], ev: dict[str, Any]) -> Verdict:
    action, _kind, code = f
    if not code:
        why = "no AWS credentials found (no instance profile, no environment keys)"
    elif code in ("RequestExpired", "RequestTimeTooSkewed"):
        why = f"the request was refused as expired ({code}): this host's clock is off"
    else:
        why = f"the credentials were refused ({code})"
    return Verdict(NAME, "", FAIL, f"{action} failed: {why}", ev,
                   f"aws sts get-caller-identity   # which identity this host uses\n"
                   f"# attach an instance profile with the policy in {DOC}")


def _verdict(failures: list[tuple[str, str, str]], actions: dict[str, str], arns: dict[str, str],
             endpoint: Optional[str], bucket: str, prefix: str, ev: dict[str, Any]) -> Verdict:
    untested = [a for a, s in actions.items() if s == "untested"]
    note = f"; {', '.join(untested)} not verified (nothing this identity could read)" if untested else ""
    transient = [f for f in failures if f[1] in _TRANSIENT]
    denied = [f for f in failures if actions[f[0]] == "denied"]
    other = [f for f in failures if f not in transient and f not in denied]
    if denied or other:
        parts = [f"{a} denied on {arns[a]}" for a, _k, _c in denied]
        parts += [f"{a} on {arns[a]} failed: {c or k}" + (" (the bucket does not exist)" if c == "NoSuchBucket"
                                                         else "") for a, k, c in other]
        # One line: the table indents remedies, which a here-document would not survive.
        remedy = (f"# grant the policy in {DOC} to the instance's role ($ROLE):\n"
                  "aws iam put-role-policy --role-name \"$ROLE\" --policy-name burstwatch-fleet --policy-document '"
                  + json.dumps(policy_document(bucket, prefix), separators=(",", ":")) + "'")
        if not denied:
            remedy = f"aws s3api head-bucket --bucket {bucket}   # does it exist, in this account and region?"
        log.warning("fleet_access: %s", "; ".join(parts))
        return Verdict(NAME, "", FAIL, "; ".join(parts) + note
                       + f" (the agent cannot share learned buckets; see {DOC})", ev, remedy)
    if transient:
        return _unreachable(transient[0], endpoint, bucket, ev)
    return Verdict(NAME, "", OK, f"s3://{bucket}/{prefix}: list learned/, write and read {ACCESS_DIR} allowed{note}",
                   ev)
