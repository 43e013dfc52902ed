"""Capture today's wire bytes from the Rust cloud, as fixtures a Rust test decodes (and
re-encodes to the same bytes) with the types generated from the .proto.

    python capture_wire.py [--binary target/release/edgeprompt] [--model smollm2]
                           [--out tests/fixtures/wire]

Starts `edgeprompt cloud` on one short text prompt with a fixed signing key, then with raw gRPC
calls (bytes in, bytes out: nothing re-encoded on the way) keeps a ListRequest and its reply,
and FetchRequests for f16 and int4ch with zstd, each with its header and first 3 chunks. Writes
one message per `<name>.bin` and `index.json` (file -> message type), then checks them: every
file parses and re-serializes to the same bytes, CRCs hold, and the list's and the captured
layers' signatures verify.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
from nacl.signing import SigningKey  # noqa: E402

import epkv  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
PROMPT_ID = "tiny"
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog."
# A fixed key: a capture made again from the same binary signs the same way.
SEED = bytes(range(32))
CHUNKS_KEPT = 3
SERVICE = "/edgeprompt.v1.CloudKv/"


def fingerprint(binary: str, model: str) -> str:
    out = subprocess.run([binary, "info", "--model", model], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["fingerprint"]


def start_cloud(binary: str, model: str, tmp: str):
    """The cloud on a port of its choosing; returns (process, port) once it listens."""
    prompts = os.path.join(tmp, "prompts.toml")
    with open(prompts, "w") as f:
        f.write(f'[[prompt]]\nid = "{PROMPT_ID}"\ntext = "{PROMPT_TEXT}"\n')
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    fd = os.open(os.path.join(data, "cloud.key"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (SEED.hex() + "\n").encode())
    os.close(fd)
    env = {k: v for k, v in os.environ.items() if k != "EDGEPROMPT_CLOUD_SIGNING_KEY"}
    proc = subprocess.Popen(
        [binary, "cloud", "--model", model, "--prompts", prompts, "--listen", "127.0.0.1:0",
         "--data-dir", data],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # It says where it listens on stderr: "cloud serving N prompt(s) on 127.0.0.1:PORT (...".
    found = threading.Event()
    port = []

    def read():
        for line in proc.stderr:
            m = re.search(r"cloud serving .* on 127\.0\.0\.1:(\d+)", line)
            if m and not port:
                port.append(int(m.group(1)))
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(120) or not port:
        proc.kill()
        raise SystemExit("the cloud did not start listening")
    return proc, port[0]


def capture(port: int, pb, fp: str) -> dict:
    """name -> (message type, raw bytes)."""
    files = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=60)
        # No serializers: requests go as the bytes given, replies come back as received.
        list_call = ch.unary_unary(SERVICE + "List", request_serializer=None,
                                   response_deserializer=None)
        fetch_call = ch.unary_stream(SERVICE + "Fetch", request_serializer=None,
                                     response_deserializer=None)
        req = pb.ListRequest(model_fingerprint=fp).SerializeToString()
        files["list_request"] = ("edgeprompt.v1.ListRequest", req)
        files["list_reply"] = ("edgeprompt.v1.ListReply", list_call(req, timeout=60))
        for codec in ("f16", "int4ch"):
            req = pb.FetchRequest(id=PROMPT_ID, model_fingerprint=fp, accept_codecs=[codec],
                                  accept_zstd=True).SerializeToString()
            files[f"fetch_request_{codec}"] = ("edgeprompt.v1.FetchRequest", req)
            stream = fetch_call(req, timeout=120)
            for i, raw in enumerate(stream):
                files[f"fetch_{codec}_{i:03}"] = ("edgeprompt.v1.FetchMessage", raw)
                if i == CHUNKS_KEPT:
                    stream.cancel()
                    break
    return files


def check(files: dict, pb, fp: str) -> list[str]:
    """What a Rust test will rely on, checked here first."""
    key = SigningKey(SEED).verify_key
    types = {"edgeprompt.v1." + n: getattr(pb, n)
             for n in ("ListRequest", "ListReply", "FetchRequest", "FetchMessage")}
    msgs = {}
    for name, (typ, raw) in files.items():
        m = types[typ].FromString(raw)
        # Every field known to the .proto (none kept as unknown) and the bytes canonical.
        m.DiscardUnknownFields()
        if m.SerializeToString() != raw:
            raise SystemExit(f"{name}: re-encoding gives other bytes")
        msgs[name] = m
    notes = []
    reply = msgs["list_reply"]
    entries = [(p.id, p.tokens, p.content_address.hex()) for p in reply.prompts]
    key.verify(epkv.list_statement(fp, entries), reply.signature)
    assert reply.signing_key == bytes(key)
    notes.append(f"list: {entries[0][0]} {entries[0][1]} tokens, signature verified")
    for codec in ("f16", "int4ch"):
        h = msgs[f"fetch_{codec}_000"].header
        address = epkv.content_address(fp, list(h.token_ids))
        assert h.codec == codec and h.compressed and h.content_address.hex() == address
        m = epkv.Manifest(h.prompt_id, fp, address, h.n_layers, h.n_kv_head, h.head_dim,
                          h.first_layer, h.values_codec or h.codec, h.mapped)
        # A hybrid model (--model a qwen35 or lfm2 GGUF): its recurrent layers carry states.
        recurrent, floats = [], None
        if h.HasField("state_shape"):
            recurrent, floats = list(h.state_shape.layers), epkv.state_floats(h.state_shape)
        re_ = epkv.Reassembler(h.n_layers, len(h.token_ids), h.n_kv_head, h.head_dim, codec,
                               starts=list(h.layer_starts), recurrent=recurrent,
                               state_floats=floats)
        sealed = 0
        for i in range(1, CHUNKS_KEPT + 1):
            c = msgs[f"fetch_{codec}_{i:03}"].chunk
            assert c.checksum == epkv.chunk_checksum(c.layer, c.start, c.end, c.codec,
                                                     c.compressed, c.payload, c.state), (codec, i)
            done = re_.push(c)
            if done:
                l, layer = done
                key.verify(m.statement(l, layer.digest(len(h.token_ids))), c.layer_seal)
                sealed += 1
        notes.append(f"{codec}+zstd: header ({len(h.token_ids)} tokens, {h.n_layers} layers) "
                     f"and {CHUNKS_KEPT} chunks: CRCs hold, {sealed} layer seals verified")
    return notes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/edgeprompt"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/wire"))
    a = ap.parse_args()
    pb, _ = epkv.load_stubs(os.path.join(ROOT, "proto"))
    fp = fingerprint(a.binary, a.model)
    with tempfile.TemporaryDirectory(prefix="edgeprompt-capture-") as tmp:
        proc, port = start_cloud(a.binary, a.model, tmp)
        try:
            files = capture(port, pb, fp)
        finally:
            proc.send_signal(signal.SIGINT)  # the cloud stops on ctrl-c
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    notes = check(files, pb, fp)
    os.makedirs(a.out, exist_ok=True)
    for old in glob.glob(os.path.join(a.out, "*.bin")):
        os.remove(old)
    index = {}
    for name, (typ, raw) in files.items():
        with open(os.path.join(a.out, f"{name}.bin"), "wb") as f:
            f.write(raw)
        index[f"{name}.bin"] = typ
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(len(raw) for _, raw in files.values())
    print(f"wrote {len(files)} messages ({total} bytes) and index.json to {a.out}")
    for n in notes:
        print("  " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
