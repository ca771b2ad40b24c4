"""The zoo's traffic endpoints as processes of their own: `python -m tests.support.zoo_traffic sink IP PORT`
and `... send IP PORT`, each run in its namespace (`ip netns exec`).

Processes, not threads of the test: a thread shares the test's interpreter lock with its metric poller and
byte-counter traces, and on a loaded machine a sender that is not scheduled leaves holes in a burst. The
sender reads one demand per line on stdin (JSON: {"demand": "OnOff", "args": {"on": 0.6, "off": 0.4}}),
switches to it at once and answers with the wall time it started at.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from tests.support.credit_zoo import DEMANDS, SEND_QUANTUM, WIRE_OVERHEAD, Demand, Idle


def sink(ip: str, port: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip, port))
    srv.listen(4)
    print("ready", flush=True)
    buf = bytearray(1 << 20)
    while True:
        conn, _ = srv.accept()
        with conn:
            while True:
                try:
                    if conn.recv_into(buf) == 0:
                        break
                except OSError:
                    break


class Pump:
    """Follows the current demand on one connection (see credit_zoo.Sender for the pacing rules)."""

    def __init__(self, ip: str, port: int) -> None:
        self.ip, self.port = ip, port
        self.lock = threading.Lock()
        self.demand: Demand = Idle()
        self.t0 = time.time()
        self.sent = 0.0

    def set(self, demand: Demand) -> float:
        with self.lock:
            self.demand, self.t0, self.sent = demand, time.time(), 0.0
            return self.t0

    def run(self) -> None:
        payload = memoryview(b"\0" * (1 << 18))
        while True:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 18)
            try:
                sock.settimeout(5)
                sock.connect((self.ip, self.port))
                sock.settimeout(0.02)
                self.pump(sock, payload)
            except OSError:
                time.sleep(0.1)
            finally:
                sock.close()

    def pump(self, sock: socket.socket, payload: memoryview) -> None:
        while True:
            with self.lock:
                demand, t0, sent_so_far = self.demand, self.t0, self.sent
            t = time.time() - t0
            if demand.full(t):
                n = len(payload)
            else:
                due = demand.cumulative(t) / WIRE_OVERHEAD - sent_so_far
                if due < min(SEND_QUANTUM, demand.cumulative(t + 0.002) / WIRE_OVERHEAD - sent_so_far):
                    time.sleep(0.002)
                    continue
                n = int(min(due, len(payload)))
            try:
                sent = sock.send(payload[:n])
            except socket.timeout:
                continue
            with self.lock:
                if self.demand is demand:
                    self.sent += sent


def send(ip: str, port: int) -> None:
    pump = Pump(ip, port)
    threading.Thread(target=pump.run, daemon=True).start()
    for line in sys.stdin:
        msg = json.loads(line)
        demand = DEMANDS[msg["demand"]](**msg.get("args", {}))
        print(f"{pump.set(demand):.6f}", flush=True)


def main() -> None:
    mode, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    (sink if mode == "sink" else send)(ip, port)


if __name__ == "__main__":
    main()
