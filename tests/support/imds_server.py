"""A real IMDSv2 HTTP server on loopback for tests: tokens with TTLs, 401/403, slow and dead modes.

    with ImdsServer(metadata_tree(instance_type="c5.4xlarge")) as imds:
        client = ImdsClient(imds.url, timeout=0.5)
        imds.disabled = True          # knobs may change while it runs
        imds.expire_tokens()

Behaviour follows AWS's IMDS (docs/ec2-network-facts.md, "Instance metadata"): PUT /latest/api/token needs
X-aws-ec2-metadata-token-ttl-seconds in 1..21600 (else 400); reads need a live token when
`require_token` (http-tokens=required; else 401); 403 everywhere when `disabled`; directory paths list
their entries one per line, sub-directories with a trailing '/'; `hop_limit` sets the token answer's IP hop
limit (http-put-response-hop-limit), for a lab with a router between client and server.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, NamedTuple, Optional, Sequence

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


@dataclass
class FakeEni:
    """One ENI as the test wants IMDS to describe it; None leaves a key out (as older instances do)."""

    mac: str
    device_number: int = 0
    network_card_index: Optional[int] = 0
    interface_id: str = "eni-0a1b2c3d4e5f60001"
    subnet_id: str = "subnet-0123456789abcdef0"
    vpc_id: str = "vpc-0123456789abcdef0"
    vpc_cidrs: Sequence[str] = ("10.0.0.0/16",)
    local_ipv4s: Sequence[str] = ("10.0.1.23",)


def metadata_tree(instance_id: str = "i-0123456789abcdef0", instance_type: str = "m5.large",
                  region: Optional[str] = "us-east-1", availability_zone: str = "us-east-1a",
                  availability_zone_id: Optional[str] = "use1-az4",
                  enis: Sequence[FakeEni] = (FakeEni("0a:1b:2c:3d:4e:01"),)) -> dict[str, str]:
    """The /latest/ tree of an instance, path -> text (directories are derived from the paths)."""
    tree = {
        "meta-data/instance-id": instance_id,
        "meta-data/instance-type": instance_type,
        "meta-data/placement/availability-zone": availability_zone,
        "meta-data/ami-id": "ami-0123456789abcdef0",
        "meta-data/hostname": "ip-10-0-1-23.ec2.internal",
    }
    if region is not None:
        tree["meta-data/placement/region"] = region
    if availability_zone_id is not None:
        tree["meta-data/placement/availability-zone-id"] = availability_zone_id
    if enis:
        tree["meta-data/mac"] = enis[0].mac
    for e in enis:
        base = f"meta-data/network/interfaces/macs/{e.mac}/"
        tree[base + "mac"] = e.mac
        tree[base + "device-number"] = str(e.device_number)
        if e.network_card_index is not None:
            tree[base + "network-card-index"] = str(e.network_card_index)
        tree[base + "interface-id"] = e.interface_id
        tree[base + "subnet-id"] = e.subnet_id
        tree[base + "vpc-id"] = e.vpc_id
        if e.vpc_cidrs:
            tree[base + "vpc-ipv4-cidr-block"] = e.vpc_cidrs[0]
            tree[base + "vpc-ipv4-cidr-blocks"] = "\n".join(e.vpc_cidrs)
        tree[base + "local-ipv4s"] = "\n".join(e.local_ipv4s)
    return tree


class Request(NamedTuple):
    method: str
    path: str
    status: int          # 0 when the server never answered (hang)
    had_token: bool


class FakeClock:
    """A clock tests move by hand (for token TTLs), shared by the server and a client."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


@dataclass
class ImdsServer:
    """IMDSv2 on 127.0.0.1 (or ::1) in a thread; a context manager with `url` and knobs."""

    tree: dict[str, str] = field(default_factory=metadata_tree)
    host: str = "127.0.0.1"
    clock: Callable[[], float] = time.monotonic
    require_token: bool = True       # http-tokens=required; False also answers token-less (IMDSv1) GETs
    disabled: bool = False           # http-endpoint=disabled: 403 to everything
    delay: float = 0.0               # seconds before each answer (a slow IMDS)
    hang: bool = False               # accept connections, never answer (a dead IMDS)
    token_hang: bool = False         # never answer the token PUT (hop limit 1 seen from a container)
    fail_next: int = 0               # answer the next N requests with HTTP 500
    reject_tokens: bool = False      # answer 401 to every read, however fresh its token
    # IP hop limit of the token PUT's answer (IP_TTL / IPV6_UNICAST_HOPS on the accepted socket), as EC2's
    # http-put-response-hop-limit: with 1, a client behind a router gets the handshake but never the token.
    hop_limit: Optional[int] = None

    def __post_init__(self) -> None:
        self.requests: list[Request] = []
        self.tokens: dict[str, float] = {}    # token -> expiry on self.clock
        self.token_ttls: list[int] = []       # TTL asked for by each successful PUT
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> ImdsServer:
        cls = _Server6 if ":" in self.host else _Server
        self._httpd = cls((self.host, 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="imds-test-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ImdsServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- test helpers ----------------------------------------------------------------------------
    def expire_tokens(self) -> None:
        """Invalidate every token issued so far (as a restarted IMDS would)."""
        with self._lock:
            self.tokens.clear()

    @property
    def token_puts(self) -> int:
        return sum(1 for r in self.requests if r.method == "PUT" and r.status == 200)

    def count(self, method: str, path: Optional[str] = None, status: Optional[int] = None) -> int:
        return sum(1 for r in self.requests if r.method == method and (path is None or r.path == path)
                   and (status is None or r.status == status))

    # -- behaviour -------------------------------------------------------------------------------
    def _lookup(self, path: str) -> Optional[str]:
        rel = path[len("/latest/"):] if path.startswith("/latest/") else None
        if rel is None:
            return None
        if rel in self.tree and not rel.endswith("/"):
            return self.tree[rel]
        prefix = rel if rel.endswith("/") or rel == "" else rel + "/"
        entries = []
        for key in self.tree:
            if key.startswith(prefix):
                head, sep, _ = key[len(prefix):].partition("/")
                entry = head + ("/" if sep else "")
                if entry not in entries:
                    entries.append(entry)
        return "\n".join(entries) if entries else None

    def _answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        if self.fail_next > 0:
            self.fail_next -= 1
            return 500, "Internal Server Error"
        if self.disabled:
            return 403, "Forbidden"
        now = self.clock()
        if method == "PUT":
            if path != "/latest/api/token":
                return 405, "Method Not Allowed"
            ttl_text = headers.get(TTL_HEADER.lower(), "")
            if not ttl_text.isdigit() or not 1 <= int(ttl_text) <= 21600:
                return 400, "Bad Request"
            token = secrets.token_urlsafe(40)
            with self._lock:
                self.tokens[token] = now + int(ttl_text)
                self.token_ttls.append(int(ttl_text))
            return 200, token
        presented = headers.get(TOKEN_HEADER.lower())
        if presented is not None or self.require_token:
            with self._lock:
                expires = self.tokens.get(presented or "")
            if expires is None or now >= expires or self.reject_tokens:
                return 401, "Unauthorized"
        body = self._lookup(path)
        return (200, body) if body is not None else (404, "Not Found")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"   # IMDS closes after each answer; so do we

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _serve(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                method, path = self.command, self.path.split("?", 1)[0]
                # Logged on arrival (status 0 = not answered yet), so a client that times out still shows.
                with srv._lock:
                    slot = len(srv.requests)
                    srv.requests.append(Request(method, path, 0, TOKEN_HEADER.lower() in headers))
                if srv.hang or (srv.token_hang and method == "PUT"):
                    srv._stop.wait(60)
                    return
                if srv.delay:
                    srv._stop.wait(srv.delay)
                status, body = srv._answer(method, path, headers)
                with srv._lock:
                    srv.requests[slot] = srv.requests[slot]._replace(status=status)
                data = body.encode()
                if srv.hop_limit is not None and method == "PUT":
                    # Set just before the answer is written, so only the token response carries it.
                    v6 = self.connection.family == socket.AF_INET6
                    self.connection.setsockopt(socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP,
                                               socket.IPV6_UNICAST_HOPS if v6 else socket.IP_TTL, srv.hop_limit)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timed out) first

            do_GET = _serve
            do_PUT = _serve

        return Handler
