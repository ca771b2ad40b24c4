"""The /metrics server's requests: the limits a client is held to and the parsing of a request head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Union

from agent.exporters.http_response import Response, text_response

MAX_HEADER_LINES = 100


@dataclass(frozen=True)
class Limits:
    """What one client, or many, may hold. Every figure is documented in docs/security.md."""

    header_timeout: float = 10.0     # accept (or the end of the last response) to a complete request head
    max_connections: int = 256       # open connections; the oldest one still waiting for a request goes first
    workers: int = 2                 # threads that render and check passwords; the event loop does the rest
    backlog: int = 512               # listen(2) queue (the kernel caps it at net.core.somaxconn)
    max_header_bytes: int = 8192     # request line plus headers
    write_timeout: float = 10.0      # a response must drain to the client within this


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: Mapping[str, str]       # lower-case names; repeated headers joined with ", "
    peer: str


# A handler answers a request. With may_block False (the event loop's thread) it may return None to say
# "this needs work that can block: ask me again from a worker" (rendering, a bcrypt check).
Handler = Callable[[Request, bool], Optional[Response]]
# An authenticator gets the Authorization header: True (let in), False (401) or None (needs a worker).
Authenticator = Callable[[Optional[str], bool], Optional[bool]]


def parse_request(head: bytes, peer: str) -> Union[Request, Response]:
    """A request head (without the blank line) as a Request, or the error Response to send and close."""
    lines = head.decode("latin-1").split("\n")
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    if len(lines) > MAX_HEADER_LINES + 1:
        return text_response(431)
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha():
        return text_response(400)
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        return text_response(505 if version.startswith("HTTP/") else 400)
    if method not in ("GET", "HEAD"):
        return text_response(405, (("Allow", "GET, HEAD"),))
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        # obs-fold continuation lines and names with spaces are a classic smuggling vector (RFC 9112 5.1-5.2)
        if not sep or not name or name != name.strip(" \t") or " " in name or "\t" in name:
            return text_response(400)
        key, value = name.lower(), value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    # GET and HEAD carry no body; refusing one keeps request boundaries unambiguous on kept-alive connections.
    if "transfer-encoding" in headers or headers.get("content-length", "0").strip() != "0":
        return text_response(400)
    if target.startswith(("http://", "https://")):          # absolute-form (RFC 9112 3.2.2)
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    if not target.startswith("/"):
        return text_response(400)
    path, _, query = target.partition("?")
    return Request(method, path, query, version, headers, peer)
