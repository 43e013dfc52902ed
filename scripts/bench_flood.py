#!/usr/bin/env python3
"""Slow and never-reading clients against `edgeprompt serve`, on loopback, bounded.

A flood from 127.0.0.2 (FLOOD connections: half of them send half a request's headers and
hold, half send a streamed chat and never read) runs for SECS seconds while a normal client on
127.0.0.1 sends a chat every INTERVAL seconds; then the flood goes and the server idles for
10 s. Printed: the machine, the model and settings, each normal chat's latency during the
flood, and the server's RSS before, at the flood's peak and 10 s after it. The same run is
made twice: with the connection bounds off (what the edge did without them) and on (the
defaults).

    python3 scripts/bench_flood.py [--model smollm2] [--flood 1000] [--secs 40] [--out F]

Needs the release binary (cargo build -j2 --release --bin edgeprompt) and the model. `--out`
writes the run as JSON (`edgeprompt-bench report` shows docs/results/*/flood.json).
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "edgeprompt")

UNBOUNDED = ["--header-timeout-secs", "100000", "--write-stall-secs", "100000",
             "--max-connections-per-peer", "100000", "--max-connections", "100000"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


MODEL = "smollm2"
SYSTEM = "You are a helpful assistant."


def chat_body(stream, max_tokens, system):
    return json.dumps({
        "model": MODEL, "stream": stream, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "Say something about trains."}],
    }).encode()


def request(path, body):
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def normal_chat(port, timeout):
    """One chat from 127.0.0.1: seconds to the whole answer, or None if it failed."""
    t = time.time()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(request("/v1/chat/completions",
                          chat_body(False, 8, SYSTEM)).replace(
                              b"HTTP/1.1\r\n", b"HTTP/1.1\r\nconnection: close\r\n", 1))
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
        s.close()
        return time.time() - t if out.startswith(b"HTTP/1.1 200") else None
    except OSError:
        return None


def flood(port, n, stop, held):
    """n connections from 127.0.0.2: half with half-sent headers, half never reading."""
    for i in range(n):
        if stop.is_set():
            return
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind(("127.0.0.2", 0))
            s.settimeout(2)
            s.connect(("127.0.0.1", port))
            if i % 2 == 0:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            else:
                # The normal client's own system message: admitted, not refused as a new
                # prompt to compute, so these streams take places in the batch.
                s.sendall(request("/v1/chat/completions",
                                  chat_body(True, 256, SYSTEM)))
            held.append(s)
        except OSError:
            pass


def run(args, bounded):
    port = free_port()
    cmd = [BIN, "serve", "--model", args.model, "--listen", f"127.0.0.1:{port}"]
    if not bounded:
        cmd += UNBOUNDED
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        for _ in range(3):
            normal_chat(port, 30)
        before = rss_mb(server.pid)
        stop, held = threading.Event(), []
        f = threading.Thread(target=flood, args=(port, args.flood, stop, held), daemon=True)
        t0 = time.time()
        f.start()
        lat, failed, peak = [], 0, before
        while time.time() - t0 < args.secs:
            x = normal_chat(port, 60)
            if x is None:
                failed += 1
            else:
                lat.append(x)
            peak = max(peak, rss_mb(server.pid))
            time.sleep(args.interval)
        stop.set()
        f.join()
        still = 0
        for s in held:
            try:
                s.setblocking(False)
                if s.recv(1) != b"":
                    still += 1
            except BlockingIOError:
                still += 1
            except OSError:
                pass
        for s in held:
            s.close()
        time.sleep(10)
        after = rss_mb(server.pid)
        return {"bounded": bounded, "latency": lat, "failed": failed, "before": before,
                "peak": peak, "after": after, "held": len(held), "still_open": still}
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--flood", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=40)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--out", help="write the run as JSON here")
    args = ap.parse_args()
    global MODEL
    MODEL = args.model
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    print(f"machine: {cpu}, {os.cpu_count()} cores; model {args.model}; flood {args.flood} "
          f"connections from 127.0.0.2 (half half-sent headers, half never-reading streams of "
          f"256 tokens on the normal client's system message) for {args.secs:.0f} s; a normal chat (8 tokens) every {args.interval} s "
          f"from 127.0.0.1")
    runs = []
    for bounded in (False, True):
        r = run(args, bounded)
        runs.append(r)
        lat = sorted(r["latency"])
        name = "bounds on (defaults)" if bounded else "bounds off"
        if lat:
            p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
            print(f"{name}: {len(lat)} normal chats answered, {r['failed']} failed; latency "
                  f"median {statistics.median(lat):.2f} s, p90 {p(0.9):.2f} s, max {lat[-1]:.2f} s; "
                  f"RSS {r['before']:.0f} MB before, {r['peak']:.0f} MB peak, {r['after']:.0f} MB "
                  f"10 s after ({(r['after'] / r['before'] - 1) * 100:+.0f} %); flood connections "
                  f"made {r['held']}, still open at its end {r['still_open']}")
        else:
            print(f"{name}: no normal chat answered ({r['failed']} failed)")
    if args.out:
        info = open("/proc/cpuinfo").read()
        field = lambda k: next((l.split(":", 1)[1].strip() for l in info.splitlines()
                                if l.split(":", 1)[0].strip() == k), "?")
        flags = field("flags").split()
        simd = [n for f, n in (("avx2", "avx2"), ("avx512f", "avx512f"),
                               ("avx512_vnni", "avx512vnni")) if f in flags]
        git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip()
        rev = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain",
                                                                      "--untracked-files=no") else "")
        machine = {"cpu": f"{cpu} (family {field('cpu family')}, model {field('model')})",
                   "cores": os.cpu_count(), "simd": simd,
                   "kernels": "avx512" if "avx512f" in simd else "avx2", "git_rev": rev}
        with open(args.out, "w") as f:
            json.dump({"machine": machine,
                       "model": args.model, "flood": args.flood, "secs": args.secs,
                       "interval": args.interval, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
