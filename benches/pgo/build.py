#!/usr/bin/env python3
"""Build vigil with profile-guided optimization (PGO), trained on proxied traffic.

    python3 benches/pgo/build.py [--train-seconds 3] [--out target/pgo] [--instrumented BIN]
                                 [--features mimalloc] [--bolt]

Three steps, as the rustc book's "Profile-guided Optimization" chapter gives them:

1. build `vigil` instrumented (`-Cprofile-generate`) into target/pgo-generate;
2. train it: the instrumented binary proxies to compare.py's three nginx backends
   (ports 1928x, so a bench can run beside it) while wrk sends each request of the mix
   below in turn; it is stopped with SIGTERM, which writes its profile;
3. merge the profile (`llvm-profdata` of the toolchain: `rustup component add
   llvm-tools`) into OUT/vigil-HASH.profdata and build `vigil` again with
   `-Cprofile-use` into OUT (target/pgo): OUT/release/vigil. The profile is named by its
   content, so each new profile rebuilds every crate with it.

The mix is what a proxy in front of web servers serves: small and 16 KiB responses to
wrk's one-field request and to a browser's eleven fields, a POST with a 2 KiB body, a
404 from the backend and a 304. No traffic is timed here: how much the optimized build
gains is measured with compare.py and instructions.py against `cargo build --release`.

Needs nginx, wrk and the toolchain's llvm-tools. The default `cargo build --release`
is untouched: this builds beside it. `--features` is passed to both builds (the profile
must come from the code it optimizes): `--features mimalloc` builds with mimalloc as the
allocator (docs/performance.md, "Fewer locked instructions; mimalloc with the
profile-guided build"). With `--instrumented BIN` the first build is skipped: BIN must
have been built with the same features.

With `--bolt`, the profile-guided build is linked with its relocations kept
(`--emit-relocs`) and laid out again by BOLT (LLVM's post-link optimizer, Debian's
`bolt-NN` package): `llvm-bolt -instrument` makes a counting copy of it, which is trained
on the same mix, and `llvm-bolt` rewrites the build from those counts (blocks ordered by
ext-tsp, functions by cdsort, cold code split out) into OUT/release/vigil-bolt, without debug
information (`llvm-bolt` keeps it only with `-update-debug-sections`, not passed here).
OUT/release/vigil is then the profile-guided build with its relocations kept (the same code,
a larger file). The flags are those of `llvm-bolt` 22; an older `bolt-NN` may lack some.
"""

import argparse
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benches", "load"))
import compare as c  # noqa: E402

SHIFT = 1200
PORT = c.PROXY_PORT + SHIFT

POST_LUA = 'wrk.method = "POST"\nwrk.body = string.rep("x", 2048)\nwrk.headers["Content-Type"] = "text/plain"\n'


def mix(d):
    """(what, path, wrk arguments) of each request the training sends."""
    post = os.path.join(d, "post.lua")
    with open(post, "w") as f:
        f.write(POST_LUA)
    browser = [arg for h in c.BROWSER_HEADERS for arg in ("-H", h)]
    return [
        ("wrk's GET", "/", []),
        ("wrk's GET", "/16k", []),
        ("a browser's GET", "/", browser),
        ("a browser's GET", "/16k", browser),
        ("a POST of 2 KiB", "/", ["-s", post]),
        ("a GET the backend answers 404", "/missing", []),
        ("a GET the backend answers 304", "/16k", ["-H", "If-None-Match: *"]),
    ]


def llvm_profdata():
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
    host = next(line.split(": ", 1)[1] for line in subprocess.run(["rustc", "-vV"], capture_output=True, text=True,
                                                                   check=True).stdout.splitlines()
                if line.startswith("host: "))
    tool = os.path.join(sysroot, "lib", "rustlib", host, "bin", "llvm-profdata")
    if os.path.exists(tool):
        return tool
    raise SystemExit(f"llvm-profdata is not at {tool}: run `rustup component add llvm-tools`")


def llvm_bolt():
    """Debian's llvm-bolt (`llvm-bolt-NN`, the newest), or one on PATH."""
    found = shutil.which("llvm-bolt")
    if found:
        return found
    versions = sorted((b for b in glob.glob("/usr/bin/llvm-bolt-*") if b.rsplit("-", 1)[1].isdigit()),
                      key=lambda b: int(b.rsplit("-", 1)[1]))
    if versions:
        return versions[-1]
    raise SystemExit("llvm-bolt is not installed: apt-get install bolt-22 (or another bolt-NN)")


def bolt(bolt_tool, binary, seconds, profiles):
    """BOLT's layout of `binary` (linked with --emit-relocs), trained on the mix."""
    counting = os.path.join(profiles, "vigil-bolt-instrumented")
    fdata = os.path.join(profiles, "vigil.fdata")
    subprocess.run([bolt_tool, binary, "-instrument", f"-instrumentation-file={fdata}", "-o", counting],
                   check=True, stdout=subprocess.DEVNULL)
    train(counting, seconds, profiles)
    if not os.path.exists(fdata):
        raise SystemExit("BOLT's training wrote no profile")
    # Written beside its place and moved there once whole: a failed rewrite
    # leaves no binary that looks like a finished one.
    laid_out = binary + "-bolt"
    partial = laid_out + ".partial"
    try:
        subprocess.run([bolt_tool, binary, "-o", partial, f"-data={fdata}", "-reorder-blocks=ext-tsp",
                        "-reorder-functions=cdsort", "-split-functions", "-split-all-cold", "-split-eh",
                        "-icf=safe", "-dyno-stats"], check=True)
        os.replace(partial, laid_out)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return laid_out


def build(target_dir, rustflags, features):
    env = dict(os.environ, CARGO_TARGET_DIR=target_dir,
               RUSTFLAGS=(os.environ.get("RUSTFLAGS", "") + " " + rustflags).strip())
    extra = ["--features", features] if features else []
    subprocess.run(["cargo", "build", "--release", "-p", "vigil", *extra], cwd=ROOT, env=env, check=True)
    return os.path.join(target_dir, "release", "vigil")


def train(binary, seconds, profiles):
    d, backend = c.start_shifted_backends("vigil-pgo-", SHIFT)
    env = dict(os.environ, VIGIL_LOG="error", LLVM_PROFILE_FILE=os.path.join(profiles, "vigil-%p-%m.profraw"))
    try:
        p = subprocess.Popen([binary, "serve", "--nginx-conf", os.path.join(d, "proxy.conf"), "--threads", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        try:
            c.wait_http(f"http://127.0.0.1:{PORT}/", timeout=60)
            for what, path, args in mix(d):
                out = subprocess.run(["wrk", "-t1", "-c16", f"-d{seconds}s", *args, f"http://127.0.0.1:{PORT}{path}"],
                                     capture_output=True, text=True, timeout=seconds + 60).stdout
                sent = re.search(r"(\d+) requests in", out)
                if not sent or sent.group(1) == "0":
                    raise SystemExit(f"training: wrk sent no {what} of {path}:\n{out}")
                print(f"trained on {sent.group(1)} of {what} {path}", file=sys.stderr, flush=True)
        finally:
            # SIGTERM: vigil drains and exits, and the profile is written at exit.
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=60)
        if p.returncode != 0:
            raise SystemExit(f"the instrumented vigil exited with {p.returncode}")
    finally:
        c.stop_backends(backend)
        c.wait_port_free(PORT)
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-seconds", type=int, default=3, help="seconds of wrk for each request of the mix")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "pgo"), help="target directory of the optimized build")
    ap.add_argument("--instrumented", help="an instrumented vigil built already (skips step 1)")
    ap.add_argument("--features", default="", help="cargo features of the vigil crate, for both builds (mimalloc)")
    ap.add_argument("--bolt", action="store_true",
                    help="also lay the optimized build out again with BOLT, trained on the same mix (OUT/release/vigil-bolt)")
    a = ap.parse_args()
    profdata_tool = llvm_profdata()
    bolt_tool = llvm_bolt() if a.bolt else None
    out = os.path.abspath(a.out)
    # A BOLT build of an earlier run is not this run's (with or without
    # --bolt): it goes before anything is built.
    stale = os.path.join(out, "release", "vigil-bolt")
    if os.path.exists(stale):
        os.remove(stale)
    generate = os.path.join(ROOT, "target", "pgo-generate")
    profiles = tempfile.mkdtemp(prefix="vigil-pgo-profiles-")
    try:
        # The flag's folder stays the same (the training sets LLVM_PROFILE_FILE),
        # so cargo rebuilds the instrumented binary only when the code changed.
        binary = a.instrumented or build(generate, f"-Cprofile-generate={os.path.join(generate, 'profiles')}",
                                            a.features)
        train(binary, a.train_seconds, profiles)
        raws = glob.glob(os.path.join(profiles, "*.profraw"))
        if not raws:
            raise SystemExit("training wrote no profile")
        os.makedirs(out, exist_ok=True)
        merged = os.path.join(profiles, "merged.profdata")
        subprocess.run([profdata_tool, "merge", "-o", merged, *raws], check=True)
        # Named by its content: cargo sees the flags change with the profile
        # and builds every crate again (it does not look into the file).
        with open(merged, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        for old in glob.glob(os.path.join(out, "vigil-*.profdata")):
            os.remove(old)
        kept = os.path.join(out, f"vigil-{digest}.profdata")
        shutil.move(merged, kept)
        # BOLT moves code between functions: it needs the relocations the
        # linker would otherwise drop.
        relocs = " -Clink-arg=-Wl,--emit-relocs" if a.bolt else ""
        optimized = build(out, f"-Cprofile-use={kept}{relocs}", a.features)
        print(f"built {optimized} (profile {kept})")
        if bolt_tool:
            print(f"built {bolt(bolt_tool, optimized, a.train_seconds, profiles)} (BOLT)")
    finally:
        shutil.rmtree(profiles, ignore_errors=True)


if __name__ == "__main__":
    main()
