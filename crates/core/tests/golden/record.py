#!/usr/bin/env python3
"""Record golden balancer decisions from a real nginx (1.22.x).

Run from the repo root:

    python3 crates/core/tests/golden/record.py [--out DIR] [--nginx PATH]

Starts tiny HTTP backends on 127.0.0.1 (ephemeral ports, one thread each),
renders an nginx.conf into a temp dir, starts nginx in the foreground
(`nginx -c CONF -p TMP -e TMP/error.log -g 'daemon off;'`), sends sequential
requests (one connection each, `Connection: close`), stops everything and
writes the JSON golden files into DIR (default: this script's folder).

Standard library only (Python 3.11).
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import random
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOOPBACK = "127.0.0.1"
N_KEYS = 500
N_IPS = 300


# --------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802 (http.server API)
        body = self.server.label.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.server.hits += 1

    def log_message(self, fmt, *args):  # keep quiet
        pass


class Backend:
    """One HTTP backend answering 200 with its label as the body."""

    def __init__(self, label: str):
        self.label = label
        self.httpd = http.server.ThreadingHTTPServer((LOOPBACK, 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.label = label
        self.httpd.hits = 0
        self.port = self.httpd.server_address[1]
        # The exact text of the `server` directive's address argument.
        self.server = f"{LOOPBACK}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       name=f"backend-{label}", daemon=True)
        self.thread.start()

    @property
    def hits(self) -> int:
        return self.httpd.hits

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------
# upstream model
# --------------------------------------------------------------------------


class Upstream:
    def __init__(self, name, directive, backends, weights, down=None):
        self.name = name
        self.directive = directive  # e.g. "hash $arg_k consistent;" or None
        self.backends = backends
        self.weights = list(weights)
        self.down = list(down) if down else [False] * len(backends)
        assert len(self.backends) == len(self.weights) == len(self.down)

    def server_lines(self):
        out = []
        for b, w, d in zip(self.backends, self.weights, self.down):
            out.append(f"server {b.server} weight={w}{' down' if d else ''};")
        return out

    def conf(self) -> str:
        lines = [f"upstream {self.name} {{"]
        if self.directive:
            lines.append(f"    {self.directive}")
        lines += [f"    {s}" for s in self.server_lines()]
        lines.append("}")
        return "\n".join(lines)

    def servers_json(self):
        return [
            {"label": b.label, "server": b.server, "weight": w, "down": d,
             "conf_line": line}
            for b, w, d, line in zip(self.backends, self.weights, self.down,
                                     self.server_lines())
        ]

    def label_of_addr(self, addr: str):
        for b in self.backends:
            if b.server == addr:
                return b.label
        return None


def labels(n):
    return list(string.ascii_uppercase[:n])


# --------------------------------------------------------------------------
# nginx
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def render_conf(tmp, port, upstreams) -> str:
    ups = "\n\n".join(u.conf() for u in upstreams)
    locs = "\n".join(
        f"        location /{u.name}/ {{ proxy_pass http://{u.name}; }}"
        for u in upstreams)
    return f"""\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;

events {{
    worker_connections 256;
}}

http {{
    access_log off;
    client_body_temp_path {tmp}/client_body_temp;
    proxy_temp_path {tmp}/proxy_temp;
    fastcgi_temp_path {tmp}/fastcgi_temp;
    uwsgi_temp_path {tmp}/uwsgi_temp;
    scgi_temp_path {tmp}/scgi_temp;

    # A failing backend must show up as an error, never be masked by a retry
    # on another server.
    proxy_next_upstream off;
    proxy_connect_timeout 5s;
    proxy_read_timeout 10s;

{ups}

    server {{
        listen {LOOPBACK}:{port};
        add_header X-Upstream-Addr $upstream_addr always;
{locs}
    }}
}}
"""


class Nginx:
    def __init__(self, binary, tmp, conf_text, port):
        self.binary = binary
        self.tmp = tmp
        self.port = port
        self.conf = os.path.join(tmp, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf_text)
        self.err = os.path.join(tmp, "error.log")
        self.proc = None

    def start(self):
        base = [self.binary, "-c", self.conf, "-p", self.tmp + "/",
                "-e", self.err]
        t = subprocess.run(base + ["-t", "-q"], capture_output=True, text=True)
        if t.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{t.stdout}{t.stderr}")
        self.proc = subprocess.Popen(base + ["-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.tmp, "stderr.log"), "w"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited early:\n" + self.log_tail())
            try:
                socket.create_connection((LOOPBACK, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening:\n" + self.log_tail())

    def log_tail(self):
        out = []
        for p in (self.err, os.path.join(self.tmp, "stderr.log")):
            if os.path.exists(p):
                with open(p) as f:
                    out.append(f.read()[-4000:])
        return "\n".join(out)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def version(self):
        r = subprocess.run([self.binary, "-v"], capture_output=True, text=True)
        v = (r.stderr or r.stdout).strip().split(":", 1)[-1].strip()
        return v.removeprefix("nginx/")  # e.g. "1.22.1"


# --------------------------------------------------------------------------
# client
# --------------------------------------------------------------------------


class Recorder:
    def __init__(self, port):
        self.port = port
        self.count = 0

    def get(self, up: Upstream, query: str = "", source_ip: str = LOOPBACK):
        """One sequential request; returns the label that answered."""
        path = f"/{up.name}/" + (f"?{query}" if query else "")
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=15,
                                          source_address=(source_ip, 0))
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            resp = conn.getresponse()
            body = resp.read().decode()
            addr = resp.getheader("X-Upstream-Addr")
            peer_ip = conn.sock.getsockname()[0] if conn.sock else source_ip
        finally:
            conn.close()
        self.count += 1
        if resp.status != 200:
            raise RuntimeError(f"{path} from {source_ip}: HTTP {resp.status} "
                               f"(upstream {addr}) body={body!r}")
        if peer_ip != source_ip:
            raise RuntimeError(f"client bound to {peer_ip}, wanted {source_ip}")
        valid = {b.label for b, d in zip(up.backends, up.down) if not d}
        if body not in valid:
            raise RuntimeError(f"{path}: unexpected body {body!r} "
                               f"(valid {sorted(valid)})")
        if up.label_of_addr(addr) != body:
            raise RuntimeError(f"{path}: body {body!r} but upstream_addr {addr}")
        return body


# --------------------------------------------------------------------------
# test inputs
# --------------------------------------------------------------------------


def ip_list(n=N_IPS):
    """Deterministic client addresses in 127/8, several sharing a /24."""
    fixed = ["127.0.0.1", "127.1.2.3", "127.200.17.9", "127.0.0.2",
             "127.0.0.254", "127.1.2.4", "127.1.2.200", "127.200.17.1",
             "127.255.255.254", "127.255.0.1", "127.0.255.1", "127.1.1.1",
             "127.2.1.1", "127.1.2.1", "127.3.2.1", "127.128.128.128"]
    rng = random.Random(20240601)
    out, seen = [], set()

    def add(ip):
        if ip not in seen:
            seen.add(ip)
            out.append(ip)

    for ip in fixed:
        add(ip)
    while len(out) < n:
        b, c = rng.randrange(256), rng.randrange(256)
        for _ in range(rng.choice((1, 1, 2, 3, 4))):  # 1..4 hosts per /24
            if len(out) < n:
                add(f"127.{b}.{c}.{rng.randrange(1, 255)}")
    head, tail = out[:len(fixed)], out[len(fixed):]
    rng.shuffle(tail)  # interleave addresses that share a /24
    return head + tail


SWRR_WEIGHTS = [[5, 1, 1], [1, 1, 1], [3, 2, 1], [2, 3, 5, 1], [10, 1],
                [4, 4, 1, 2, 3]]


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=HERE, help="output folder (default: %(default)s)")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args()

    backends = []

    def mk(n):
        bs = [Backend(lbl) for lbl in labels(n)]
        backends.extend(bs)
        return bs

    ch3 = mk(3)
    chd_extra = mk(4)[3:]  # only "D" is used; A-C of chash_down reuse chash_3's
    U = {}
    U["chash_3"] = Upstream("chash_3", "hash $arg_k consistent;", ch3, [1, 1, 1])
    U["chash_weighted"] = Upstream("chash_weighted", "hash $arg_k consistent;",
                                   mk(5), [1, 2, 5, 3, 1])
    U["chash_down"] = Upstream("chash_down", "hash $arg_k consistent;",
                               ch3 + chd_extra, [1, 1, 1, 1],
                               [False, False, False, True])
    U["hash_3"] = Upstream("hash_3", "hash $arg_k;", mk(3), [1, 1, 1])
    U["hash_weighted"] = Upstream("hash_weighted", "hash $arg_k;", mk(3), [2, 1, 3])
    U["ip_hash"] = Upstream("ip_hash", "ip_hash;", mk(3), [1, 1, 1])
    U["ip_hash_weighted"] = Upstream("ip_hash_weighted", "ip_hash;", mk(3), [3, 1, 2])
    swrr = []
    for i, ws in enumerate(SWRR_WEIGHTS):
        u = Upstream(f"swrr_{i}", None, mk(len(ws)), ws)
        swrr.append(u)
        U[u.name] = u

    tmp = tempfile.mkdtemp(prefix="vigil-golden-")
    port = free_port()
    ngx = Nginx(args.nginx, tmp, render_conf(tmp, port, list(U.values())), port)
    version = ngx.version()
    pkg = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "nginx"],
                         capture_output=True, text=True).stdout.strip() or None
    results = {}
    rec = Recorder(port)
    try:
        ngx.start()
        keys = [f"key{i}" for i in range(N_KEYS)]
        for name in ("chash_3", "chash_weighted", "chash_down", "hash_3", "hash_weighted"):
            u = U[name]
            results[name] = [{"key": k, "label": rec.get(u, f"k={k}")} for k in keys]
        ips = ip_list()
        for name in ("ip_hash", "ip_hash_weighted"):
            u = U[name]
            results[name] = [{"key": ip, "label": rec.get(u, source_ip=ip)} for ip in ips]
        for u in swrr:
            results[u.name] = [rec.get(u) for _ in range(2 * sum(u.weights))]
    except Exception:
        print(ngx.log_tail(), file=sys.stderr)
        raise
    finally:
        ngx.stop()
        for b in backends:
            b.stop()

    # every request was answered by exactly the backend nginx reported, and
    # the backends saw exactly as many requests as were sent
    total_hits = sum(b.hits for b in backends)
    if total_hits != rec.count:
        raise RuntimeError(f"backends saw {total_hits} requests, sent {rec.count}")
    with open(ngx.err) as f:
        errs = [ln for ln in f if "[error]" in ln or "[crit]" in ln
                or "[alert]" in ln or "[emerg]" in ln]
    if errs:
        raise RuntimeError("nginx logged errors:\n" + "".join(errs[:20]))
    if args.keep_tmp:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)

    common = {"nginx_version": version, "nginx_package": pkg}
    descr = {
        "chash_3": "hash $arg_k consistent (ketama-like ring, 160 points per "
                   "weight unit, points are crc32 over 'HOST\\0PORT' of the "
                   "server text); 3 servers weight 1; request /chash_3/?k=KEY "
                   "for KEY in key0..key499, sequential.",
        "chash_weighted": "hash $arg_k consistent; 5 servers weights 1,2,5,3,1; "
                          "keys key0..key499.",
        "chash_down": "hash $arg_k consistent; the same 3 server lines as "
                      "chash_3 (same ports) plus a 4th server marked down. "
                      "The down server's points stay on the ring; a key whose "
                      "point belongs to it moves to the next point, so every "
                      "label equals chash_3's for the same key.",
        "hash_3": "hash $arg_k (non-consistent, Cache::Memcached compatible); "
                  "3 servers weight 1; keys key0..key499. Does not depend on ports.",
        "hash_weighted": "hash $arg_k; 3 servers weights 2,1,3; keys key0..key499.",
        "ip_hash": "ip_hash; 3 servers weight 1. Each request comes from the "
                   "client address in 'key' (client socket bound to that "
                   "127.x.y.z address); ip_hash uses only the first 3 octets.",
        "ip_hash_weighted": "ip_hash; 3 servers weights 3,1,2; same client "
                            "addresses as ip_hash.json.",
    }
    os.makedirs(args.out, exist_ok=True)

    def write(fname, obj):
        with open(os.path.join(args.out, fname), "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")

    for name, d in descr.items():
        u = U[name]
        write(f"{name}.json", {
            **common,
            "description": d,
            "directive": u.directive,
            "upstream_conf": u.conf(),
            "servers": u.servers_json(),
            "cases": results[name],
        })
    write("swrr.json", {
        **common,
        "description": "Plain weighted round robin (no balancer directive; "
                       "nginx smooth weighted round robin). Shape differs from "
                       "the other files: top-level 'cases' is a list of "
                       "{weights, upstream_conf, servers, sequence}; each case "
                       "is its own upstream with fresh state, and 'sequence' "
                       "is the labels that answered 2*sum(weights) sequential "
                       "requests, in order, starting with the upstream's first "
                       "request. 'servers' is empty at top level.",
        "directive": None,
        "servers": [],
        "cases": [{"weights": u.weights, "upstream_conf": u.conf(),
                   "servers": u.servers_json(), "sequence": results[u.name]}
                  for u in swrr],
    })
    print(f"{version}: {rec.count} requests, all 200; wrote "
          f"{len(descr) + 1} files to {args.out}")


if __name__ == "__main__":
    main()
