"""Clients that load and abuse an HTTP endpoint on loopback: a burst of concurrent scrapes and slowloris
connections (a partial request head, held), with the times the server takes to answer or close them."""

from __future__ import annotations

import selectors
import socket
import threading
import time
import urllib.request


def scrape(port: int, timeout: float = 10.0) -> tuple[int, float]:
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        r.read()
        return r.status, time.monotonic() - t0


def concurrent_scrapes(port: int, n: int) -> list[tuple[int, float]]:
    results: list[tuple[int, float]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def one() -> None:
        try:
            barrier.wait(10)
            results.append(scrape(port, timeout=30))
        except BaseException as exc:  # counted below, with its message
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, f"{len(errors)} of {n} scrapes failed, e.g. {errors[0]!r}"
    return results


class Slowloris:
    """n connections, each sending a partial request head and holding it; a thread notes when the server
    closes each one (counted from that connection's own connect)."""

    def __init__(self, port: int, n: int) -> None:
        self.socks: list[socket.socket] = []
        self.opened: list[float] = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris/%d\r\n" % i)
            self.socks.append(s)
            self.opened.append(time.monotonic())
        self._closed: list[float] = []
        self._answered = 0
        self._watcher: threading.Thread | None = None

    def watch(self, limit: float) -> None:
        """Start noting closes, for at most `limit` seconds."""
        self._watcher = threading.Thread(target=self._watch, args=(limit,), daemon=True)
        self._watcher.start()

    def _watch(self, limit: float) -> None:
        sel = selectors.DefaultSelector()
        for i, s in enumerate(self.socks):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, i)
        deadline = time.monotonic() + limit
        while len(sel.get_map()) and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                now = time.monotonic()
                try:
                    data = key.fileobj.recv(1024)  # type: ignore[union-attr]
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                self._answered += bool(data)
                self._closed.append(now - self.opened[key.data])
                sel.unregister(key.fileobj)
        sel.close()

    def closed(self) -> list[float]:
        """Seconds each connection stayed open, for those the server closed (waits for the watch to end)."""
        assert self._watcher is not None, "call watch() first"
        self._watcher.join()
        assert self._answered == 0, "the server answered a request it never got"
        return list(self._closed)

    def close(self) -> None:
        for s in self.socks:
            s.close()
