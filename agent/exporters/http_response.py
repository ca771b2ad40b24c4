"""The /metrics server's responses: status texts and the bytes of a response head and body."""

from __future__ import annotations

from dataclasses import dataclass

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           505: "HTTP Version Not Supported"}

@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def text_response(status: int, extra: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, f"{status} {REASONS[status].lower()}\n".encode(),
                    (("Content-Type", "text/plain; charset=utf-8"), *extra))


def serialize(resp: Response, head_only: bool, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in resp.headers]
    lines.append(f"Content-Length: {len(resp.body)}")
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body
