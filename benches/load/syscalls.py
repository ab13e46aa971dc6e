#!/usr/bin/env python3
"""System calls per request of nginx and vigil builds, under `strace -c`.

More than half of the proxy's CPU is kernel time, and the kernel's share
follows the system calls a request makes (reads, writes, epoll, futex
wake-ups between threads). Counting them is load-independent, like the
instructions of instructions.py: each proxy runs (one worker) under
`strace -f -c` behind compare.py's three nginx backends and nginx.conf, on
ports 1928x so it can run beside compare.py; `wrk -t1 -c8` sends requests
for --duration seconds; the calls each request made are printed per name.

    python3 benches/load/syscalls.py [--targets nginx,vigil] [--paths /,/16k]

`vigil@NAME` runs the binary named by $VIGIL_BIN_NAME (an A/B of builds);
`vigil` alone is compare.py's release build. Needs strace, nginx and wrk.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402

PORT = 19280


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="nginx,vigil")
    ap.add_argument("--paths", default="/,/16k")
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--top", type=int, default=12, help="calls shown per run")
    a = ap.parse_args()
    d, backend = c.start_shifted_backends("vigil-sys-", 1200)
    try:
        for path in a.paths.split(","):
            for target in a.targets.split(","):
                calls, reqs = measure(target, path, d, a.duration)
                total = sum(calls.values())
                print(f"\n{target} {path}: {total / reqs:.2f} system calls per request ({reqs} requests)")
                for name, n in sorted(calls.items(), key=lambda kv: -kv[1])[:a.top]:
                    print(f"  {name:<16} {n / reqs:7.3f}")
    finally:
        os.killpg(backend.pid, signal.SIGTERM)
        backend.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


def command(target, d):
    conf = os.path.join(d, "proxy.conf")
    if target == "nginx":
        return [c.nginx_bin(), "-p", d + "/", "-e", d + "/proxy.err", "-c", conf]
    _, _, alt = target.partition("@")
    binary = os.environ["VIGIL_BIN_" + alt] if alt else c.VIGIL
    return [binary, "serve", "--nginx-conf", conf, "--threads", "1"]


def measure(target, path, d, duration):
    out = os.path.join(d, "strace.out")
    env = dict(os.environ, VIGIL_LOG="error")
    url = f"http://127.0.0.1:{PORT}{path}"
    # Warm up without strace (connections to the backends made), then count
    # a run of its own: strace attaches to the running process's threads.
    p = subprocess.Popen(command(target, d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=env)
    try:
        c.wait_http(url)
        subprocess.run(["wrk", "-t1", "-c8", "-d2s", url], capture_output=True, timeout=60)
        pids = [str(p.pid)] + children(p.pid)
        tracer = subprocess.Popen(["strace", "-f", "-c", "-o", out] + [x for pid in pids for x in ("-p", pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_attached(pids)
        res = subprocess.run(["wrk", "-t1", "-c8", f"-d{duration}s", "--timeout", "10s", url],
                             capture_output=True, text=True, timeout=duration + 120).stdout
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)
        reqs = int(re.search(r"(\d+) requests in", res).group(1))
        calls = {}
        for line in open(out):
            m = re.match(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m and m.group(2) != "total":
                calls[m.group(2)] = calls.get(m.group(2), 0) + int(m.group(1))
        return calls, reqs
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
        c.wait_port_free(PORT)


def children(pid):
    """The worker processes of an nginx master (vigil has none)."""
    r = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return r.stdout.split()


def wait_attached(pids, timeout=10):
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(tracer_of(pid) for pid in pids):
            return
        time.sleep(0.05)
    raise RuntimeError("strace did not attach")


def tracer_of(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("TracerPid:"):
                return int(line.split()[1]) != 0
    except OSError:
        return False
    return False


if __name__ == "__main__":
    main()
