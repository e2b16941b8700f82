#!/usr/bin/env python3
"""A bounded hostile-input run against `recall serve` (loopback only).

    python3 scripts/hostile_serve.py RECALL_BINARY MODEL_DIR [--requests N] [--seconds S]

Starts `recall serve --port 0` on the model (with a short header and body
timeout and a small --max-concurrent-requests, so the limits are exercised),
then, at the same time:
  - sends N malformed or hostile requests across every route: broken and
    deeply nested JSON, wrong types, NUL bytes, invalid UTF-8, huge numbers,
    FTS5 and SQL syntax in queries, wrong methods and content types, bodies
    shorter or longer than declared, bodies over the size limit;
  - keeps slow clients connected: headers sent a byte at a time, bodies
    trickled, connections opened and left silent;
  - asks /health every 20 ms and records how long each answer took;
then checks what a web page could send: another Host (DNS rebinding) is
refused, and so is a POST that is not JSON; no CORS preflight is granted;
and two connection attacks: idle connections that open a chunked body and
send nothing must not starve a POST beside them, and GETs with chunked bodies
are refused unread.
Then it checks and prints: the server never stopped (0 crashes), no answer
was a 5xx other than 503 with Retry-After, /health's p50/p99/max, the
server's peak RSS (VmHWM). Exits 1 when a check fails. Python standard
library only.
"""

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

ROUTES_POST = [
    "/v1/embeddings", "/embeddings", "/api/embed", "/api/embeddings",
    "/embed", "/embed_sparse", "/embed_all", "/search", "/index",
]
ROUTES_GET = ["/", "/health", "/info", "/metrics", "/api/tags", "/api/version"]
FIELDS = ["input", "inputs", "prompt", "query", "model", "truncate", "limit",
          "dimensions", "encoding_format", "half_life", "mmr", "min_score", "since"]


def hostile_values(rng):
    return [
        None, True, -1, 0, 2**63, -2**63, 1e308, "", "\u0000", "x\u0000y",
        "\" OR 1=1 --", "NEAR(a b) * : ^ \"", "'); DROP TABLE chunks; --",
        "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
        "a" * rng.randint(1, 5000), "数据库" * 100, [], [None], [[]], [[-1]],
        [2**40], ["a", 1], {"a": {"b": [1, 2, {}]}}, [""] * 3000,
        "2026-02-31", "nan", "-5 degrees", "--help", "\x1b[31mred",
    ]


def random_body(rng):
    kind = rng.randrange(10)
    if kind == 0:
        return b"{not json"
    if kind == 1:
        return b"[" * 10000 + b"]" * 10000  # deep nesting
    if kind == 2:
        return b"\xff\xfe\x00{\"input\": \"\xc3\x28\"}"  # invalid UTF-8
    if kind == 3:
        return json.dumps([1, 2, 3]).encode()
    values = hostile_values(rng)
    body = {}
    for _ in range(rng.randint(0, 4)):
        body[rng.choice(FIELDS)] = rng.choice(values)
    return json.dumps(body).encode()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = {}
        self.bad = []  # 5xx other than 503 with Retry-After
        self.errors = 0  # connection errors (no answer)

    def add(self, status, retry_after, what):
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status >= 500 and not (status == 503 and retry_after):
                self.bad.append(f"{status} for {what}")


def exchange(port, raw, timeout=30.0):
    """Sends raw bytes, returns (status, headers text) or (None, None)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(raw)
        except OSError:
            pass  # the server may answer (413) before reading everything
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    parts = head.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None, None
    return int(parts[1]), head.lower()


def request(method, path, body=b"", content_type="application/json", length=None):
    length = len(body) if length is None else length
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    if method != "GET" or body:
        head += f"Content-Length: {length}\r\n"
    return head.encode() + b"\r\n" + body


def malformed(port, rng, n, tally, max_body):
    for _ in range(n):
        kind = rng.randrange(8)
        path = rng.choice(ROUTES_POST + ROUTES_GET)
        if kind == 0:
            raw = request(rng.choice(["PUT", "DELETE", "PATCH", "GET", "POST"]), path, random_body(rng))
        elif kind == 1:
            body = random_body(rng)
            raw = request("POST", path, body, length=len(body) + rng.randint(-len(body), 50))
        elif kind == 2:
            raw = request("POST", path, random_body(rng), content_type=rng.choice([None, "text/plain", "a/b; x"]))
        elif kind == 3 and rng.random() < 0.05:
            raw = request("POST", path, b"{\"input\": \"" + b"a" * (max_body + 1000) + b"\"}")
        elif kind == 4:
            raw = b"GARBAGE / \x00\xff HTTP/9.9\r\n\r\n"
        else:
            raw = request("POST", rng.choice(ROUTES_POST), random_body(rng))
        try:
            status, head = exchange(port, raw, timeout=30)
        except OSError:
            with tally.lock:
                tally.errors += 1
            continue
        if status is not None:
            tally.add(status, "retry-after:" in head, f"{raw[:80]!r}")


def slow_clients(port, stop):
    """Slow headers, trickled bodies, silent connections, over and over."""
    def slow_headers():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                for b in b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X: " + b"y" * 500:
                    if stop.is_set():
                        return
                    s.send(bytes([b]))
                    time.sleep(0.05)
        except OSError:
            pass

    def trickle():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request("POST", "/v1/embeddings", b"", length=10000))
                for _ in range(200):
                    if stop.is_set():
                        return
                    s.send(b" ")
                    time.sleep(0.05)
        except OSError:
            pass

    def silent():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                stop.wait(5)
        except OSError:
            pass

    while not stop.is_set():
        threads = [threading.Thread(target=f) for f in (slow_headers, trickle, trickle, silent) * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def health_probe(port, stop, latencies, failures):
    while not stop.is_set():
        start = time.monotonic()
        try:
            status, _ = exchange(port, request("GET", "/health"), timeout=10)
        except OSError:
            status = None
        latencies.append(time.monotonic() - start)
        if status != 200:
            failures.append(status)
        time.sleep(0.02)


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def web_page_checks(port):
    """What a web page could send to a server without an API key: its own
    host name (DNS rebinding), a form or plain-text POST (no preflight
    needed), a preflight. Returns the checks that failed."""
    failed = []
    expect = [
        ("POST", "/search", "evil.example", "application/json", 403),
        ("GET", "/info", f"evil.example:{port}", None, 403),
        ("POST", "/index", f"127.0.0.1:{port}", "text/plain", 415),
        ("POST", "/v1/embeddings", f"localhost:{port}", "application/x-www-form-urlencoded", 415),
        ("POST", "/v1/embeddings", f"localhost:{port}", "application/json", 200),
    ]
    for method, path, host, content_type, want in expect:
        body = b'{"input": "x", "query": "x"}'
        raw = request(method, path, body, content_type=content_type).replace(b"Host: 127.0.0.1", b"Host: " + host.encode())
        status, _ = exchange(port, raw, timeout=30)
        if status != want:
            failed.append(f"{method} {path} Host {host} {content_type}: {status}, not {want}")
    status, head = exchange(port, request("OPTIONS", "/search", content_type=None).replace(
        b"\r\n\r\n", b"\r\nOrigin: http://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n", 1), timeout=30)
    if head and "access-control-allow-origin" in head:
        failed.append(f"a CORS preflight was granted ({status})")
    return failed


def connection_attacks(port):
    """Idle connections that open a chunked body (each once charged as the
    largest body) beside a real POST; GETs carrying chunked bodies (once read
    whole, counted as 1 KiB). Returns the checks that failed."""
    failed = []
    chunked = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    idle = []
    for _ in range(16):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(chunked)
        idle.append(s)
    time.sleep(0.2)
    status, _ = exchange(port, request("POST", "/v1/embeddings", b'{"input": "beside idle ones"}'), timeout=30)
    if status != 200:
        failed.append(f"a POST beside 16 idle chunked connections: {status}, not 200")
    for s in idle:
        s.close()
    for _ in range(40):
        raw = (b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
        status, _ = exchange(port, raw, timeout=30)
        if status != 400:
            failed.append(f"a GET with a chunked body: {status}, not 400")
            break
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=4, help="threads sending malformed requests")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    max_body = 1 << 20
    server = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--port", "0",
         "--max-concurrent-requests", "8", "--header-timeout", "1", "--body-timeout", "1",
         "--max-body-bytes", str(max_body), "--max-inflight-bytes", str(8 * max_body)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={k: v for k, v in os.environ.items() if k != "RECALL_API_KEY"},
    )
    line = server.stdout.readline().strip()
    if not line.startswith("listening on http://"):
        print(f"recall serve did not start: {line!r}")
        sys.exit(1)
    port = int(line.rsplit(":", 1)[1])
    tally, stop = Tally(), threading.Event()
    latencies, health_failures = [], []
    started = time.monotonic()
    background = [
        threading.Thread(target=slow_clients, args=(port, stop)),
        threading.Thread(target=health_probe, args=(port, stop, latencies, health_failures)),
    ]
    for t in background:
        t.start()
    per = args.requests // args.clients
    workers = [
        threading.Thread(target=malformed, args=(port, random.Random(args.seed + i), per, tally, max_body))
        for i in range(args.clients)
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    web_failed = web_page_checks(port) + connection_attacks(port)
    stop.set()
    for t in background:
        t.join()
    alive = server.poll() is None
    rss = peak_rss(server.pid) if alive else 0
    server.terminate()
    server.wait(timeout=30)
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")
    report = {
        "requests": per * args.clients,
        "seconds": round(time.monotonic() - started, 1),
        "crashes": 0 if alive else 1,
        "statuses": dict(sorted(tally.statuses.items())),
        "5xx_other_than_503_with_retry_after": len(tally.bad),
        "no_answer": tally.errors,
        "health_checks": len(latencies),
        "health_failures": len(health_failures),
        "health_ms_p50": round(pick(0.5), 1),
        "health_ms_p99": round(pick(0.99), 1),
        "health_ms_max": round(latencies[-1] * 1000, 1) if latencies else None,
        "peak_rss_mib": round(rss / 2**20, 1),
    }
    print(json.dumps(report, indent=1))
    failed = list(web_failed)
    if not alive:
        failed.append("the server stopped")
    if tally.bad:
        failed.append(f"{len(tally.bad)} answers were 5xx other than 503 with Retry-After: {tally.bad[:5]}")
    if health_failures:
        failed.append(f"/health failed {len(health_failures)} times: {health_failures[:5]}")
    if latencies and pick(0.99) > 1000:
        failed.append(f"/health p99 {pick(0.99):.0f} ms")
    if failed:
        print("FAILED: " + "; ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
