"""A cloud written in Python from the protocol alone: serves one prompt's KV from an EPKV file,
signed with a given Ed25519 seed, in f16 without zstd. Our Rust edge fetching from it must give
the single-node answer, and must refuse the stream when `forge_layer` alters a layer after
signing.

    python kv_cloud.py CONFIG.json

CONFIG keys: listen ("127.0.0.1:0" picks a port, printed as a line `PORT <n>`), export (EPKV
path: whole, exact f16 values), seed_hex (the 32-byte Ed25519 seed, hex), proto_dir, optional
forge_layer (int) and stubs_dir (where the generated stubs go).
Runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from nacl.signing import SigningKey  # noqa: E402

import epkv  # noqa: E402


class Prompt:
    """The one prompt served: its metadata, values, per-layer digests (of the true values)."""

    def __init__(self, path: str, forge_layer: int | None):
        e = epkv.read_epkv(path)
        self.meta, self.layers = e.meta, e.layers
        m = self.meta
        self.token_ids = list(m["token_ids"])
        self.n = len(self.token_ids)
        self.starts = list(m.get("layer_starts") or [0] * m["n_layers"])
        # A cloud sends its own values: f16, as the edge asked (a relayed codec is a peer's).
        if m["codec"] != "f16" or m.get("mapped") or m.get("first_layer", 0) != 0:
            raise epkv.ProtocolError(f"{path}: this cloud serves whole, exact f16 exports only")
        self.address = epkv.content_address(m["fingerprint"], self.token_ids)
        if self.address != m["address"]:
            raise epkv.ProtocolError(f"{path}: address {m['address']} is not its ids' {self.address}")
        # Digests of what is signed: the values as they are now, before any forgery.
        self.digests = {l: epkv.layer_digest(self.starts[l], self.n, k, v)
                        for l, (k, v) in self.layers.items()}
        if forge_layer is not None:
            # One value one f16 ulp up, after the digests were taken: the seal stays that of
            # the true layer, so a correct edge refuses this one.
            k, v = self.layers[forge_layer]
            k = k.copy()
            bits = k.view(np.uint16).reshape(-1)
            i = int(np.flatnonzero((bits & 0x7FFF) < 0x7BFF)[0])  # finite, not the largest
            bits[i] += 1
            self.layers[forge_layer] = (k, v)


class CloudKv:
    """The service, in the order service.rs checks a fetch: fingerprint, prompt, codec, layer."""

    def __init__(self, pb, prompt: Prompt, key: SigningKey):
        self.pb, self.p, self.key = pb, prompt, key

    def List(self, req, ctx):
        m = self.p.meta
        if req.model_fingerprint != m["fingerprint"]:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "this cloud serves no KV to a model of that fingerprint")
        entries = [(m["prompt_id"], self.p.n, self.p.address)]
        sig = self.key.sign(epkv.list_statement(req.model_fingerprint, entries)).signature
        issued, max_age = int(time.time() * 1000), 300
        fresh = self.key.sign(epkv.fresh_list_statement(
            req.model_fingerprint, entries, issued, max_age)).signature
        return self.pb.ListReply(
            prompts=[self.pb.PromptInfo(id=i, tokens=t, content_address=bytes.fromhex(a))
                     for i, t, a in entries],
            signing_key=bytes(self.key.verify_key), signature=sig,
            issued_unix_ms=issued, max_age_secs=max_age, fresh_signature=fresh)

    def Fetch(self, req, ctx):
        pb, p, m = self.pb, self.p, self.p.meta
        if req.model_fingerprint != m["fingerprint"]:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "model fingerprint mismatch")
        which = req.WhichOneof("prompt")
        if which is None:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request names no cloud prompt")
        if (which == "id" and req.id != m["prompt_id"]) or \
                (which == "content_address" and req.content_address.hex() != p.address):
            ctx.abort(grpc.StatusCode.NOT_FOUND, "no such cloud prompt")
        # This cloud speaks f16 only; an empty list means f16.
        if req.accept_codecs and "f16" not in req.accept_codecs:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"no supported codec in {list(req.accept_codecs)}")
        first = req.first_layer
        if first >= m["n_layers"]:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"first layer {first} of a {m['n_layers']}-layer model")
        if first < m["first_layer"]:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"this cloud holds layers from {m['first_layer']} on only")
        values_codec = m["codec"]
        manifest = epkv.Manifest(m["prompt_id"], m["fingerprint"], p.address, m["n_layers"],
                                 m["n_kv_head"], m["head_dim"], first, values_codec,
                                 bool(m["mapped"]))
        yield pb.FetchMessage(header=pb.Header(
            prompt_id=m["prompt_id"], content_address=bytes.fromhex(p.address),
            token_ids=p.token_ids, n_layers=m["n_layers"], n_kv_head=m["n_kv_head"],
            head_dim=m["head_dim"], codec="f16", compressed=False,
            model_fingerprint=m["fingerprint"], first_layer=first,
            # Empty means every layer from 0, as the Rust cloud sends for a model without
            # sliding windows.
            layer_starts=p.starts if any(p.starts) else [],
            mapped=bool(m["mapped"]),
            # Values decoded from another codec (signed as such) are relayed as f16.
            values_codec="" if values_codec == "f16" else values_codec))
        for l in range(first, m["n_layers"]):
            k, v = p.layers[l]
            s0 = p.starts[l]
            sig = self.key.sign(manifest.statement(l, p.digests[l])).signature
            s = s0
            while True:  # at least one chunk, even for an empty prompt (as stream.rs)
                e = min(s + epkv.CHUNK_TOKENS, p.n)
                payload = epkv.encode_f16(k[:, s - s0 : e - s0], v[:, s - s0 : e - s0])
                last = e >= p.n
                yield pb.FetchMessage(chunk=pb.WireChunk(
                    layer=l, start=s, end=e, codec="f16", compressed=False, payload=payload,
                    checksum=epkv.chunk_checksum(l, s, e, "f16", False, payload),
                    layer_seal=sig if last else b""))
                s = e
                if last:
                    break


def main() -> int:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    pb, pb_grpc = epkv.load_stubs(cfg["proto_dir"], cfg.get("stubs_dir"))
    prompt = Prompt(cfg["export"], cfg.get("forge_layer"))
    key = SigningKey(bytes.fromhex(cfg["seed_hex"].strip()))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_send_message_length", 256 << 20)])
    service = CloudKv(pb, prompt, key)
    # The generated servicer base class wires the method names; ours supplies the bodies.
    servicer = type("Servicer", (pb_grpc.CloudKvServicer,),
                    {"List": service.List, "Fetch": service.Fetch})()
    pb_grpc.add_CloudKvServicer_to_server(servicer, server)
    port = server.add_insecure_port(cfg["listen"])
    if port == 0:
        print(f"cannot listen on {cfg['listen']}", file=sys.stderr)
        return 1
    server.start()
    print(f"PORT {port}", flush=True)
    print(f"python cloud: {prompt.meta['prompt_id']} ({prompt.n} tokens) on port {port}, key "
          f"{bytes(key.verify_key).hex()[:16]}, forged layer {cfg.get('forge_layer')}",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
