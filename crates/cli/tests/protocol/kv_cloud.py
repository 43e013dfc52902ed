"""A cloud written in Python from the protocol alone: serves one prompt's KV from an EPKV file,
signed with a given Ed25519 seed, in f16 without zstd; for a hybrid model (an EPKV of version
2), its recurrent layers' states too, one chunk each, sealed with the state digest. Our Rust
edge fetching from it must give the single-node answer, and must refuse the stream when
`forge_layer` alters a layer (its KV, or its state) after signing.

    python kv_cloud.py CONFIG.json

CONFIG keys: listen ("127.0.0.1:0" picks a port, printed as a line `PORT <n>`), export (EPKV
path: whole, exact f16 values), seed_hex (the 32-byte Ed25519 seed, hex), proto_dir, optional
forge_layer (int) and stubs_dir (where the generated stubs go). A hybrid model's export
(version 2) names its states' shape, which the header repeats.
Runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import dataclasses
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

    def __init__(self, path: str, forge_layer: int | None, pb):
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
        self.state_shape = header_state_shape(pb, m)
        # Digests of what is signed: the values (a recurrent layer's state) as they are now,
        # before any forgery.
        self.digests = {l: layer.digest(self.n) for l, layer in self.layers.items()}
        if forge_layer is not None:
            self.layers[forge_layer] = forged(self.layers[forge_layer])


def forged(layer: epkv.Layer) -> epkv.Layer:
    """The layer changed as little as a value can be, after its digest was taken: the seal
    stays that of the true layer, so a correct edge refuses this one."""
    if layer.state is not None:
        # One state float's lowest mantissa bit: one ulp, still finite.
        data = bytearray(layer.state.data)
        data[4 * (len(data) // 8)] ^= 0x01
        return dataclasses.replace(layer, state=dataclasses.replace(layer.state, data=bytes(data)))
    # One value one f16 ulp up.
    k = layer.k.copy()
    bits = k.view(np.uint16).reshape(-1)
    i = int(np.flatnonzero((bits & 0x7FFF) < 0x7BFF)[0])  # finite, not the largest
    bits[i] += 1
    return dataclasses.replace(layer, k=k)


def header_state_shape(pb, meta: dict):
    """The header's StateShape, as the export names it (its states must be of that shape's
    size); None for a model without recurrent layers."""
    have = meta.get("state_shape")
    if have is None:
        return None
    fields = {f: have[f] for f in ("conv_kernel", "k_heads", "v_heads", "head_dim",
                                   "conv_channels")}
    out = pb.StateShape(layers=have["layers"], kind=pb.StateKind.Value(have["kind"]), **fields)
    if epkv.state_floats(out) != (have["conv_floats"], have["matrix_floats"]):
        raise epkv.ProtocolError(f"state_shape {have} does not size its own states")
    return out


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
            values_codec="" if values_codec == "f16" else values_codec,
            state_shape=p.state_shape))
        for l in range(first, m["n_layers"]):
            sig = self.key.sign(manifest.statement(l, p.digests[l])).signature
            for chunk in self.chunks(l, p.layers[l], sig):
                yield pb.FetchMessage(chunk=chunk)

    def chunks(self, l: int, layer: epkv.Layer, sig: bytes):
        """Layer l's chunks of CHUNK_TOKENS positions, the seal on the last; a recurrent layer
        is one chunk at the prompt's end, no positions, its state (never compressed)."""
        pb, n = self.pb, self.p.n
        if layer.state is not None:
            state = layer.state.data
            yield pb.WireChunk(layer=l, start=n, end=n, codec="f16", compressed=False,
                               payload=b"", state=state, layer_seal=sig,
                               checksum=epkv.chunk_checksum(l, n, n, "f16", False, b"", state))
            return
        s0 = s = layer.start
        while True:  # at least one chunk, even for an empty prompt (as stream.rs)
            e = min(s + epkv.CHUNK_TOKENS, n)
            payload = epkv.encode_f16(layer.k[:, s - s0 : e - s0], layer.v[:, s - s0 : e - s0])
            last = e >= n
            yield pb.WireChunk(
                layer=l, start=s, end=e, codec="f16", compressed=False, payload=payload,
                checksum=epkv.chunk_checksum(l, s, e, "f16", False, payload),
                layer_seal=sig if last else b"")
            s = e
            if last:
                break


def main() -> int:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    pb, pb_grpc = epkv.load_stubs(cfg["proto_dir"], cfg.get("stubs_dir"))
    prompt = Prompt(cfg["export"], cfg.get("forge_layer"), pb)
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
