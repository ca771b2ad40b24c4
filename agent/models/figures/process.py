"""The process and its config: build, reloads (docs/metrics.md, "Process and config")."""

from __future__ import annotations

from agent.models.figures.schema import Figure

BUILD_INFO = Figure(
    "burstwatch_build_info", "info", "process",
    "burstwatch version and the Python running it.",
    labels=("version", "python"),
    doc="burstwatch version and the Python running it")
CONFIG_LAST_RELOAD_SUCCESSFUL = Figure(
    "burstwatch_config_last_reload_successful", "gauge", "process",
    "1 when the last config (re)load succeeded; 0 keeps the old config running.",
    doc="1 when the last config (re)load succeeded; 0 = the running config is the old one")
CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS = Figure(
    "burstwatch_config_last_reload_success_timestamp_seconds", "gauge", "process",
    "Unix time of the last successful config load.",
    doc="Unix time of the last successful load")
CONFIG_RELOADS_TOTAL = Figure(
    "burstwatch_config_reloads_total", "counter", "process",
    "Config reloads by result.",
    labels=("result",),
    doc="SIGHUP reloads by `success` / `failure`")
CONFIG_RESTART_PENDING = Figure(
    "burstwatch_config_restart_pending", "gauge", "process",
    "1 while a reloaded config changed keys that wait for a restart; the log names them.",
    doc="1 while the config file holds a new value for a key that waits for a restart (the reload's log line "
        "names each key; the \"on SIGHUP\" column of docs/configuration.md); 0 after the restart, or once the "
        "file is set back")
