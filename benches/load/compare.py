#!/usr/bin/env python3
"""End-to-end load benchmark: the same wrk load through nginx and through vigil.

Starts three fast backends (nginx, 1 worker each process, `GET /` -> "ok\\n",
`GET /16k` -> 16 KiB), then for every round runs each target in turn
(interleaved: nginx, vigil:1, vigil:2, nginx, ...) with the same nginx.conf
(upstream keepalive 64, HTTP/1.1, round robin over the three backends),
and prints req/s, p50/p99 latency, proxy CPU seconds per request and RSS,
with paired ratios against nginx from the same round.

    python3 benches/load/compare.py [--rounds 3] [--duration 10] [--pin split|none]
        [--targets nginx,vigil:1,vigil:2] [--base nginx] [--browser-headers]

`nginx:N` runs nginx with N worker processes. `vigil:N@NAME` runs the binary $VIGIL_BIN_NAME instead (two builds side by
side). A target `vigil+preset:N` is vigil with `health_preset recommended;` and a
500 ms http check in the upstream (the cost of vigil's health plane);
`--base vigil:2` gives its ratios against plain vigil instead of nginx.

Needs nginx and wrk (`apt-get install -y nginx wrk`) and a release build
(`cargo build --release -p vigil`). Only 127.0.0.1 is used. PIN=split puts
the proxy on CPU 0 and wrk + backends on CPU 1, as in
shared/reference/perf-baseline.md.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The release build: $VIGIL_BIN, else under $CARGO_TARGET_DIR (or ./target).
VIGIL = os.environ.get("VIGIL_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "vigil")
PROXY_PORT = 18080
BACKEND_PORTS = [18081, 18082, 18083]

BACKEND_CONF = """
worker_processes 1; daemon off; pid {d}/backend.pid; error_log {d}/backend.err;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/pt; fastcgi_temp_path {d}/ft; uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;
  keepalive_requests 1000000;
  {servers}
}}
"""
BACKEND_SERVER = """server {{ listen 127.0.0.1:{port}; root {d}/www;
    location = / {{ default_type text/plain; return 200 "ok\\n"; }}
    location = /16k {{ }} }}"""

PROXY_CONF = """
worker_processes 1; daemon off; pid {d}/proxy.pid; error_log {d}/proxy.err;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {d}/pcb; proxy_temp_path {d}/ppt; fastcgi_temp_path {d}/pft; uwsgi_temp_path {d}/put; scgi_temp_path {d}/pst;
  keepalive_requests 1000000;
  upstream backends {{
    server 127.0.0.1:18081 max_fails=1 fail_timeout=10s;
    server 127.0.0.1:18082 max_fails=1 fail_timeout=10s;
    server 127.0.0.1:18083 max_fails=1 fail_timeout=10s;
    keepalive 64;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:18080;
    location / {{
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout 1s;
      proxy_next_upstream error timeout;
    }}
  }}
}}
"""


def nginx_bin():
    for c in ("nginx", "/usr/sbin/nginx"):
        p = shutil.which(c) or (c if os.path.exists(c) else None)
        if p:
            return p
    sys.exit("nginx not found: apt-get install -y nginx")


def taskset(cpu, pin):
    return ["taskset", "-c", str(cpu)] if pin == "split" else []


def wait_http(url, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


def wait_port_free(port, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            return
        except OSError:
            time.sleep(0.1)
        finally:
            s.close()


def cpu_seconds(pid):
    """(utime, stime) of a process and all its threads (and waited-for children)."""
    user = system = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        pids += [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            user += int(f[11]) / tick
            system += int(f[12]) / tick
        except OSError:
            pass
    return user, system


def rss_kb(pid):
    total = 0
    pids = [pid]
    try:
        pids += [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def parse_wrk(out):
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    lat = {}
    for p, v, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        lat[p] = float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return rps, reqs, lat.get("50"), lat.get("99"), (int(errors.group(1)) if errors else 0), (sock.group(1) if sock else "")


PRESET = (
    'health_preset recommended; check interval=500 rise=1 fall=1 timeout=400 type=http; '
    'check_http_send "GET / HTTP/1.0\\r\\n\\r\\n";'
)


def start_proxy(target, d, pin):
    conf = os.path.join(d, "proxy-preset.conf" if "+preset" in target else "proxy.conf")
    if target.startswith("nginx"):
        # `nginx:N` runs N worker processes (`nginx` alone: 1).
        workers = target.partition(":")[2] or "1"
        if workers != "1":
            text = open(conf).read().replace("worker_processes 1;", f"worker_processes {workers};")
            conf = os.path.join(d, f"proxy-nginx{workers}.conf")
            with open(conf, "w") as f:
                f.write(text)
        cmd = taskset(0, pin) + [nginx_bin(), "-p", d + "/", "-e", d + "/proxy.err", "-c", conf]
    else:
        # `vigil:2@NAME` runs the binary named by $VIGIL_BIN_NAME (an A/B of builds).
        spec, _, alt = target.partition("@")
        threads = spec.split(":")[1]
        binary = os.environ["VIGIL_BIN_" + alt] if alt else VIGIL
        cmd = taskset(0, pin) + [binary, "serve", "--nginx-conf", conf, "--threads", threads]
    env = dict(os.environ, VIGIL_LOG="error")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, target.replace(":", "_") + ".log"), "ab"),
                         start_new_session=True, env=env)
    wait_http(f"http://127.0.0.1:{PROXY_PORT}/")
    return p


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_port_free(PROXY_PORT)


# The fields a desktop browser sends with a page request (Chromium's, with
# a session cookie): about 600 bytes of head, where wrk alone sends Host.
BROWSER_HEADERS = [
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
    "Accept-Language: en-GB,en;q=0.9,de;q=0.8",
    "Accept-Encoding: gzip, deflate, br, zstd",
    "Cookie: session=3f2a9c1e8b7d4f60a5e2c9b1d8f7a6e5; theme=dark; _ga=GA1.1.1234567890.1700000000",
    "Referer: http://127.0.0.1:19180/index.html",
    "Sec-Fetch-Dest: document",
    "Sec-Fetch-Mode: navigate",
    "Sec-Fetch-Site: same-origin",
    "Upgrade-Insecure-Requests: 1",
    "Cache-Control: max-age=0",
]


def run_one(target, path, d, pin, duration, headers=()):
    p = start_proxy(target, d, pin)
    try:
        url = f"http://127.0.0.1:{PROXY_PORT}{path}"
        hs = [arg for h in headers for arg in ("-H", h)]
        subprocess.run(taskset(1, pin) + ["wrk", "-t1", "-c64", "-d2s", *hs, url], capture_output=True, timeout=60)
        u0, s0 = cpu_seconds(p.pid)
        out = subprocess.run(taskset(1, pin) + ["wrk", "-t1", "-c64", f"-d{duration}s", "--timeout", "2s", "--latency", *hs, url],
                             capture_output=True, text=True, timeout=duration + 60).stdout
        u1, s1 = cpu_seconds(p.pid)
        user, system = u1 - u0, s1 - s0
        cpu = user + system
        rss = rss_kb(p.pid)
    finally:
        stop(p)
    rps, reqs, p50, p99, errs, sock = parse_wrk(out)
    return {"target": target, "path": path, "rps": rps, "requests": reqs, "p50_ms": p50, "p99_ms": p99,
            "proxy_cpu_s": cpu, "req_per_cpu_s": reqs / cpu if cpu > 0 else None, "cpu_us_per_req": 1e6 * cpu / reqs if reqs else None,
            "user_us_per_req": 1e6 * user / reqs if reqs else None, "sys_us_per_req": 1e6 * system / reqs if reqs else None,
            "rss_mib": rss / 1024, "non_2xx": errs, "socket_errors": sock}


def start_backends(d, pin="split"):
    """Write the backends' and the proxies' confs into d and start the backends."""
    # nginx's workers run as nobody when started by root: they must read www/.
    os.chmod(d, 0o755)
    os.makedirs(os.path.join(d, "www"))
    with open(os.path.join(d, "www", "16k"), "wb") as f:
        f.write(b"x" * 16384)
    servers = "\n".join(BACKEND_SERVER.format(port=p, d=d) for p in BACKEND_PORTS)
    with open(os.path.join(d, "backend.conf"), "w") as f:
        f.write(BACKEND_CONF.format(d=d, servers=servers))
    with open(os.path.join(d, "proxy.conf"), "w") as f:
        f.write(PROXY_CONF.format(d=d))
    with open(os.path.join(d, "proxy-preset.conf"), "w") as f:
        f.write(PROXY_CONF.format(d=d).replace("keepalive 64;", "keepalive 64;\n    " + PRESET))
    backend = subprocess.Popen(taskset(1, pin) + [nginx_bin(), "-p", d + "/", "-e", d + "/backend.err", "-c", os.path.join(d, "backend.conf")],
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for port in BACKEND_PORTS:
            wait_http(f"http://127.0.0.1:{port}/")
    except RuntimeError:
        stop_backends(backend)
        raise
    return backend


def start_shifted_backends(prefix, shift, tls=False):
    """compare.py's backends and proxy.conf in a new temp dir, every port
    moved by `shift` (1808x -> 1808x + shift), so a bench can run beside
    compare.py. Returns (dir, backend process), the backends answering.
    `tls`: the backends speak HTTPS (a self-signed certificate made here
    with openssl) and the proxy reaches them with `proxy_pass https://`
    and `proxy_ssl_verify off`, the connections kept alive as before."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o755)
    os.makedirs(os.path.join(d, "www"))
    with open(os.path.join(d, "www", "16k"), "wb") as f:
        f.write(b"x" * 16384)
    moved = str(1808 + shift // 10)

    def shifted(text):
        return text.replace("1808", moved)

    server = BACKEND_SERVER
    proxy = PROXY_CONF
    if tls:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-keyout", os.path.join(d, "key.pem"),
                        "-out", os.path.join(d, "cert.pem")], check=True, capture_output=True)
        server = server.replace("listen 127.0.0.1:{port};",
                                "listen 127.0.0.1:{port} ssl; ssl_certificate {d}/cert.pem; "
                                "ssl_certificate_key {d}/key.pem;")
        proxy = proxy.replace("proxy_pass http://backends;",
                              "proxy_pass https://backends; proxy_ssl_verify off;")
    servers = "\n".join(server.format(port=p, d=d) for p in BACKEND_PORTS)
    with open(os.path.join(d, "backend.conf"), "w") as f:
        f.write(shifted(BACKEND_CONF.format(d=d, servers=servers)))
    with open(os.path.join(d, "proxy.conf"), "w") as f:
        f.write(shifted(proxy.format(d=d)))
    backend = subprocess.Popen([nginx_bin(), "-p", d + "/", "-e", d + "/backend.err", "-c", os.path.join(d, "backend.conf")],
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for port in BACKEND_PORTS:
            if tls:
                wait_https(f"https://127.0.0.1:{port + shift}/")
            else:
                wait_http(f"http://127.0.0.1:{port + shift}/")
    except RuntimeError:
        stop_backends(backend)
        raise
    return d, backend


def wait_https(url, timeout=20):
    """wait_http for a backend with a self-signed certificate."""
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1, context=ctx) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


def stop_backends(backend):
    os.killpg(backend.pid, signal.SIGTERM)
    backend.wait(timeout=10)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--pin", choices=["split", "none"], default="split")
    ap.add_argument("--targets", default="nginx,vigil:1,vigil:2")
    ap.add_argument("--paths", default="/,/16k")
    ap.add_argument("--base", default="nginx", help="the target ratios are paired against")
    ap.add_argument("--json", help="append raw results here")
    ap.add_argument("--browser-headers", action="store_true",
                    help="send a browser's request fields (about 600 bytes) instead of wrk's Host alone")
    a = ap.parse_args()
    headers = BROWSER_HEADERS if a.browser_headers else []
    if not os.path.exists(VIGIL):
        sys.exit("build first: cargo build --release -p vigil")
    d = tempfile.mkdtemp(prefix="vigil-load-")
    backend = start_backends(d, a.pin)
    results = []
    try:
        targets = a.targets.split(",")
        for rnd in range(a.rounds):
            for path in a.paths.split(","):
                for t in targets:
                    r = run_one(t, path, d, a.pin, a.duration, headers)
                    r["round"] = rnd
                    results.append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        stop_backends(backend)
    if a.json:
        with open(a.json, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    summarize(results, a)
    shutil.rmtree(d, ignore_errors=True)


def summarize(results, a):
    sent = ", a browser's request fields" if getattr(a, "browser_headers", False) else ""
    print(f"\npin={a.pin} rounds={a.rounds} duration={a.duration}s wrk -t1 -c64{sent}, medians; ratios paired per round against {a.base}")
    print(f"{'target':<16} {'path':<5} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'req/CPU-s':>10} {'µs CPU/req':>10} {'user/sys µs':>11} {'RSS MiB':>8} {'rps÷base':>9} {'eff÷base':>9} {'p99÷base':>9}")
    for path in a.paths.split(","):
        for t in a.targets.split(","):
            rows = [r for r in results if r["target"] == t and r["path"] == path]
            base = {r["round"]: r for r in results if r["target"] == a.base and r["path"] == path}
            med = lambda k: statistics.median([r[k] for r in rows if r[k] is not None])
            ratio = lambda k: statistics.median([r[k] / base[r["round"]][k] for r in rows if r[k] and base.get(r["round"], {}).get(k)])
            print(f"{t:<16} {path:<5} {med('rps'):>8.0f} {med('p50_ms'):>7.2f} {med('p99_ms'):>7.2f} {med('req_per_cpu_s'):>10.0f} {med('cpu_us_per_req'):>10.1f} {med('user_us_per_req'):>5.1f}/{med('sys_us_per_req'):<5.1f} {med('rss_mib'):>8.1f} {ratio('rps'):>9.2f} {ratio('req_per_cpu_s'):>9.2f} {ratio('p99_ms'):>9.2f}")


if __name__ == "__main__":
    main()
