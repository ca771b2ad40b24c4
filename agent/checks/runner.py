"""The daemon's check service: every check at start-up, then each at its own cadence (agent/checks INTERVALS)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from agent.checks import CHECKS, interval, is_slow
from agent.isolate import Spawned
from agent.models.checks import Verdict, worst

log = logging.getLogger(__name__)

# A check due within this share of the shortest interval (30 s of the quick checks' 300 s) joins the round
# about to run rather than having a child of its own a moment later: rounds that ran late or were retried
# leave the cadences a little apart.
GRACE = 0.1

@dataclass(frozen=True)
class CheckState:
    """The latest verdicts, as one immutable object a scrape reads whole."""

    verdicts: tuple[Verdict, ...] = ()
    last_run: dict[str, float] = field(default_factory=dict)     # check -> unix time of its last run
    durations: dict[str, float] = field(default_factory=dict)    # check -> seconds its last run took
    runs: int = 0

    def by_check(self, name: str) -> list[Verdict]:
        return [v for v in self.verdicts if v.check == name]


@dataclass(frozen=True)
class CheckRound:
    """What one round's executor returns: every verdict of the checks it ran, and the seconds each took."""

    verdicts: list[Verdict]
    durations: dict[str, float] = field(default_factory=dict)


# The checks due -> the round. In-process executors (tests) may return the verdicts alone: no durations.
RoundExecutor = Callable[[Sequence[str]], Union[CheckRound, list[Verdict]]]


class RoundCancelled(Exception):
    """The round's child was stopped by a signal: by CheckRunner.stop(), or by systemd, which signals
    the whole cgroup on `systemctl stop`/`restart`. Not a failed check: the round simply has no verdicts."""


# A child ended by one of these was stopped on purpose (a stop, Ctrl-C in a terminal), not broken.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SubprocessExecutor:
    """Rounds run as `burstwatch check --json` in a child process: the checks use netlink through
    pyroute2 (~23 MB of RSS, as it imports asyncio and unittest.mock) and probe paths that may hang;
    in a child neither stays resident in, nor can stall, the sampling daemon. The child reads the
    same config file, so a reload applies to the next round."""

    def __init__(self, config_path: Optional[str], timeout: float = 180.0) -> None:
        self.config_path = config_path
        self.timeout = timeout
        self._lock = threading.Lock()
        self._child: Optional[Spawned] = None
        self._cancelled = False

    def __call__(self, names: Sequence[str]) -> CheckRound:
        root = str(Path(__file__).resolve().parents[2])
        # The child runs as the daemon does (packaging/bin/burstwatch): the same interpreter flags (-I, -S)
        # and the distribution's site-packages without their .pth files.
        flags = [f for f, on in (("-I", sys.flags.isolated), ("-S", sys.flags.no_site)) if on]
        site = ("import site; sys.path += [p for p in site.getsitepackages() if p not in sys.path]; "
                if sys.flags.no_site else "")
        cmd = [sys.executable, *flags, "-c", f"import sys; sys.path.insert(0, {root!r}); {site}"
               "from agent.cli import main; sys.exit(main())", "check", "--json"]
        if self.config_path:
            cmd += ["--config", self.config_path]
        cmd += ["--checks", ",".join(names)]
        with self._lock:
            if self._cancelled:
                raise RoundCancelled("the check service is stopping")
            child = self._child = Spawned(cmd)
        try:
            stdout, stderr = child.communicate(timeout=self.timeout)
        except TimeoutError:
            child.signal(signal.SIGKILL)
            child.wait()
            raise
        finally:
            with self._lock:
                self._child = None
        assert child.returncode is not None      # communicate() reaped it
        if self._cancelled or -child.returncode in _STOP_SIGNALS:
            how = "cancelled by stop" if self._cancelled else f"stopped by {signal.Signals(-child.returncode).name}"
            raise RoundCancelled(f"`burstwatch check` {how}")
        try:
            doc = json.loads(stdout)
        except ValueError:
            raise RuntimeError(f"`burstwatch check` exited {child.returncode}: {stderr.strip()[-500:]}") from None
        # The child timed each check; the daemon's own clock would only see the whole child (imports and all).
        return CheckRound([Verdict.from_dict(d) for d in doc["verdicts"]],
                          {k: float(v) for k, v in doc.get("durations", {}).items()})

    def cancel(self) -> None:
        """Stop the running round's child (SIGTERM) and refuse new ones: the daemon's stop must not wait
        for a path MTU probe, and a child left behind would outlive `burstwatch run` outside systemd."""
        with self._lock:
            self._cancelled = True
            if self._child is not None:
                self._child.signal(signal.SIGTERM)


def subprocess_executor(config_path: Optional[str], timeout: float = 180.0) -> SubprocessExecutor:
    """The daemon's executor: each round in a `burstwatch check --json` child (SubprocessExecutor)."""
    return SubprocessExecutor(config_path, timeout)


class CheckRunner:
    """A daemon service (name, start, stop): runs the checks on a thread and keeps the latest verdicts.

    Each check has its own cadence (`intervals`, default agent/checks INTERVALS): a round runs the checks
    that are due, on a schedule anchored to the first round so the cadences stay aligned (path MTU falls on
    every 12th quick round); a round that fails is retried after the shortest interval."""

    name = "checks"

    def __init__(self, executor: RoundExecutor, intervals: Optional[Mapping[str, float]] = None,
                 wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.clock = clock                           # schedules (monotonic); `wall` stamps last_run
        self.intervals = {n: float((intervals or {}).get(n, interval(n))) for n in CHECKS}
        self.wall = wall
        self.state = CheckState()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._due_at: dict[str, float] = {}          # check -> monotonic time it is next due (absent: now)

    def snapshot(self) -> CheckState:
        """The latest verdicts (replaced whole after each round, never changed in place)."""
        return self.state

    def due(self, now: float) -> list[str]:
        """The checks to run in a round starting at `now` (monotonic), in registry order."""
        early = GRACE * min(self.intervals.values())
        return [n for n in CHECKS if now >= self._due_at.get(n, now) - early]

    def next_due(self) -> float:
        """When the next round is due (the clock's time; 0 before the first round)."""
        return min((self._due_at.get(n, 0.0) for n in CHECKS), default=0.0)

    def run_once(self, include_slow: bool = True) -> CheckState:
        """One round outside the schedule (tests, start-up tools): every check, or the quick ones only."""
        return self.run_round([n for n in CHECKS if include_slow or not is_slow(n)])

    def run_round(self, names: Sequence[str]) -> CheckState:
        """One round of `names`, run by the executor (a child process in the daemon); the verdicts of
        checks it did not run are kept from earlier rounds."""
        started = self.clock()
        found = self.executor(tuple(names))
        rnd = found if isinstance(found, CheckRound) else CheckRound(list(found))
        old = self.state
        ran = set(names) | {v.check for v in rnd.verdicts} | set(rnd.durations)
        now = self.wall()
        verdicts = {name: ([v for v in rnd.verdicts if v.check == name] if name in ran else old.by_check(name))
                    for name in CHECKS}
        last_run = {**old.last_run, **{name: now for name in CHECKS if name in ran}}
        durations = {**old.durations, **{k: v for k, v in rnd.durations.items() if k in CHECKS}}
        for name in ran & set(CHECKS):
            every = self.intervals[name]
            # Anchored (the previous due time plus the interval) unless that is already past: no catching up.
            nxt = self._due_at.get(name, started) + every
            self._due_at[name] = nxt if nxt > started else started + every
        flat = tuple(v for name in CHECKS for v in verdicts[name])
        self.state = CheckState(flat, last_run, durations, old.runs + 1)
        bad = [f"{v.check}/{v.interface or '-'}={v.status}" for v in flat if v.status in ("warn", "fail")]
        log.info("checks: %s%s", worst(flat), (" (" + ", ".join(bad) + ")") if bad else "")
        return self.state

    def _loop(self) -> None:
        retry = min(self.intervals.values())
        while not self._stop.is_set():
            started = self.clock()
            names = self.due(started)
            try:
                if names:
                    self.run_round(names)
            except RoundCancelled as exc:
                # systemd signals the whole cgroup at once, so the child can die a moment before the
                # daemon's own SIGTERM handler reaches stop(): wait for that before calling it odd.
                stopping = self._stop.wait(2.0)
                (log.info if stopping else log.warning)("check round cancelled: %s", exc)
            except Exception:
                log.exception("check round failed")
            for name in names:
                if self._due_at.get(name, started) <= started:   # not run: try again after the shortest interval
                    self._due_at[name] = started + retry
            self._stop.wait(max(0.0, self.next_due() - self.clock()))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checks", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        # Only the subprocess executor has a child to cancel; in-process executors (tests) finish alone.
        cancel = getattr(self.executor, "cancel", None)
        if cancel is not None:
            cancel()
        if self._thread is not None:
            self._thread.join(timeout)
