"""iperf3's results: the object both sides exchange after EXCHANGE_RESULTS, built and validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from agent.iperf3.protocol import MAX_STREAMS, ProtocolError, finite_number, json_int, quote


@dataclass(frozen=True)
class StreamResult:
    id: int
    bytes: int
    retransmits: int = -1     # -1: unknown (a receiver, or no TCP_INFO)
    jitter: float = 0.0       # seconds (UDP receivers)
    errors: int = 0           # UDP datagrams lost
    packets: int = 0          # UDP datagrams
    start_time: float = 0.0
    end_time: float = 0.0


@dataclass(frozen=True)
class Results:
    cpu_total: float = 0.0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    sender_has_retransmits: int = -1   # 1, 0, or -1 when the side was a receiver
    congestion_used: Optional[str] = None
    streams: tuple[StreamResult, ...] = ()
    server_output_text: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_util_total": self.cpu_total, "cpu_util_user": self.cpu_user,
                               "cpu_util_system": self.cpu_system,
                               "sender_has_retransmits": self.sender_has_retransmits}
        if self.congestion_used:
            out["congestion_used"] = self.congestion_used
        if self.server_output_text is not None:
            out["server_output_text"] = self.server_output_text
        out["streams"] = [{"id": s.id, "bytes": s.bytes, "retransmits": s.retransmits, "jitter": s.jitter,
                           "errors": s.errors, "packets": s.packets, "start_time": s.start_time,
                           "end_time": s.end_time} for s in self.streams]
        return out


def _signed(value: Any) -> int:
    """iperf3 writes -1 through an unsigned 64-bit path (1.8446744073709552e+19); read that as -1.
    A number beyond 64 bits is no counter at all: ProtocolError."""
    if not finite_number(value):
        return -1
    if value > 2**64:
        raise ProtocolError(f"result counter {quote(value)} exceeds 64 bits")
    return -1 if value < 0 or value >= 2**63 else int(value)


def _float(obj: dict[str, Any], key: str) -> float:
    value = obj.get(key, 0.0)
    if finite_number(value):
        try:
            return float(value)
        except OverflowError:  # an int beyond a float's range
            pass
    raise ProtocolError(f"result {key!r} is not a number: {quote(value)}")


def parse_results(obj: dict[str, Any]) -> Results:
    """Validate a results object (get_results requires the cpu_util_* keys, sender_has_retransmits and
    streams with id, bytes, retransmits, jitter, errors and packets)."""
    for key in ("cpu_util_total", "cpu_util_user", "cpu_util_system", "sender_has_retransmits", "streams"):
        if key not in obj:
            raise ProtocolError(f"results lack {key!r}")
    raw_streams = obj["streams"]
    if not isinstance(raw_streams, list) or len(raw_streams) > MAX_STREAMS * 2:
        raise ProtocolError("results 'streams' is not a list of at most 256 streams")
    streams = []
    for item in raw_streams:
        if not isinstance(item, dict):
            raise ProtocolError("a results stream is not an object")
        for key in ("id", "bytes", "retransmits", "jitter", "errors", "packets"):
            if key not in item:
                raise ProtocolError(f"a results stream lacks {key!r}")
        streams.append(StreamResult(
            id=json_int(item, "id", 0, 0, 1 << 20), bytes=json_int(item, "bytes", 0, 0, 2**63 - 1),
            retransmits=_signed(item.get("retransmits")), jitter=_float(item, "jitter"),
            errors=max(0, _signed(item.get("errors"))), packets=max(0, _signed(item.get("packets"))),
            start_time=_float(item, "start_time"), end_time=_float(item, "end_time")))
    has = _signed(obj.get("sender_has_retransmits"))
    congestion = obj.get("congestion_used")
    text = obj.get("server_output_text")
    return Results(cpu_total=_float(obj, "cpu_util_total"), cpu_user=_float(obj, "cpu_util_user"),
                   cpu_system=_float(obj, "cpu_util_system"), sender_has_retransmits=has if has in (0, 1) else -1,
                   congestion_used=congestion if isinstance(congestion, str) else None,
                   streams=tuple(streams), server_output_text=text if isinstance(text, str) else None)
