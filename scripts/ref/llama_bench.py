#!/usr/bin/env python3
"""Time llama.cpp (via the llama-cpp-python package) on given token ids, for `edgeprompt-bench
engine`. Prints one JSON object: prefill seconds per prompt length, decode seconds per token.

Usage: llama_bench.py MODEL.gguf IDS.json THREADS PROMPT_LENS(comma) DECODE_TOKENS REPEATS [DECODE_AT]
"""
import json
import sys
import time

import llama_cpp
from llama_cpp import Llama


def status_bytes(field):
    """A memory line of /proc/self/status (VmRSS now, VmHWM peak), bytes. Not ru_maxrss: that
    one carries the parent's peak across fork and exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    model, ids_path, threads, lens, n_decode, repeats = sys.argv[1:7]
    ids = json.load(open(ids_path))
    threads, n_decode, repeats = int(threads), int(n_decode), int(repeats)
    lens = [int(x) for x in lens.split(",")]
    # Decode after DECODE_AT tokens (default: 512, or the longest prompt if shorter).
    base = int(sys.argv[7]) if len(sys.argv) > 7 else min(512, max(lens))
    host_rss = status_bytes("VmRSS")
    llm = Llama(model_path=model, n_ctx=max(max(lens), base) + n_decode + 8, n_threads=threads,
                n_threads_batch=threads, n_batch=512, verbose=False)
    # The SIMD llama.cpp was built for, e.g. "AVX2/AVX512/AVX512_VNNI": a run with our kernels
    # held to AVX2 pairs with a llama.cpp built without AVX-512.
    # (the info reads "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | ...").
    info = llama_cpp.llama_print_system_info().decode()
    on = [p.split("=")[0].split(":")[-1].strip() for p in info.split("|") if p.strip().endswith("= 1")]
    out = {"llama_cpp_python": llama_cpp.__version__, "prefill": {}, "decode": None,
           "simd": "/".join(name for name in on if "AVX" in name)}
    # One short untimed pass first: llama.cpp maps the weights from the file, and a process that
    # times a single pass (the bench's rounds take turns with ours) would count their first touch.
    llm.eval(ids[:16])
    for n in lens:
        best = None
        for _ in range(repeats):
            llm.reset()
            llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
            t = time.perf_counter()
            llm.eval(ids[:n])
            dt = time.perf_counter() - t
            best = dt if best is None else min(best, dt)
        out["prefill"][str(n)] = best
    # Decode after `base` tokens, one token per step.
    best = None
    for _ in range(repeats):
        llm.reset()
        llm.eval(ids[:base])
        t = time.perf_counter()
        for i in range(n_decode):
            llm.eval([ids[base + i]])
        dt = (time.perf_counter() - t) / n_decode
        best = dt if best is None else min(best, dt)
    out["decode"] = best
    out["decode_context"] = base
    # Peak of the process less what Python held before the model (llama-cpp-python's own
    # n_batch x vocab f32 score buffer stays in: it is part of running llama.cpp this way).
    out["rss_bytes"] = status_bytes("VmHWM") - host_rss
    print(json.dumps(out))


if __name__ == "__main__":
    main()
