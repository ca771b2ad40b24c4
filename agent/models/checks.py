"""Check verdicts: ok, warn, fail or skip, with the evidence seen and a remedy to paste; exit codes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)
# Severity order for "the worst verdict"; skip ranks below ok: a check that could not run hides nothing.
SEVERITY = {SKIP: -1, OK: 0, WARN: 1, FAIL: 2}

# docs/checks.md ("Exit codes"): `burstwatch check` exits 0 all ok, 1 warnings only, 2 failures.
EXIT_OK, EXIT_WARN, EXIT_FAIL = 0, 1, 2


@dataclass(frozen=True)
class Verdict:
    check: str
    interface: str              # the interface (or peer) the verdict is about; "" for instance-wide checks
    status: str                 # ok | warn | fail | skip
    summary: str                # one line for a person
    evidence: dict[str, Any] = field(default_factory=dict)   # what the check saw (JSON-serialisable)
    remedy: str = ""            # commands a person can paste, "" when nothing needs doing

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(str(d["check"]), str(d.get("interface") or ""), str(d["status"]), str(d.get("summary", "")),
                   dict(d.get("evidence") or {}), str(d.get("remedy") or ""))


def worst(verdicts: Iterable[Verdict]) -> str:
    """The most severe status among `verdicts` (skip when there are none)."""
    return max((v.status for v in verdicts), key=SEVERITY.__getitem__, default=SKIP)


def overall_exit_code(verdicts: Iterable[Verdict]) -> int:
    """0 when nothing is wrong (ok or skip), 1 for warnings only, 2 when anything failed."""
    w = worst(verdicts)
    return EXIT_FAIL if w == FAIL else EXIT_WARN if w == WARN else EXIT_OK
