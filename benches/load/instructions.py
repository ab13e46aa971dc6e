#!/usr/bin/env python3
"""User-space instructions per request of vigil builds, under callgrind.

Wall-clock figures on a shared machine move with the other load; the
instructions a request executes do not. This runs each build (one worker)
under `valgrind --tool=callgrind` behind the same three nginx backends and
nginx.conf as compare.py (on ports 1918x, so it can run beside it), warms
up, zeroes the counters, sends `wrk -t1 -c8` for --duration seconds, dumps,
and prints the instructions (Ir) per request. Kernel work (syscalls, TCP)
is not counted: use `strace -c` for syscalls per request.

    python3 benches/load/instructions.py --bins base=/path/vigil,new=/path/vigil [--paths /,/16k] [--keep DIR]
        [--location-extra 'add_header X-Via vigil;'] [--browser-headers]

With --keep, each run's dump stays as DIR/NAME-PATH-ROUND.cg, for
`callgrind_annotate` (which functions moved).

Needs valgrind, nginx and wrk.
"""

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bins", required=True, help="name=path,name=path")
    ap.add_argument("--paths", default="/,/16k")
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", help="a folder to keep each run's callgrind dump in")
    ap.add_argument("--location-extra", default="",
                    help="directives added to the proxied location (say 'add_header X-Via vigil;', "
                         "which makes the response's fields go through a header map)")
    ap.add_argument("--browser-headers", action="store_true",
                    help="send the request fields a browser sends (about 600 bytes: User-Agent, Accept, "
                         "Accept-Language, Accept-Encoding, Cookie, ...) instead of wrk's Host alone")
    a = ap.parse_args()
    headers = c.BROWSER_HEADERS if a.browser_headers else []
    bins = [b.split("=", 1) for b in a.bins.split(",")]
    d, backend = c.start_shifted_backends("vigil-instr-", 1100)
    if a.location_extra:
        conf = os.path.join(d, "proxy.conf")
        text = open(conf).read()
        if "location / {" not in text:
            raise SystemExit("proxy.conf has no `location / {` to add to")
        with open(conf, "w") as f:
            f.write(text.replace("location / {", "location / { " + a.location_extra, 1))
    rows = []
    try:
        for rnd in range(a.rounds):
            for path in a.paths.split(","):
                for name, binary in bins:
                    keep = None
                    if a.keep:
                        os.makedirs(a.keep, exist_ok=True)
                        slug = path.strip("/").replace("/", "_") or "root"
                        keep = os.path.join(a.keep, f"{name}-{slug}-{rnd}.cg")
                    ir, reqs, mem = measure(binary, path, d, a.duration, keep, headers)
                    rows.append((rnd, path, name, ir, reqs, mem))
                    print(f"round {rnd} {path} {name}: {ir} Ir / {reqs} requests = {ir / reqs:.0f} Ir/request"
                          f" ({(ir - mem) / reqs:.0f} without memset/memcpy)", file=sys.stderr, flush=True)
    finally:
        os.killpg(backend.pid, signal.SIGTERM)
        backend.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)
    sent = f", {len(headers)} browser request fields" if headers else ""
    print(f"\ncallgrind, one worker, wrk -t1 -c8 -d{a.duration}s{sent} after warm-up; user-space instructions per request")
    print("| path | build | Ir/request | ÷ " + bins[0][0] + " | Ir/request without memset/memcpy | ÷ " + bins[0][0] + " | requests |")
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    for path in a.paths.split(","):
        base = [r for r in rows if r[1] == path and r[2] == bins[0][0]]
        b_all, b_net = med([r[3] / r[4] for r in base]), med([(r[3] - r[5]) / r[4] for r in base])
        for name, _ in bins:
            got = [r for r in rows if r[1] == path and r[2] == name]
            per, net = med([r[3] / r[4] for r in got]), med([(r[3] - r[5]) / r[4] for r in got])
            print(f"| {path} | {name} | {per:,.0f} | {per / b_all:.3f} | {net:,.0f} | {net / b_net:.3f} | {sum(r[4] for r in got)} |")


def measure(binary, path, d, duration, keep=None, headers=()):
    out = os.path.join(d, "cg.out")
    for f in glob.glob(out + "*"):
        os.remove(f)
    env = dict(os.environ, VIGIL_LOG="error")
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "serve",
                          "--nginx-conf", os.path.join(d, "proxy.conf"), "--threads", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        c.wait_http("http://127.0.0.1:19180/", timeout=120)
        url = f"http://127.0.0.1:19180{path}"
        hs = [arg for h in headers for arg in ("-H", h)]
        subprocess.run(["wrk", "-t1", "-c8", "-d3s", *hs, url], capture_output=True, timeout=120)
        subprocess.run(["callgrind_control", "--zero", str(p.pid)], capture_output=True, timeout=60)
        res = subprocess.run(["wrk", "-t1", "-c8", f"-d{duration}s", "--timeout", "10s", *hs, url],
                             capture_output=True, text=True, timeout=duration + 120).stdout
        subprocess.run(["callgrind_control", "--dump", str(p.pid)], capture_output=True, timeout=60)
        reqs = int(re.search(r"(\d+) requests in", res).group(1))
        ir = None
        deadline = time.time() + 30
        while ir is None and time.time() < deadline:
            for f in sorted(glob.glob(out + ".*")):
                m = re.search(r"^(?:summary|totals):\s+(\d+)", open(f).read(), re.M)
                if m:
                    ir = int(m.group(1))
            time.sleep(0.2)
        if ir is None:
            raise RuntimeError("no callgrind dump")
        # valgrind counts every iteration of a `rep stos`/`rep movs` (glibc's
        # memset/memcpy for larger sizes) as an instruction: show them apart.
        mem = 0
        for f in sorted(glob.glob(out + ".*")):
            ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", f], capture_output=True, text=True).stdout
            for m in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\S*(?:memset|memmove|memcpy)-vec-unaligned-erms\.S:\S+", ann, re.M):
                mem += int(m.group(1).replace(",", ""))
        if keep:
            dumps = sorted(glob.glob(out + ".*"))
            shutil.copyfile(dumps[-1], keep)
        return ir, reqs, mem
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        c.wait_port_free(19180)


if __name__ == "__main__":
    main()
