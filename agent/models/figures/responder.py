"""The iperf3-compatible responder (docs/metrics.md, "Responder")."""

from __future__ import annotations

from agent.models.figures.schema import Figure

RESPONDER_LISTENING = Figure(
    "burstwatch_responder_listening", "gauge", "responder",
    "1 when the responder is bound to its port and accepting tests (0: disabled, or the port could not be bound).",
    doc="1 when the responder is bound to its port (0: the port was taken; see the log)")
RESPONDER_BUSY = Figure(
    "burstwatch_responder_busy", "gauge", "responder",
    "1 while a test is running (others get \"busy\").",
    doc="1 while a test is running (other clients are told \"busy\", as iperf3 does)")
RESPONDER_ALLOWED_NETWORKS = Figure(
    "burstwatch_responder_allowed_networks", "gauge", "responder",
    "Source networks allowed to run tests.",
    doc="source networks allowed to run tests (`[responder] allow`, else the VPC's CIDRs, else loopback)")
RESPONDER_CONNECTIONS_TOTAL = Figure(
    "burstwatch_responder_connections_total", "counter", "responder",
    "TCP connections accepted (control and data).",
    doc="TCP connections accepted (control and data)")
RESPONDER_TESTS_TOTAL = Figure(
    "burstwatch_responder_tests_total", "counter", "responder",
    "Tests that started (cookie and parameters accepted), by result: completed (results exchanged) or aborted.",
    labels=("result",),
    doc="tests that started, by `completed` / `aborted`")
RESPONDER_REFUSED_TOTAL = Figure(
    "burstwatch_responder_refused_total", "counter", "responder",
    "Tests refused, by reason: not_allowed (source outside the allow list), busy, rate_limited "
    "(max_tests_per_hour), duration, streams, bytes (over the caps), unsupported; and, answered as busy, "
    "credit_floor, would_cross_floor (this host's credit under credit_floor, now or after the test), budget (hourly "
    "serving budget).",
    labels=("reason",),
    doc="tests refused: `not_allowed`, `busy`, `rate_limited`, `duration`, `streams`, `bytes`, `unsupported`; and "
        "the credit guard's, answered as busy: `credit_floor`, `would_cross_floor`, `budget`")
RESPONDER_DROPPED_TOTAL = Figure(
    "burstwatch_responder_dropped_total", "counter", "responder",
    "Connections or tests dropped for protocol trouble, by reason: timeout (a state took too long), garbage, "
    "closed, terminated (the client gave up), stream_error, overload.",
    labels=("reason",),
    doc="connections dropped for protocol trouble: `timeout`, `garbage`, `closed`, `terminated`, `stream_error`, "
        "`overload`")
RESPONDER_BYTES_TOTAL = Figure(
    "burstwatch_responder_bytes_total", "counter", "responder",
    "Test payload bytes: in = received by the responder, out = sent by it (counts a running test as it goes).",
    labels=("direction",),
    doc="test payload bytes (`in` received, `out` sent by the responder)")
RESPONDER_LAST_TEST_TIMESTAMP_SECONDS = Figure(
    "burstwatch_responder_last_test_timestamp_seconds", "gauge", "responder",
    "Unix time the last test ended (0: none yet).",
    doc="Unix time the last test ended")
RESPONDER_SERVED_LAST_HOUR_BYTES = Figure(
    "burstwatch_responder_served_last_hour_bytes", "gauge", "responder",
    "Test payload bytes served in the last sliding hour (in = received, out = sent; a running test counts as it "
    "goes): what the hourly budget counts.",
    labels=("direction",),
    doc="payload bytes served in the last sliding hour (what the hourly budget counts)")
RESPONDER_HOURLY_BUDGET_BYTES = Figure(
    "burstwatch_responder_hourly_budget_bytes", "gauge", "responder",
    "The hourly budget in force: most bytes served per direction in any sliding hour, all sources together "
    "(sized to this instance unless configured in bytes).",
    doc="the hourly budget in force (per direction, all sources): `[responder] hourly_budget_bytes`, sized to "
        "this instance's profile of the moment when `auto`")
RESPONDER_HOURLY_BUDGET_INFO = Figure(
    "burstwatch_responder_hourly_budget_info", "gauge", "responder",
    "What the hourly budget in force was sized from: refill (a share of this size's hourly refill), link (no "
    "burst bucket: a fairness limit, the same share of what the link moves in an hour), median (size unknown: "
    "the median burstable size's refill) or config (hourly_budget_bytes in bytes).",
    labels=("basis",),
    doc="1, with `basis` the budget was sized from: `refill` (`hourly_budget_share` of this size's hourly refill), "
        "`link` (no burst bucket: only a fairness limit, the same share of what the link moves in an hour), "
        "`median` (size unknown: the median burstable size's refill), `config` (bytes given)")
