"""The daemon's check service: every check at start-up, then periodically (path MTU less often)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from agent.checks import CHECKS
from agent.models.checks import Verdict, worst

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 300.0        # seconds between runs of the quick checks (a few ioctls and netlink reads)
DEFAULT_SLOW_INTERVAL = 3600.0  # path MTU: probes and waits for silence, and the kernel caches PMTU 10 min

@dataclass(frozen=True)
class CheckState:
    """The latest verdicts, as one immutable object a scrape reads whole."""

    verdicts: tuple[Verdict, ...] = ()
    last_run: dict[str, float] = field(default_factory=dict)     # check -> unix time of its last run
    durations: dict[str, float] = field(default_factory=dict)    # check -> seconds its last run took
    runs: int = 0

    def by_check(self, name: str) -> list[Verdict]:
        return [v for v in self.verdicts if v.check == name]


# include_slow -> every verdict of the round (the checks not run this round are absent)
RoundExecutor = Callable[[bool], list[Verdict]]


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
        self._child: Optional[subprocess.Popen] = None
        self._cancelled = False

    def __call__(self, include_slow: bool) -> list[Verdict]:
        root = str(Path(__file__).resolve().parents[2])
        cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {root!r}); from agent.cli import main; "
               "sys.exit(main())", "check", "--json"]
        if self.config_path:
            cmd += ["--config", self.config_path]
        if not include_slow:
            cmd.append("--quick")
        with self._lock:
            if self._cancelled:
                raise RoundCancelled("the check service is stopping")
            child = self._child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = child.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        finally:
            with self._lock:
                self._child = None
        if self._cancelled or -child.returncode in _STOP_SIGNALS:
            how = "cancelled by stop" if self._cancelled else f"stopped by {signal.Signals(-child.returncode).name}"
            raise RoundCancelled(f"`burstwatch check` {how}")
        try:
            doc = json.loads(stdout)
        except ValueError:
            raise RuntimeError(f"`burstwatch check` exited {child.returncode}: {stderr.strip()[-500:]}") from None
        return [Verdict.from_dict(d) for d in doc["verdicts"]]

    def cancel(self) -> None:
        """Stop the running round's child (SIGTERM) and refuse new ones: the daemon's stop must not wait
        for a path MTU probe, and a child left behind would outlive `burstwatch run` outside systemd."""
        with self._lock:
            self._cancelled = True
            if self._child is not None and self._child.poll() is None:
                self._child.terminate()


def subprocess_executor(config_path: Optional[str], timeout: float = 180.0) -> SubprocessExecutor:
    """The daemon's executor: each round in a `burstwatch check --json` child (SubprocessExecutor)."""
    return SubprocessExecutor(config_path, timeout)


class CheckRunner:
    """A daemon service (name, start, stop): runs the checks on a thread and keeps the latest verdicts."""

    name = "checks"

    def __init__(self, executor: RoundExecutor, interval: float = DEFAULT_INTERVAL,
                 slow_interval: float = DEFAULT_SLOW_INTERVAL, wall: Callable[[], float] = time.time) -> None:
        self.executor = executor
        self.interval = interval
        self.slow_interval = slow_interval
        self.wall = wall
        self.state = CheckState()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_slow: Optional[float] = None

    def snapshot(self) -> CheckState:
        """The latest verdicts (replaced whole after each round, never changed in place)."""
        return self.state

    def run_once(self, include_slow: bool = True) -> CheckState:
        """One round, run by the executor (a child process in the daemon); the verdicts of checks it
        did not run this round (path MTU in a quick round) are kept from earlier rounds."""
        found = self.executor(include_slow)
        old = self.state
        ran = {v.check for v in found}
        now = self.wall()
        verdicts = {name: ([v for v in found if v.check == name] if name in ran else old.by_check(name))
                    for name in CHECKS}
        last_run = {**old.last_run, **{name: now for name in ran}}
        if include_slow:
            self._last_slow = time.monotonic()
        flat = tuple(v for name in CHECKS for v in verdicts[name])
        self.state = CheckState(flat, last_run, dict(old.durations), old.runs + 1)
        bad = [f"{v.check}/{v.interface or '-'}={v.status}" for v in flat if v.status in ("warn", "fail")]
        log.info("checks: %s%s", worst(flat), (" (" + ", ".join(bad) + ")") if bad else "")
        return self.state

    def _loop(self) -> None:
        while not self._stop.is_set():
            slow = self._last_slow is None or time.monotonic() - self._last_slow >= self.slow_interval
            try:
                self.run_once(include_slow=slow)
            except RoundCancelled as exc:
                # systemd signals the whole cgroup at once, so the child can die a moment before the
                # daemon's own SIGTERM handler reaches stop(): wait for that before calling it odd.
                stopping = self._stop.wait(2.0)
                (log.info if stopping else log.warning)("check round cancelled: %s", exc)
            except Exception:
                log.exception("check round failed")
            self._stop.wait(self.interval)

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
