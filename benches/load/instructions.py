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
        [--location-extra 'add_header X-Via vigil;'] [--browser-headers] [--post BYTES]

A path of `nginx` (`--bins nginx=nginx,new=/path/vigil`) runs nginx itself
on the same proxy.conf, as one process (`master_process off`), for its
figure beside vigil's.

With --keep, each run's dump stays as DIR/NAME-PATH-ROUND.cg, for
`callgrind_annotate` (which functions moved).

--sim adds callgrind's cache and branch simulation (misses per request),
--atomics the locked read-modify-write instructions per request (atomic
counts, mutexes, reference counts: each costs tens of cycles, and an
instruction count weighs it as one).

Needs valgrind, nginx and wrk (and objdump for --atomics).
"""

import argparse
import functools
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
    ap.add_argument("--bins", required=True, help="name=path,name=path (a path of `nginx`: nginx on the same conf)")
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
    ap.add_argument("--sim", action="store_true",
                    help="also simulate the caches and branch predictor (callgrind --cache-sim --branch-sim; "
                         "slower): misses per request, the part of the time instructions do not show")
    ap.add_argument("--post", type=int, metavar="BYTES",
                    help="send POSTs with a body of BYTES bytes (Content-Length) instead of GETs")
    ap.add_argument("--tls-upstream", action="store_true",
                    help="the backends speak HTTPS and the proxy reaches them over TLS (proxy_pass https://, "
                         "connections kept alive): the TLS upstream path")
    ap.add_argument("--atomics", action="store_true",
                    help="also count the locked read-modify-write instructions (`lock`-prefixed, and `xchg` "
                         "with memory: atomic counts, mutexes, wakers) executed per request, which cost "
                         "tens of cycles each and which instructions counts weigh as one")
    a = ap.parse_args()
    headers = c.BROWSER_HEADERS if a.browser_headers else []
    bins = [b.split("=", 1) for b in a.bins.split(",")]
    d, backend = c.start_shifted_backends("vigil-instr-", 1100, tls=a.tls_upstream)
    script = None
    if a.post is not None:
        script = os.path.join(d, "post.lua")
        with open(script, "w") as f:
            f.write(f'wrk.method = "POST"\nwrk.body = string.rep("x", {a.post})\n'
                    'wrk.headers["Content-Type"] = "text/plain"\n')
    if a.location_extra:
        conf = os.path.join(d, "proxy.conf")
        text = open(conf).read()
        if "location / {" not in text:
            raise SystemExit("proxy.conf has no `location / {` to add to")
        with open(conf, "w") as f:
            f.write(text.replace("location / {", "location / { " + a.location_extra, 1))
    rows, sims, atomics = [], [], []
    try:
        for rnd in range(a.rounds):
            for path in a.paths.split(","):
                for name, binary in bins:
                    keep = None
                    if a.keep:
                        os.makedirs(a.keep, exist_ok=True)
                        slug = path.strip("/").replace("/", "_") or "root"
                        keep = os.path.join(a.keep, f"{name}-{slug}-{rnd}.cg")
                    ir, reqs, mem, events, locked = measure(binary, path, d, a.duration, keep, headers,
                                                            a.sim, a.atomics, script)
                    rows.append((rnd, path, name, ir, reqs, mem))
                    sims.append((path, name, reqs, events))
                    atomics.append((path, name, reqs, locked))
                    print(f"round {rnd} {path} {name}: {ir} Ir / {reqs} requests = {ir / reqs:.0f} Ir/request"
                          f" ({(ir - mem) / reqs:.0f} without memset/memcpy)", file=sys.stderr, flush=True)
    finally:
        os.killpg(backend.pid, signal.SIGTERM)
        backend.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)
    sent = f", {len(headers)} browser request fields" if headers else ""
    sent += f", POSTs of {a.post} bytes" if a.post is not None else ""
    sent += ", HTTPS upstreams" if a.tls_upstream else ""
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
    if a.sim:
        print_sims(sims)
    if a.atomics:
        print("\nlocked read-modify-write instructions per request (summed over rounds)")
        print("| path | build | locked/request |")
        print("| --- | --- | --- |")
        for path, name in dict.fromkeys((p, n) for p, n, _, _ in atomics):
            got = [(r, k) for p, n, r, k in atomics if (p, n) == (path, name)]
            print(f"| {path} | {name} | {sum(k for _, k in got) / sum(r for r, _ in got):,.1f} |")


# What --sim prints: callgrind's simulated misses (its caches are the
# host's L1 and last level; its branch predictor a simple one), per request.
SIM_COLUMNS = [
    ("L1 i-misses", ("I1mr",)),
    ("LL i-misses", ("ILmr",)),
    ("L1 d-misses", ("D1mr", "D1mw")),
    ("LL d-misses", ("DLmr", "DLmw")),
    ("branches", ("Bc", "Bi")),
    ("mispredicted", ("Bcm", "Bim")),
]


def print_sims(sims):
    print("\nsimulated by callgrind, per request (summed over rounds)")
    print("| path | build | " + " | ".join(col for col, _ in SIM_COLUMNS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in SIM_COLUMNS) + " |")
    seen = []
    for path, name, _, _ in sims:
        if (path, name) not in seen:
            seen.append((path, name))
    for path, name in seen:
        got = [(reqs, ev) for p, n, reqs, ev in sims if (p, n) == (path, name)]
        reqs = sum(r for r, _ in got)
        cells = [sum(ev.get(k, 0) for _, ev in got for k in keys) / reqs for _, keys in SIM_COLUMNS]
        print(f"| {path} | {name} | " + " | ".join(f"{v:,.0f}" for v in cells) + " |")


def locked_instructions(dump):
    """How many times the dump's locked read-modify-write instructions ran
    (needs `--dump-instr=yes`): its per-instruction counts, matched
    against each object's disassembly (objdump)."""
    counts = {}  # (object, address) -> executions
    obj, names, pos, after_call = None, {}, 0, False
    for line in open(dump):
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"^(c?ob|c?fn|c?f[lie]|calls)=(.*)$", line.rstrip("\n"))
        if m:
            key, val = m.groups()
            if key in ("ob", "cob"):
                ref = re.match(r"\((\d+)\)(?: (.*))?", val)
                if ref and ref.group(2):
                    names[ref.group(1)] = ref.group(2)
                if key == "ob" and ref:
                    obj = names.get(ref.group(1))
            after_call = after_call or key == "calls"
            continue
        if line[0] not in "0123456789+-*":
            continue
        fields = line.split()
        at = fields[0]
        if at.startswith("0x"):
            pos = int(at, 16)
        elif at[0] in "+-":
            step = int(at[1:], 16) if at[1:].startswith("0x") else int(at[1:])
            pos += step if at[0] == "+" else -step
        if after_call:
            # The line after calls= is the call's inclusive cost, not the
            # instruction's own.
            after_call = False
            continue
        if len(fields) >= 3 and obj:
            counts[(obj, pos)] = counts.get((obj, pos), 0) + int(fields[2])
    total = 0
    for o in {o for o, _ in counts}:
        if os.path.exists(o):
            total += sum(counts.get((o, at), 0) for at in locked_addresses(o))
    return total


@functools.lru_cache(maxsize=None)
def locked_addresses(obj):
    """The addresses of `obj`'s locked instructions, disassembled once a run."""
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True).stdout
    return tuple(int(m.group(1), 16) for m in re.finditer(r"^\s*([0-9a-f]+):\s+(lock\b|xchg\b.*\()", asm, re.M))


def measure(binary, path, d, duration, keep=None, headers=(), sim=False, atomics=False, script=None):
    out = os.path.join(d, "cg.out")
    for f in glob.glob(out + "*"):
        os.remove(f)
    env = dict(os.environ, VIGIL_LOG="error")
    if binary == "nginx":
        # nginx itself on the same conf: one process serving as its worker
        # would (`master_process off`), so its instructions are a worker's.
        cmd = [c.nginx_bin(), "-p", d + "/", "-e", d + "/proxy.err", "-c", os.path.join(d, "proxy.conf"),
               "-g", "master_process off;"]
    else:
        cmd = [binary, "serve", "--nginx-conf", os.path.join(d, "proxy.conf"), "--threads", "1"]
    sim_args = (["--cache-sim=yes", "--branch-sim=yes"] if sim else []) + (["--dump-instr=yes"] if atomics else [])
    p = subprocess.Popen(["valgrind", "--tool=callgrind", *sim_args, f"--callgrind-out-file={out}", *cmd],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        c.wait_http("http://127.0.0.1:19180/", timeout=120)
        url = f"http://127.0.0.1:19180{path}"
        hs = [arg for h in headers for arg in ("-H", h)] + (["-s", script] if script else [])
        subprocess.run(["wrk", "-t1", "-c8", "-d3s", *hs, url], capture_output=True, timeout=120)
        subprocess.run(["callgrind_control", "--zero", str(p.pid)], capture_output=True, timeout=60)
        res = subprocess.run(["wrk", "-t1", "-c8", f"-d{duration}s", "--timeout", "10s", *hs, url],
                             capture_output=True, text=True, timeout=duration + 120).stdout
        subprocess.run(["callgrind_control", "--dump", str(p.pid)], capture_output=True, timeout=60)
        reqs = int(re.search(r"(\d+) requests in", res).group(1))
        ir, events = None, {}
        deadline = time.time() + 30
        while ir is None and time.time() < deadline:
            for f in sorted(glob.glob(out + ".*")):
                text = open(f).read()
                m = re.search(r"^(?:summary|totals):\s+([\d ]+)$", text, re.M)
                names = re.search(r"^events:\s+(.+)$", text, re.M)
                if m and names:
                    counts = [int(x) for x in m.group(1).split()]
                    events = dict(zip(names.group(1).split(), counts))
                    ir = events.get("Ir", counts[0])
            time.sleep(0.2)
        if ir is None:
            raise RuntimeError("no callgrind dump")
        # valgrind counts every iteration of a `rep stos`/`rep movs` (glibc's
        # memset/memcpy for larger sizes) as an instruction: show them apart.
        mem = 0
        for f in sorted(glob.glob(out + ".*")):
            ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--show=Ir", f], capture_output=True, text=True).stdout
            for m in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\S*(?:memset|memmove|memcpy)-vec-unaligned-erms\.S:\S+", ann, re.M):
                mem += int(m.group(1).replace(",", ""))
        if keep:
            dumps = sorted(glob.glob(out + ".*"))
            shutil.copyfile(dumps[-1], keep)
        locked = sum(locked_instructions(f) for f in sorted(glob.glob(out + ".*"))) if atomics else 0
        return ir, reqs, mem, events, locked
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        c.wait_port_free(19180)


if __name__ == "__main__":
    main()
