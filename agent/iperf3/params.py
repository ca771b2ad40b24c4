"""iperf3's test parameters: the object a client sends after PARAM_EXCHANGE, built and validated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from agent.iperf3.protocol import (
    DEFAULT_TCP_BLKSIZE,
    DEFAULT_UDP_BLKSIZE,
    IPERF_PROTOCOL_VERSION,
    ProtocolError,
    json_int,
    quote,
)


@dataclass(frozen=True)
class TestParams:
    """A client's test parameters as iperf_api.c send_parameters writes them (and get_parameters reads)."""

    __test__ = False  # pytest: a class named Test* that is not a test class

    protocol: str = "tcp"               # "tcp", "udp" or "sctp"
    duration: int = 10                  # "time", whole seconds; 0 = until `num`/`blockcount`
    omit: int = 0
    num_streams: int = 1                # "parallel"
    reverse: bool = False
    bidirectional: bool = False
    blksize: int = DEFAULT_TCP_BLKSIZE  # "len"
    bytes: int = 0                      # "num": end after this many bytes (0 = off)
    blocks: int = 0                     # "blockcount"
    bandwidth: int = 0                  # bits/s per stream (0 = unlimited)
    fqrate: int = 0
    window: int = 0                     # socket buffer size
    mss: int = 0
    nodelay: bool = False
    tos: int = 0
    congestion: Optional[str] = None
    get_server_output: bool = False
    udp_counters_64bit: bool = False
    client_version: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The parameter object a 3.12 client sends (keys it leaves out when zero are left out)."""
        out: dict[str, Any] = {self.protocol: True, "omit": self.omit, "time": self.duration,
                               "num": self.bytes, "blockcount": self.blocks, "parallel": self.num_streams}
        if self.reverse:
            out["reverse"] = True
        if self.bidirectional:
            out["bidirectional"] = True
        if self.window:
            out["window"] = self.window
        out["len"] = self.blksize
        if self.bandwidth:
            out["bandwidth"] = self.bandwidth
        if self.fqrate:
            out["fqrate"] = self.fqrate
        out["pacing_timer"] = 1000
        if self.mss:
            out["MSS"] = self.mss
        if self.nodelay:
            out["nodelay"] = True
        if self.tos:
            out["TOS"] = self.tos
        if self.congestion:
            out["congestion"] = self.congestion
        if self.get_server_output:
            out["get_server_output"] = 1
        if self.udp_counters_64bit:
            out["udp_counters_64bit"] = 1
        out["client_version"] = self.client_version or IPERF_PROTOCOL_VERSION
        return out


def parse_params(obj: dict[str, Any]) -> TestParams:
    """Validate a client's parameter object. Types and absurd values are ProtocolErrors; whether the
    responder's caps allow the test is decided elsewhere."""
    protos = [p for p in ("tcp", "udp", "sctp") if p in obj]
    protocol = protos[-1] if protos else "tcp"  # get_parameters lets the last of tcp/udp/sctp win
    default_len = DEFAULT_TCP_BLKSIZE if protocol != "udp" else DEFAULT_UDP_BLKSIZE
    congestion = obj.get("congestion")
    if congestion is not None and (not isinstance(congestion, str) or len(congestion) > 16):
        raise ProtocolError(f"parameter 'congestion' is not an algorithm name: {quote(congestion)}")
    version = obj.get("client_version")
    known = {"tcp", "udp", "sctp", "omit", "time", "num", "blockcount", "parallel", "reverse",
             "bidirectional", "len", "bandwidth", "fqrate", "window", "MSS", "nodelay", "TOS", "congestion",
             "get_server_output", "udp_counters_64bit", "client_version", "pacing_timer"}
    return TestParams(
        protocol=protocol,
        duration=json_int(obj, "time", 10, 0, 86400),
        omit=json_int(obj, "omit", 0, 0, 600),
        num_streams=json_int(obj, "parallel", 1, 1, 1 << 20),
        reverse="reverse" in obj,
        bidirectional="bidirectional" in obj,
        blksize=json_int(obj, "len", default_len, 0, 1 << 30),
        bytes=json_int(obj, "num"),
        blocks=json_int(obj, "blockcount"),
        bandwidth=json_int(obj, "bandwidth"),
        fqrate=json_int(obj, "fqrate"),
        window=json_int(obj, "window", 0, 0, 1 << 31),
        mss=json_int(obj, "MSS", 0, 0, 1 << 20),
        nodelay="nodelay" in obj,
        tos=json_int(obj, "TOS", 0, 0, 255),
        congestion=congestion,
        get_server_output="get_server_output" in obj,
        udp_counters_64bit="udp_counters_64bit" in obj,
        client_version=version[:32] if isinstance(version, str) else None,
        extra={k: v for k, v in obj.items() if k not in known},
    )
