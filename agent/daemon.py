"""`burstwatch run`: the loop, signals and lifecycle around what agent.wiring builds."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any, Optional

from agent import config as configmod
from agent.config_checks import split_hostport
from agent.exporters.prometheus import MetricsServer, ReloadState, build_registry
from agent.notify import notify, watchdog_interval
from agent.sampling.pipeline import Snapshot
from agent.wiring import Agent, Paths, build

log = logging.getLogger(__name__)


class Daemon:
    def __init__(self, cfg: configmod.Config, config_path: Optional[str], paths: Paths | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.paths = paths or Paths()
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self._hup = False
        self.reload_state = ReloadState()
        self.reload_state.success_time = time.time()
        self.agent: Optional[Agent] = None
        self.server: Optional[MetricsServer] = None

    # -- signals ---------------------------------------------------------------------------------
    def _on_term(self, signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        self.stop_event.set()
        self.wake.set()

    def _on_hup(self, _signum: int, _frame: Any) -> None:
        self._hup = True
        self.wake.set()

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, self._on_hup)

    # -- config ----------------------------------------------------------------------------------
    def reload(self) -> bool:
        """Re-read the config file; on any error keep the running config and say so in a metric."""
        try:
            new = configmod.load(self.config_path)
            if self.server is not None and new.metrics != self.cfg.metrics:
                self.server.reconfigure(new.metrics)   # certificates, users, limits: read again now
        except configmod.ConfigError as exc:
            log.error("config reload failed, keeping the running config: %s", exc)
            self.reload_state.successful = 0.0
            self.reload_state.reloads["failure"] += 1
            return False
        self.reload_state.successful = 1.0
        self.reload_state.success_time = time.time()
        self.reload_state.reloads["success"] += 1
        pending: list[str] = []
        if self.agent is not None:
            pending = self.agent.apply(new)
            new = self.agent.cfg          # what runs: keys that wait for a restart keep their running values
        self.cfg = new
        self.reload_state.restart_pending = pending
        where = self.config_path or configmod.DEFAULT_CONFIG_PATH
        if pending:
            log.warning("config reloaded from %s; %d key(s) wait for a restart: %s", where, len(pending),
                        ", ".join(pending))
        else:
            log.info("config reloaded from %s", where)
        return True

    # -- the loop --------------------------------------------------------------------------------
    def setup(self) -> Agent:
        self.agent = a = build(self.cfg, self.config_path, self.paths, self.reload_state)
        host, port = split_hostport(self.cfg.metrics.listen)
        # /-/ready names the responder while it is configured but not listening (port taken, or below 1024).
        self.server = MetricsServer(host, port, build_registry(a.views), config=self.cfg.metrics, generation=a.latest,
                                    not_listening=lambda: () if a.responder is None or a.responder.stats.listening
                                    else ("responder",))
        sock = self.cfg.metrics.socket
        if sock:
            # The default's directory is systemd's RuntimeDirectory= (its owner and mode are the access
            # control), never made here; a path the operator chose gets its directory made, as state_dir does.
            self.server.httpd.listen_unix(sock, create_dir=sock != configmod.DEFAULT_METRICS_SOCKET)
        return a

    def status_line(self, snap: Snapshot) -> str:
        ifs = ",".join(snap.interfaces) or "no interfaces"
        line = f"sampling {ifs} every {self.cfg.sample_interval:g}s"
        if snap.instance_rates:
            line += (f"; in {snap.instance_rates['in'] * 8 / 1e6:.1f} Mbit/s,"
                     f" out {snap.instance_rates['out'] * 8 / 1e6:.1f} Mbit/s")
        return line

    def run(self) -> int:
        self.install_signals()
        a = self.setup()
        assert a.sampler is not None and self.server is not None
        a.sampler.sample()                         # READY only once there is a first sample ...
        self.server.start()                      # ... and the endpoint answers
        for svc in a.services:
            svc.start()
        log.info("burstwatch running: interfaces=%s metrics=http://%s/metrics%s", ",".join(a.interfaces) or "-",
                 self.cfg.metrics.listen, f" and {self.server.httpd.socket_path}" if self.server.httpd.socket_path
                 else "")
        notify("READY=1")
        wd = watchdog_interval()
        last_wd = 0.0
        last_status = 0.0
        next_tick = time.monotonic() + self.cfg.sample_interval
        while not self.stop_event.is_set():
            self.wake.wait(max(0.0, next_tick - time.monotonic()))
            self.wake.clear()
            if self.stop_event.is_set():
                break
            if self._hup:
                self._hup = False
                self.reload()
            now = time.monotonic()
            if now < next_tick:
                continue
            snap = a.sampler.sample()
            if a.cloudwatch is not None:
                try:
                    a.cloudwatch.observe(snap)      # copies figures into its aggregator; no network here
                except Exception:
                    log.exception("cloudwatch observe failed")
            # Ticks are anchored to the schedule, not to the end of the sample, so the interval does not
            # drift; after a stall (suspend, overload) it skips ahead instead of bursting.
            next_tick += self.cfg.sample_interval
            if next_tick < now:
                next_tick = now + self.cfg.sample_interval
            healthy = snap.steps.get("netdev") is not None and snap.steps["netdev"].success
            if wd is not None and healthy and now - last_wd >= wd:
                notify("WATCHDOG=1")
                last_wd = now
            if now - last_status >= 5.0:
                notify("STATUS=" + self.status_line(snap))
                last_status = now
        return self.shutdown()

    def shutdown(self) -> int:
        notify("STOPPING=1")
        deadline = time.monotonic() + 1.5      # systemd's stop must finish well within 2 s
        services = self.agent.services if self.agent is not None else []
        for svc in reversed(services):
            try:
                svc.stop(max(0.1, deadline - time.monotonic()))
            except Exception:
                log.exception("stopping %s failed", svc.name)
        for hook in self.agent.shutdown_hooks if self.agent is not None else []:
            try:
                hook()
            except Exception:
                log.exception("shutdown hook failed")
        if self.server is not None:
            self.server.stop()
        log.info("burstwatch stopped")
        return 0


def state_dir_writable(path: str) -> bool:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".write-test"
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False
