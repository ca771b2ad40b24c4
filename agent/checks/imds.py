"""Check: is the instance metadata service reachable, with IMDSv2?"""

from __future__ import annotations

from agent.checks.context import CheckContext
from agent.models.checks import FAIL, OK, SKIP, WARN, Verdict

NAME = "imds"

TEST = ("TOKEN=$(curl -sS -m 2 -X PUT http://169.254.169.254/latest/api/token "
        "-H 'X-aws-ec2-metadata-token-ttl-seconds: 60')\n"
        "curl -sS -m 2 -H \"X-aws-ec2-metadata-token: $TOKEN\" http://169.254.169.254/latest/meta-data/instance-id")
ENABLE = ("aws ec2 modify-instance-metadata-options --instance-id $INSTANCE_ID --http-endpoint enabled "
          "--http-tokens required --http-put-response-hop-limit 2")

# AWS's advice for containers: a hop limit of 2 lets the token answer cross the container's own hop.
HOP_LIMIT = ("aws ec2 modify-instance-metadata-options --instance-id <instance-id> "
             "--http-put-response-hop-limit 2 --http-endpoint enabled")


def run(ctx: CheckContext) -> list[Verdict]:
    cfg = ctx.config.imds
    if not cfg.enabled:
        return [Verdict(NAME, "", SKIP, "imds.enabled = false: burstwatch does not ask IMDS", {})]
    if ctx.imds_probe is None:
        return [Verdict(NAME, "", SKIP, "no IMDS client in this context", {})]
    p = ctx.imds_probe()
    ev = {"endpoint": cfg.endpoint, "reachable": p.reachable, "imdsv2": p.imdsv2, "detail": p.detail}
    if p.reachable and p.imdsv2:
        return [Verdict(NAME, "", OK, p.detail, ev)]
    if p.reachable:
        return [Verdict(NAME, "", FAIL, f"IMDS answers but not with IMDSv2: {p.detail}", ev, f"{ENABLE}\n{TEST}")]
    configured = ctx.config.instance.type is not None and ctx.config.interfaces
    if p.unanswered:
        # The TCP handshake passed but the token answer never came: on EC2 that is the PUT response's IP
        # hop limit (default 1), which a container or pod without host networking is one hop beyond
        # (docs/ec2-network-facts.md, "IMDS from containers"). Reads would fail the same way.
        summary = (f"IMDS at {cfg.endpoint} accepted the connection but never answered the token request: "
                   "the instance's IMDS hop limit (http-put-response-hop-limit) is likely 1, too low for a "
                   "container or pod without host networking; set it to 2 (or run with host networking)")
        return [Verdict(NAME, "", WARN if configured else FAIL, summary, dict(ev, hop_limit_suspected=True),
                        f"{HOP_LIMIT}\n{TEST}")]
    summary = f"IMDS not reachable at {cfg.endpoint}: {p.detail}"
    if configured:
        return [Verdict(NAME, "", WARN, summary + "; running on the configured [instance] type and interfaces",
                        ev, f"{TEST}\n{ENABLE}")]
    return [Verdict(NAME, "", FAIL, summary + "; burstwatch cannot learn the instance type or its ENIs "
                    "(off EC2, set [instance] type and interfaces)", ev, f"{TEST}\n{ENABLE}")]
