#!/usr/bin/env python3
"""Memory held by idle client connections: nginx and vigil side by side.

Starts the three backends and the proxy conf of compare.py (nginx with
`worker_connections` raised to fit), then for each target in turn: opens
N keep-alive client connections, sends one `GET /` on each and reads the
answer, leaves them all open and idle, and reads the proxy's RSS (every
process of it: nginx's master and worker) before and after. Memory does not
depend on how busy the machine is, so unlike CPU figures this one is exact
on a shared machine.

    python3 benches/load/idle.py [--connections 10000] [--targets nginx,vigil:1,vigil:2] [--rounds 2]

Needs nginx and a release build (`cargo build --release -p vigil`). Only
127.0.0.1 is used. The client needs N file descriptors (`ulimit -n`).
"""

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (the backends, the proxy conf, start/stop, rss_kb)

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def open_idle(n, port):
    """n connections that each carried one request and now sit idle."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(REQUEST)
        got = b""
        # "ok\n" with its head; the answer is small and ends the read.
        while not (b"\r\n\r\n" in got and got.endswith(b"ok\n")):
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError(f"connection {i} closed by the proxy before its answer")
            got += chunk
        if not got.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"connection {i}: {got[:40]!r}")
        socks.append(s)
    return socks


def measure(target, d, n):
    p = compare.start_proxy(target, d, "none")
    try:
        time.sleep(0.5)
        before = compare.rss_kb(p.pid)
        socks = open_idle(n, compare.PROXY_PORT)
        time.sleep(1.0)  # let the proxy settle (buffers returned, timers armed)
        after = compare.rss_kb(p.pid)
        for s in socks:
            s.close()
    finally:
        compare.stop(p)
    return before, after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--targets", default="nginx,vigil:1,vigil:2")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.connections + 100
    if soft < need:
        if hard < need:
            sys.exit(f"need {need} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

    with tempfile.TemporaryDirectory() as d:
        backends = compare.start_backends(d, "none")
        # nginx needs room for every client connection plus the upstream ones.
        path = os.path.join(d, "proxy.conf")
        conf = open(path).read().replace("worker_connections 4096;", f"worker_connections {need + 200};")
        conf = conf.replace("worker_processes 1;", f"worker_processes 1; worker_rlimit_nofile {need + 400};")
        open(path, "w").write(conf)
        rows = {t: [] for t in a.targets.split(",")}
        try:
            for r in range(a.rounds):
                for t in rows:
                    before, after = measure(t, d, a.connections)
                    rows[t].append((before, after))
                    print(f"round {r + 1} {t}: {before / 1024:.1f} MiB idle, {after / 1024:.1f} MiB with "
                          f"{a.connections} idle connections", file=sys.stderr)
        finally:
            compare.stop_backends(backends)

    base = statistics.median(a2 - b for b, a2 in rows.get("nginx", [(0, 1)]))
    print(f"\n{a.connections} idle keep-alive client connections, medians of {a.rounds} rounds")
    print("| target | RSS at start MiB | RSS with the connections MiB | per connection KiB | ÷ nginx |")
    print("|---|---|---|---|---|")
    for t, v in rows.items():
        b = statistics.median(x for x, _ in v)
        w = statistics.median(y for _, y in v)
        per = statistics.median((y - x) for x, y in v) / a.connections
        ratio = statistics.median((y - x) for x, y in v) / base if base else float("nan")
        print(f"| {t} | {b / 1024:.1f} | {w / 1024:.1f} | {per:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
