"""`burstwatch check`: run every check once and print a table for a person, or JSON for a script."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from typing import Any, Callable, Optional, TextIO

from agent import config as configmod
from agent.checks import CHECKS, is_slow, parse_names, run_timed
from agent.checks.context import CheckContext, build_context
from agent.models.checks import STATUSES, Verdict, overall_exit_code

ContextFactory = Callable[[configmod.Config], CheckContext]


def render_table(verdicts: list[Verdict], width: int = 100) -> str:
    """Check, interface, status and summary per row; the remedy below it, ready to paste."""
    cw = max([len("CHECK"), *(len(v.check) for v in verdicts)])
    iw = min(24, max([len("INTERFACE"), *(len(v.interface or "-") for v in verdicts)]))
    lead = cw + iw + 6 + 3 * 2
    text_w = max(30, width - lead)
    lines = [f"{'CHECK':<{cw}}  {'INTERFACE':<{iw}}  {'STATUS':<6}  SUMMARY"]
    pad = " " * lead
    for v in verdicts:
        summary = textwrap.wrap(v.summary, text_w) or [""]
        lines.append(f"{v.check:<{cw}}  {(v.interface or '-'):<{iw}}  {v.status.upper():<6}  {summary[0]}")
        lines.extend(pad + s for s in summary[1:])
        if v.remedy and v.status != "ok":
            for i, cmd in enumerate(v.remedy.splitlines()):
                lines.append(pad + ("fix: " if i == 0 else "     ") + cmd)
    counts = {s: sum(1 for v in verdicts if v.status == s) for s in STATUSES}
    code = overall_exit_code(verdicts)
    lines.append("")
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f"; exit {code}")
    return "\n".join(lines)


def to_json(ctx: Optional[CheckContext], verdicts: list[Verdict],
            durations: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """The --json document; `durations` (check -> seconds it took here) is what the daemon's runner exports
    as burstwatch_check_duration_seconds, since its rounds run in this command as a child."""
    inst = ctx.instance if ctx is not None else None
    return {
        "exit_code": overall_exit_code(verdicts),
        "counts": {s: sum(1 for v in verdicts if v.status == s) for s in STATUSES},
        "interfaces": list(ctx.interfaces) if ctx is not None else [],
        "instance": inst.__dict__ if inst is not None else None,
        "checks": list(CHECKS),
        "durations": {k: round(v, 6) for k, v in (durations or {}).items()},
        "verdicts": [v.to_dict() for v in verdicts],
    }


def cmd_check(args: argparse.Namespace, context_factory: Optional[ContextFactory] = None,
              out: TextIO = sys.stdout) -> int:
    """Entry point for `burstwatch check [--config PATH] [--json]`: 0 ok, 1 warnings only, 2 failures
    (a bad config raises ConfigError, which the CLI turns into exit 2 as well)."""
    cfg = configmod.load(getattr(args, "config", None))
    ctx = (context_factory or build_context)(cfg)
    quick = getattr(args, "quick", False)
    only = getattr(args, "checks", None)       # the daemon's runner names the checks due this round
    names = parse_names(only) if only else list(CHECKS)
    verdicts, durations = run_timed(ctx, [n for n in names if not (quick and is_slow(n))])
    if getattr(args, "json", False):
        out.write(json.dumps(to_json(ctx, verdicts, durations), indent=2, default=str) + "\n")
    else:
        width = shutil.get_terminal_size((110, 24)).columns
        out.write(render_table(verdicts, width) + "\n")
    return overall_exit_code(verdicts)
