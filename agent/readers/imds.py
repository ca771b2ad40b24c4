"""IMDSv2 client (token, bounded retries, IPv6 endpoint) and pure parsers for identity and ENIs."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.parse
from typing import Callable, Mapping, NamedTuple, Optional

log = logging.getLogger(__name__)

# docs/ec2-network-facts.md, "Instance metadata": TTL 1..21600 s; 401 = invalid/expired token; 403 = disabled.
TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL = 21600
# A token is replaced this long before it expires (at most 10 % of its TTL), so a request never races
# the expiry; 60 s on the default 6 h TTL.
TOKEN_MARGIN = 60.0
# Backoff between attempts: 0.1 s, 0.2 s, 0.4 s ... capped; with the default 2 retries and 1 s timeouts a
# host without IMDS spends at most ~3.3 s on the token request, then gives up for the whole discovery.
BACKOFF_FIRST = 0.1
BACKOFF_CAP = 1.0
MAX_BODY = 1 << 20  # metadata values are small; a bigger answer is not IMDS

# Results counted per request, exported as burstwatch_imds_requests_total{request,result}.
RESULTS = ("ok", "not_found", "unauthorized", "forbidden", "timeout", "refused", "error")


class ImdsError(Exception):
    """IMDS answered in a way that gives no value (HTTP error, bad body)."""


class ImdsUnavailable(ImdsError):
    """Nothing usable answers at the endpoint (timeouts, refused, 5xx after the retries)."""


class ImdsUnanswered(ImdsUnavailable):
    """Every attempt connected but got no answer. For the token PUT on EC2 this is the response's IP hop
    limit: a container without host networking is one hop too far at the default limit of 1."""


# In the detail of every ImdsUnanswered, hence of the probe built on it.
NO_ANSWER = "connected, but no answer"


class _NoAnswer(socket.timeout):
    """The connection was made and the request sent; the answer did not come within the timeout."""


class ImdsForbidden(ImdsError):
    """HTTP 403: the instance has its metadata service turned off (http-endpoint disabled)."""


class ImdsNotFound(ImdsError):
    """HTTP 404: the path does not exist on this instance (e.g. an older instance lacks a key)."""


class ImdsProbe(NamedTuple):
    """What one reachability probe found; the checks' "IMDS reachable with IMDSv2" verdict is built on it."""

    reachable: bool
    imdsv2: bool
    detail: str

    @property
    def unanswered(self) -> bool:
        """The token request connected but no answer came back: the hop-limit signature (ImdsUnanswered).
        A property, not a field, so a probe still compares equal to its 3-tuple."""
        return not self.reachable and self.detail.startswith("PUT ") and NO_ANSWER in self.detail


class ImdsStats:
    """Request counters and health, shared with the metrics view (which only reads them)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}
        self.up: Optional[bool] = None          # last request's outcome; None before any request
        self.version: Optional[str] = None      # "v2" or "v1" once a read succeeded
        self._lock = threading.Lock()

    def count(self, request: str, result: str) -> None:
        with self._lock:
            self.requests[(request, result)] = self.requests.get((request, result), 0) + 1
            self.up = result in ("ok", "not_found")

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.requests)


class _Response(NamedTuple):
    status: int
    body: str


def _connect_ascii(address: tuple[str, int], timeout: Optional[float] = None,
                   source_address: Optional[tuple[str, int]] = None) -> socket.socket:
    host, port = address
    return socket.create_connection((host.encode("ascii", "strict") if host.isascii() else host, port),  # type: ignore[arg-type]
                                    timeout, source_address)


class ImdsClient:
    """Reads instance metadata the IMDSv2 way, quickly giving up where there is none.

    One token (PUT with a TTL) is reused until TOKEN_MARGIN before it expires and fetched again once when
    IMDS answers 401. Each request makes 1 + `retries` attempts with `timeout` for connect and for each
    read; after the token request has failed as unavailable, reads fail at once until `reset()`, so a
    discovery without IMDS costs one token request's attempts, not one per path."""

    def __init__(self, endpoint: str = "http://169.254.169.254", timeout: float = 1.0, retries: int = 2,
                 allow_imdsv1: bool = False, token_ttl: int = MAX_TOKEN_TTL,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"IMDS endpoint {endpoint!r} is not an http:// URL")
        self.endpoint = endpoint.rstrip("/")
        self.host = parts.hostname            # IPv6 literals come without brackets: fd00:ec2::254
        self.port = parts.port or 80
        self.timeout = timeout
        self.retries = max(0, retries)
        self.allow_imdsv1 = allow_imdsv1
        self.token_ttl = min(max(1, int(token_ttl)), MAX_TOKEN_TTL)
        self.clock = clock
        self.sleep = sleep
        self.stats = ImdsStats()
        self._lock = threading.Lock()
        self._token: Optional[str] = None
        self._token_expires = 0.0
        self._v1 = False                      # settled on IMDSv1 (only with allow_imdsv1)
        self._dead: Optional[ImdsError] = None

    # -- transport -------------------------------------------------------------------------------
    def _once(self, method: str, path: str, headers: Mapping[str, str]) -> _Response:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        # Resolve the host as bytes: getaddrinfo() runs a str host through the idna codec, which loads
        # stringprep and unicodedata (~0.35 MiB) into the daemon for an address that is always numeric.
        conn._create_connection = _connect_ascii  # type: ignore[attr-defined]
        try:
            conn.request(method, path, headers=dict(headers))
            try:
                resp = conn.getresponse()
            except socket.timeout as exc:
                raise _NoAnswer(str(exc)) from exc
            body = resp.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                raise ImdsError(f"{method} {path}: answer larger than {MAX_BODY} bytes")
            return _Response(resp.status, body.decode("utf-8", "replace"))
        finally:
            conn.close()

    def _request(self, method: str, path: str, headers: Mapping[str, str], kind: str) -> _Response:
        """One request with bounded retries; returns any HTTP answer below 500, raises ImdsUnavailable."""
        attempts = 1 + self.retries
        last = ""
        unanswered = 0
        for attempt in range(attempts):
            if attempt:
                self.sleep(min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (attempt - 1)))
            try:
                resp = self._once(method, path, headers)
            except socket.timeout as exc:
                self.stats.count(kind, "timeout")
                if isinstance(exc, _NoAnswer):
                    unanswered += 1
                    last = f"{NO_ANSWER}: timed out after {self.timeout:g}s"
                else:
                    last = f"timed out after {self.timeout:g}s"
                continue
            except ConnectionRefusedError:
                self.stats.count(kind, "refused")
                last = "connection refused"
                continue
            except (OSError, http.client.HTTPException) as exc:
                self.stats.count(kind, "error")
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status >= 500:
                self.stats.count(kind, "error")
                last = f"HTTP {resp.status}"
                continue
            self.stats.count(kind, {200: "ok", 401: "unauthorized", 403: "forbidden",
                                    404: "not_found"}.get(resp.status, "error"))
            return resp
        cls = ImdsUnanswered if unanswered == attempts else ImdsUnavailable
        raise cls(f"{method} {self.endpoint}{path}: {last} ({attempts} attempt(s))")

    # -- token -----------------------------------------------------------------------------------
    def _fetch_token(self) -> str:
        resp = self._request("PUT", TOKEN_PATH, {TTL_HEADER: str(self.token_ttl)}, "token")
        if resp.status == 200 and resp.body.strip():
            return resp.body.strip()
        if resp.status == 403:
            raise ImdsForbidden(f"{self.endpoint}: IMDS is disabled on this instance (HTTP 403)")
        raise ImdsError(f"PUT {self.endpoint}{TOKEN_PATH}: HTTP {resp.status}")

    def _token_header(self, force: bool = False) -> dict[str, str]:
        """The token header, fetching a token when there is none or it is about to expire."""
        with self._lock:
            if self._dead is not None:
                raise self._dead
            if self._v1:
                return {}
            now = self.clock()
            if force or self._token is None or now >= self._token_expires:
                try:
                    token = self._fetch_token()
                except ImdsForbidden as exc:
                    self._dead = exc
                    raise
                except ImdsError as exc:
                    if self.allow_imdsv1 and self._v1_works():
                        log.warning("IMDSv2 token unavailable (%s); using IMDSv1 as imds.allow_imdsv1 "
                                    "allows", exc)
                        self._v1 = True
                        return {}
                    if isinstance(exc, ImdsUnavailable):
                        self._dead = exc
                    raise
                margin = min(TOKEN_MARGIN, self.token_ttl * 0.1)
                self._token, self._token_expires = token, now + self.token_ttl - margin
            assert self._token is not None
            return {TOKEN_HEADER: self._token}

    def _v1_works(self) -> bool:
        try:
            return self._request("GET", "/latest/meta-data/", {}, "metadata").status == 200
        except ImdsError:
            return False

    def reset(self) -> None:
        """Forget the token and any earlier "unavailable" verdict (e.g. before a periodic re-probe)."""
        with self._lock:
            self._token, self._token_expires, self._dead, self._v1 = None, 0.0, None, False

    # -- reads -----------------------------------------------------------------------------------
    def get(self, path: str) -> str:
        """The text at /latest/<path> (e.g. "meta-data/instance-id").

        Raises ImdsNotFound (404), ImdsForbidden (403), ImdsUnavailable (nothing answers) or ImdsError."""
        url_path = "/latest/" + path.lstrip("/")
        resp = self._request("GET", url_path, self._token_header(), "metadata")
        if resp.status == 401 and not self._v1:
            # The token expired or IMDS restarted: fetch a new one, once.
            resp = self._request("GET", url_path, self._token_header(force=True), "metadata")
        if resp.status == 200:
            self.stats.version = "v1" if self._v1 else "v2"
            return resp.body
        if resp.status == 404:
            raise ImdsNotFound(f"{url_path}: not found")
        if resp.status == 403:
            raise ImdsForbidden(f"{url_path}: HTTP 403 (IMDS disabled)")
        raise ImdsError(f"GET {self.endpoint}{url_path}: HTTP {resp.status}")

    def _known_probe(self) -> Optional[ImdsProbe]:
        """The verdict this client already reached (IMDSv2 reads worked, or IMDS did not answer or is
        disabled), or None when it has to ask."""
        with self._lock:
            dead, v1 = self._dead, self._v1
        if isinstance(dead, ImdsUnavailable):
            return ImdsProbe(False, False, f"{dead} (inside a container, the instance's "
                                           "http-put-response-hop-limit may be 1)")
        if isinstance(dead, ImdsForbidden):
            return ImdsProbe(True, False, "IMDS is disabled on this instance (HTTP 403)")
        if self.stats.version == "v2" and not v1:
            return ImdsProbe(True, True, f"IMDSv2 at {self.endpoint} (token reads succeeded)")
        return None

    def probe(self, reuse: bool = False) -> ImdsProbe:
        """Is IMDS reachable, and with IMDSv2? Never raises; does not use or change the cached token.

        With `reuse`, a verdict this client already reached (IMDSv2 reads worked, or IMDS did not answer
        or is disabled) is returned without asking again, so a one-shot command that ran discovery first
        does not pay the timeouts twice."""
        known = self._known_probe() if reuse else None
        if known is not None:
            return known
        try:
            resp = self._request("PUT", TOKEN_PATH, {TTL_HEADER: "60"}, "token")
        except ImdsUnavailable as exc:
            return ImdsProbe(False, False, f"{exc} (inside a container, the instance's "
                                           "http-put-response-hop-limit may be 1)")
        if resp.status == 403:
            return ImdsProbe(True, False, "IMDS is disabled on this instance (HTTP 403)")
        if resp.status != 200 or not resp.body.strip():
            return ImdsProbe(True, False, f"token request answered HTTP {resp.status}")
        try:
            got = self._request("GET", "/latest/meta-data/instance-id", {TOKEN_HEADER: resp.body.strip()},
                                "metadata")
        except ImdsUnavailable as exc:
            return ImdsProbe(False, False, f"token issued but metadata read failed: {exc}")
        if got.status != 200:
            return ImdsProbe(True, False, f"token issued but instance-id read answered HTTP {got.status}")
        return ImdsProbe(True, True, f"IMDSv2 at {self.endpoint}: instance {got.body.strip()}")


# -- pure parsing --------------------------------------------------------------------------------

IDENTITY_PATHS = {
    "instance_id": "meta-data/instance-id",
    "instance_type": "meta-data/instance-type",
    "region": "meta-data/placement/region",
    "availability_zone": "meta-data/placement/availability-zone",
    "availability_zone_id": "meta-data/placement/availability-zone-id",
}
MACS_PATH = "meta-data/network/interfaces/macs/"
ENI_KEYS = ("device-number", "network-card-index", "interface-id", "subnet-id", "vpc-id",
            "vpc-ipv4-cidr-block", "vpc-ipv4-cidr-blocks", "local-ipv4s")


class Identity(NamedTuple):
    instance_id: str
    instance_type: str
    region: Optional[str]
    availability_zone: Optional[str]
    availability_zone_id: Optional[str]


class Eni(NamedTuple):
    """One attached elastic network interface as IMDS describes it."""

    mac: str
    device_number: Optional[int]
    network_card_index: int
    interface_id: Optional[str]
    subnet_id: Optional[str]
    vpc_id: Optional[str]
    vpc_ipv4_cidr_blocks: tuple[str, ...]
    local_ipv4s: tuple[str, ...]


def parse_listing(text: str) -> list[str]:
    """A metadata directory listing: one entry per line, sub-directories end in '/'."""
    return [line.strip().rstrip("/") for line in text.splitlines() if line.strip()]


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _opt(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    return text.strip() or None


def parse_identity(values: Mapping[str, str]) -> Identity:
    """Identity from raw values keyed by IDENTITY_PATHS' paths; instance-id and type are required."""
    iid = _opt(values.get(IDENTITY_PATHS["instance_id"]))
    itype = _opt(values.get(IDENTITY_PATHS["instance_type"]))
    if not iid or not itype:
        raise ValueError("IMDS gave no instance-id or instance-type")
    az = _opt(values.get(IDENTITY_PATHS["availability_zone"]))
    region = _opt(values.get(IDENTITY_PATHS["region"]))
    if region is None and az:
        region = az[:-1]  # placement/region is newer than the AZ; an AZ is its region plus one letter
    return Identity(iid, itype, region, az, _opt(values.get(IDENTITY_PATHS["availability_zone_id"])))


def parse_eni(mac: str, values: Mapping[str, str]) -> Eni:
    """One ENI from its raw values keyed by ENI_KEYS (missing keys absent from the mapping)."""
    blocks = values.get("vpc-ipv4-cidr-blocks") or values.get("vpc-ipv4-cidr-block") or ""
    return Eni(
        mac=mac.strip().lower(),
        device_number=_int(values.get("device-number")),
        # network-card-index appears only on instances that have several cards: absent means card 0.
        network_card_index=_int(values.get("network-card-index")) or 0,
        interface_id=_opt(values.get("interface-id")),
        subnet_id=_opt(values.get("subnet-id")),
        vpc_id=_opt(values.get("vpc-id")),
        vpc_ipv4_cidr_blocks=tuple(parse_listing(blocks)),
        local_ipv4s=tuple(parse_listing(values.get("local-ipv4s") or "")),
    )


def sort_enis(enis: list[Eni]) -> list[Eni]:
    """Card first, then device number: the primary ENI (card 0, device 0) comes first."""
    return sorted(enis, key=lambda e: (e.network_card_index,
                                       e.device_number if e.device_number is not None else 1 << 30, e.mac))


# -- reading (raw values; parsing stays in the functions above) ----------------------------------

def read_identity(client: ImdsClient) -> dict[str, str]:
    """Raw identity values; instance-id errors propagate (they decide whether IMDS is there)."""
    out = {IDENTITY_PATHS["instance_id"]: client.get(IDENTITY_PATHS["instance_id"])}
    for key, path in IDENTITY_PATHS.items():
        if key == "instance_id":
            continue
        try:
            out[path] = client.get(path)
        except ImdsNotFound:
            log.debug("IMDS has no %s", path)
    return out


def read_enis(client: ImdsClient) -> dict[str, dict[str, str]]:
    """mac -> {key: raw text} for every ENI under network/interfaces/macs/; absent keys are left out."""
    out: dict[str, dict[str, str]] = {}
    for mac in parse_listing(client.get(MACS_PATH)):
        values: dict[str, str] = {}
        for key in ENI_KEYS:
            try:
                values[key] = client.get(f"{MACS_PATH}{mac}/{key}")
            except ImdsNotFound:
                continue
        out[mac] = values
    return out
