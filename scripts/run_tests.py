#!/usr/bin/env python3
"""Build the workspace's test binaries once, then run them two at a time.

    python3 scripts/run_tests.py [--lanes N] [-- ARGS FOR EVERY TEST BINARY]

`cargo test` runs its binaries one after another, and many of ours spend their time waiting on
processes, sockets and simulated links rather than on the cores: a second lane fills that time.
Each binary runs as cargo would run it (from its package's directory, with cargo's variables),
its output is printed whole when it ends, every binary runs even after a failure, and the
script fails if any did. No test relies on running alone: the suite passes with its cores
loaded by other work.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

# Started first, longest first, so the lanes end together (measured on a 2-core Zen 4).
SLOW_FIRST = ["split_exact", "edge", "soak", "failover", "fleet", "smoke"]


def build(cargo):
    cmd = [cargo, "test", "-j2", "--release", "--workspace", "--no-run",
           "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"[tests] build failed (exit {out.returncode})")
    bins = []
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        name = target["name"]
        if target["kind"] != ["test"]:
            name = f"{name} ({target['kind'][0]} tests)"
        bins.append({
            "name": name,
            "target": target["name"],
            "exe": msg["executable"],
            "dir": os.path.dirname(msg["manifest_path"]),
            "package": package_name(msg["package_id"]),
        })
    return bins


def package_name(pkg_id):
    """`path+file:///w/crates/edge#edgeprompt-edge@0.1.0`, or `...#0.1.0` where the directory
    is the name, or the old `name 0.1.0 (path+file:///...)`."""
    if "#" not in pkg_id:
        return pkg_id.split()[0]
    url, frag = pkg_id.split("#", 1)
    return frag.split("@")[0] if "@" in frag else url.rstrip("/").rsplit("/", 1)[-1]


def order(bins):
    rank = {n: i for i, n in enumerate(SLOW_FIRST)}
    return sorted(bins, key=lambda b: rank.get(b["target"], len(SLOW_FIRST)))


def run_one(b, args, cargo, lock):
    env = dict(os.environ, CARGO=cargo, CARGO_MANIFEST_DIR=b["dir"], CARGO_PKG_NAME=b["package"])
    t = time.monotonic()
    p = subprocess.run([b["exe"], *args], cwd=b["dir"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    b["secs"] = time.monotonic() - t
    b["rc"] = p.returncode
    with lock:
        status = "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode})"
        print(f"[tests] {b['package']} {b['name']}: {status} in {b['secs']:.0f} s", flush=True)
        sys.stdout.buffer.write(p.stdout)
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("args", nargs="*", help="passed to every test binary")
    a = ap.parse_args()
    cargo = os.environ.get("CARGO", "cargo")
    bins = order(build(cargo))
    queue = list(bins)
    lock = threading.Lock()

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            run_one(b, a.args, cargo, lock)

    t = time.monotonic()
    lanes = [threading.Thread(target=lane) for _ in range(max(1, a.lanes))]
    for l in lanes:
        l.start()
    for l in lanes:
        l.join()
    failed = [b for b in bins if b["rc"] != 0]
    slow = sorted(bins, key=lambda b: -b["secs"])[:6]
    print(f"[tests] {len(bins)} binaries in {time.monotonic() - t:.0f} s on {a.lanes} lanes; "
          "slowest: " + ", ".join(f"{b['name']} {b['secs']:.0f} s" for b in slow), flush=True)
    if failed:
        print(f"[tests] {len(failed)} failed:", file=sys.stderr)
        for b in failed:
            print(f"  {b['package']} {b['name']} (exit {b['rc']}): {b['exe']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
