"""An edge written in Python from the protocol alone: fetches one cloud prompt in every codec,
with zstd off and on, and checks everything a correct edge must check, then that a forgery
fails its seal. A hybrid model's stream (the header's state_shape) has its recurrent layers'
states checked likewise: their seals, their bytes against the export, forged and malformed
states. Exits non-zero on any mismatch.

    python kv_client.py CONFIG.json [--codecs f16,int8] [--allow-missing-exports]
                                    [--dump-epkv DIR]

CONFIG keys: cloud ("127.0.0.1:PORT"), prompt_id, fingerprint (the model's SHA-256, hex),
cloud_pub (path of cloud.pub: the cloud's Ed25519 key, hex), exports (codec -> EPKV file our
Rust edge wrote after fetching that codec), proto_dir (holding edgeprompt/v1/cloud_kv.proto),
protocol_doc (optional: docs/protocol.md, whose worked example is recomputed here), stubs_dir
(optional: where the generated stubs go).

--codecs: only these (a cloud that speaks f16 only, like kv_cloud.py).
--allow-missing-exports: a codec without an export is only compared zstd off against zstd on.
--dump-epkv DIR: write each codec's decoded KV as DIR/<codec>.epkv (what kv_cloud.py serves).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from nacl.exceptions import BadSignatureError  # noqa: E402
from nacl.signing import SigningKey, VerifyKey  # noqa: E402

import epkv  # noqa: E402
from epkv import ProtocolError  # noqa: E402


def fail(msg: str) -> None:
    raise ProtocolError(msg)


def verifies(key: VerifyKey, message: bytes, sig: bytes) -> bool:
    try:
        key.verify(message, sig)
        return True
    except (BadSignatureError, ValueError):
        return False


def check_list(stub, pb, cfg, key: VerifyKey) -> dict:
    """List: signed by the cloud's key for this fingerprint; returns the prompt's entry."""
    reply = stub.List(pb.ListRequest(model_fingerprint=cfg["fingerprint"]), timeout=30)
    if reply.signing_key != bytes(key):
        fail(f"the list's key {reply.signing_key.hex()} is not cloud.pub {bytes(key).hex()}")
    entries = [(p.id, p.tokens, p.content_address.hex()) for p in reply.prompts]
    if not verifies(key, epkv.list_statement(cfg["fingerprint"], entries), reply.signature):
        fail("the list's signature does not verify")
    # The signature covers this fingerprint only: the same list for another model must fail.
    if verifies(key, epkv.list_statement("0" * 64, entries), reply.signature):
        fail("the list's signature verifies for another fingerprint")
    # The fresh signature binds the issue time and maximum age too.
    fresh = epkv.fresh_list_statement(cfg["fingerprint"], entries, reply.issued_unix_ms,
                                      reply.max_age_secs)
    if not reply.issued_unix_ms or not verifies(key, fresh, reply.fresh_signature):
        fail("the list carries no issue time its fresh signature verifies")
    stale = epkv.fresh_list_statement(cfg["fingerprint"], entries, reply.issued_unix_ms - 1,
                                      reply.max_age_secs)
    if verifies(key, stale, reply.fresh_signature):
        fail("the fresh signature verifies for another issue time")
    mine = [p for p in reply.prompts if p.id == cfg["prompt_id"]]
    if len(mine) != 1 or len(mine[0].content_address) != 32:
        fail(f"prompt {cfg['prompt_id']!r} not listed once with a 32-byte address: {entries}")
    return {"tokens": mine[0].tokens, "address": mine[0].content_address.hex(),
            "listed": len(entries)}


def state_shape(h) -> dict | None:
    """The header's StateShape (the kind by its enum name) and its states' float counts, as an
    export names them (None for a model without recurrent layers)."""
    if not h.HasField("state_shape"):
        return None
    s = h.state_shape
    conv, matrix = epkv.state_floats(s)
    return {"layers": list(s.layers), "kind": type(h).DESCRIPTOR.file.enum_types_by_name[
                "StateKind"].values_by_number[s.kind].name,
            "conv_kernel": s.conv_kernel, "k_heads": s.k_heads, "v_heads": s.v_heads,
            "head_dim": s.head_dim, "conv_channels": s.conv_channels,
            "conv_floats": conv, "matrix_floats": matrix}


def reassembler(h, first_layer: int = 0, codec: str | None = None) -> epkv.Reassembler:
    """A reassembler for the stream `h` heads, from `first_layer` on (in another codec than
    the header's: a chunk forged here in f16)."""
    shape = state_shape(h)
    return epkv.Reassembler(
        h.n_layers, len(h.token_ids), h.n_kv_head, h.head_dim, codec or h.codec,
        first_layer=first_layer,
        starts=list(h.layer_starts), recurrent=shape["layers"] if shape else [],
        state_floats=(shape["conv_floats"], shape["matrix_floats"]) if shape else None)


def fetch(stub, pb, cfg, codec: str, zstd: bool, key: VerifyKey, listed: dict):
    """One stream, checked as the Rust edge checks it (client.rs check_header, chunk.rs
    Reassembler, seal.rs verify_layer). Returns (header, manifest, {layer: Layer}, seals,
    stats)."""
    req = pb.FetchRequest(id=cfg["prompt_id"], model_fingerprint=cfg["fingerprint"],
                          accept_codecs=[codec], accept_zstd=zstd)
    stream = stub.Fetch(req, timeout=120)
    first = next(stream)
    if first.WhichOneof("body") != "header":
        fail("the first message is not a header")
    h = first.header
    where = f"{codec}{'+zstd' if zstd else ''}"
    address = epkv.content_address(h.model_fingerprint, list(h.token_ids))
    if h.model_fingerprint != cfg["fingerprint"] or h.first_layer != 0 or h.mapped:
        fail(f"{where}: header of another model or layout: {h}")
    if h.prompt_id != cfg["prompt_id"] or h.content_address.hex() != address:
        fail(f"{where}: the header's id or address is not the prompt's ({h.prompt_id})")
    if address != listed["address"] or len(h.token_ids) != listed["tokens"]:
        fail(f"{where}: the header's ids hash to {address}, the list said {listed['address']}")
    # The cloud streams the one codec asked for; zstd only if accepted (a cloud may decline).
    if h.codec != codec or (h.compressed and not zstd):
        fail(f"{where}: header codec {h.codec!r}, compressed {h.compressed}")
    # From a cloud, the values are the codec's own (a relayed codec comes only from peers).
    if h.values_codec not in ("", h.codec):
        fail(f"{where}: a cloud's values decoded from {h.values_codec!r}, streamed as {h.codec!r}")
    manifest = epkv.Manifest(h.prompt_id, h.model_fingerprint, address, h.n_layers, h.n_kv_head,
                             h.head_dim, 0, h.values_codec or h.codec, h.mapped)
    re = reassembler(h)
    layers, seals = {}, {}
    stats = {"chunks": 0, "wire_bytes": 0, "max_positions": 0, "states": 0, "state_bytes": 0}
    for msg in stream:
        if msg.WhichOneof("body") != "chunk":
            fail(f"{where}: a second header")
        c = msg.chunk
        stats["chunks"] += 1
        stats["wire_bytes"] += len(c.payload)
        stats["max_positions"] = max(stats["max_positions"], c.end - c.start)
        stats["states"] += bool(c.state)
        stats["state_bytes"] += len(c.state)
        # A chunk of no positions has an empty payload, never compressed.
        empty = c.start == c.end
        if c.compressed != (h.compressed and not empty) or (empty and c.payload):
            fail(f"{where}: chunk {c.start}..{c.end} compressed={c.compressed} "
                 f"({len(c.payload)} bytes) in a stream of {h.compressed}")
        want = epkv.chunk_checksum(c.layer, c.start, c.end, c.codec, c.compressed, c.payload,
                                   c.state)
        if want != c.checksum:
            fail(f"{where}: layer {c.layer} {c.start}..{c.end}: CRC {c.checksum:08x}, want {want:08x}")
        done = re.push(c)
        # The seal rides on a layer's last chunk; one on another chunk is ignored.
        if done is None:
            continue
        if not c.layer_seal:
            fail(f"{where}: layer {c.layer} ends without a seal")
        l, layer = done
        # Checked the moment the layer is complete, before anything would attend to it; a
        # recurrent layer's seal is of its state.
        if not verifies(key, manifest.statement(l, layer.digest(len(h.token_ids))), c.layer_seal):
            fail(f"{where}: layer {l}: the seal does not verify")
        layers[l], seals[l] = layer, c.layer_seal
    if not re.complete():
        fail(f"{where}: the stream ended after {re.next_layer} of {h.n_layers} layers")
    return h, manifest, layers, seals, stats


def compare_export(path: str, h, layers, where: str) -> None:
    """Bit for bit against what our Rust edge decoded from the same stream."""
    e = epkv.read_epkv(path)
    m = e.meta
    want = {"prompt_id": h.prompt_id, "fingerprint": h.model_fingerprint,
            "address": h.content_address.hex(), "token_ids": list(h.token_ids),
            "n_layers": h.n_layers, "n_kv_head": h.n_kv_head, "head_dim": h.head_dim,
            "first_layer": 0, "codec": h.values_codec or h.codec, "mapped": False}
    for k, v in want.items():
        if m.get(k) != v:
            fail(f"{where}: export {path}: {k} = {m.get(k)!r}, the stream says {v!r}")
    starts = list(h.layer_starts) or [0] * h.n_layers
    if m["layer_starts"] != starts:
        fail(f"{where}: export layer_starts {m['layer_starts']}, the stream's {starts}")
    # Version 2 exactly when the stream has states, naming the same layers and sizes.
    if m.get("state_shape") != state_shape(h):
        fail(f"{where}: export state_shape {m.get('state_shape')}, the stream's {state_shape(h)}")
    for l, layer in layers.items():
        mine = e.layers[l]
        if mine.same(layer):
            continue
        if mine.state != layer.state:
            a, b = mine.state.floats(), layer.state.floats()
            diff = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
            fail(f"{where}: layer {l}: {diff.size} state floats differ from {path} "
                 f"(first at {diff[0]})")
        diff = np.flatnonzero(np.concatenate([
            (mine.k.view(np.uint16) != layer.k.view(np.uint16)).ravel(),
            (mine.v.view(np.uint16) != layer.v.view(np.uint16)).ravel()]))
        fail(f"{where}: layer {l}: {diff.size} values differ from {path} (first at {diff[0]})")


def forgeries(key: VerifyKey, h, manifest, layers, seals, pb) -> int:
    """A correct seal check refuses every one of these; returns how many were refused."""
    n = len(h.token_ids)
    # A layer holding positions (a hybrid model's states are forged in state_forgeries).
    kv = [i for i in sorted(layers) if layers[i].state is None]
    l = kv[len(kv) // 2]
    start, k, v = layers[l].start, layers[l].k, layers[l].v
    tries = {}
    # One byte of one decoded value (the low byte: one f16 ulp or so).
    k2 = k.copy()
    k2.view(np.uint8).reshape(-1)[2 * (k2.size // 2)] ^= 0x01
    tries["one decoded key byte flipped"] = (l, epkv.layer_digest(start, n, k2, v), seals[l])
    # The same flip made on the wire: a payload byte changed, its CRC recomputed so the
    # chunk is accepted, the layer decoded anew: only the seal can tell.
    payload = bytearray(epkv.encode_f16(k, v))
    payload[len(payload) - 1] ^= 0x01  # the last value's high byte
    c = pb.WireChunk(layer=l, start=start, end=n, codec="f16", compressed=False,
                     payload=bytes(payload))
    c.checksum = epkv.chunk_checksum(l, start, n, "f16", False, c.payload)
    fk, fv = epkv.decode("f16", False, c.payload, h.n_kv_head, h.head_dim, n - start)
    tries["a payload byte changed, CRC recomputed"] = (l, epkv.layer_digest(start, n, fk, fv),
                                                      seals[l])
    # The true values under another layer's seal, another codec's or another prompt's.
    other = next(i for i in sorted(layers) if i != l)
    tries["another layer's seal"] = (l, epkv.layer_digest(start, n, k, v), seals[other])
    refused = 0
    for what, (layer, digest, sig) in tries.items():
        if verifies(key, manifest.statement(layer, digest), sig):
            fail(f"forgery accepted: {what} (layer {layer})")
        refused += 1
    for what, m in {
        "said to be another codec's values": epkv.Manifest(
            **{**manifest.__dict__, "codec": "int4" if manifest.codec != "int4" else "int8"}),
        "said to be another prompt": epkv.Manifest(**{**manifest.__dict__, "prompt_id": "x"}),
        "said to be mapped": epkv.Manifest(**{**manifest.__dict__, "mapped": True}),
    }.items():
        if verifies(key, m.statement(l, epkv.layer_digest(start, n, k, v)), seals[l]):
            fail(f"forgery accepted: {what}")
        refused += 1
    # And the untouched layer still verifies (the forgeries failed for their change alone).
    if not verifies(key, manifest.statement(l, epkv.layer_digest(start, n, k, v)), seals[l]):
        fail("the genuine layer does not verify")
    return refused


def flip_state(st: epkv.State, i: int) -> epkv.State:
    """The state with float i's lowest mantissa bit flipped: one ulp, still finite."""
    data = bytearray(st.data)
    data[4 * i] ^= 0x01
    return epkv.State(st.conv_floats, st.matrix_floats, bytes(data))


def state_chunk(pb, h, l: int, state: bytes):
    """Layer l's one chunk carrying `state`, its CRC computed: what a path could forge."""
    n = len(h.token_ids)
    c = pb.WireChunk(layer=l, start=n, end=n, codec=h.codec, compressed=False, payload=b"",
                     state=state)
    c.checksum = epkv.chunk_checksum(c.layer, c.start, c.end, c.codec, False, c.payload,
                                     c.state)
    return c


def state_forgeries(key: VerifyKey, h, manifest, layers, seals, pb) -> int:
    """A hybrid stream's states: every forgery below fails its seal; returns how many."""
    n = len(h.token_ids)
    rec = [i for i in sorted(layers) if layers[i].state is not None]
    l = rec[len(rec) // 2]
    st = layers[l].state
    tries = {}
    # One float of the matrices (of the window, for a short convolution) one ulp off.
    at = st.conv_floats + st.matrix_floats // 2 if st.matrix_floats else st.conv_floats // 2
    tries["one state float one ulp off"] = (l, epkv.state_digest(n, flip_state(st, at)))
    # The same change on the wire, CRC recomputed: the chunk is taken, only the seal tells.
    c = state_chunk(pb, h, l, flip_state(st, 0).data)
    _, taken = reassembler(h, first_layer=l).push(c)
    tries["a state byte changed, CRC recomputed"] = (l, taken.digest(n))
    # The true state said to be at another position, or split elsewhere into window and
    # matrices, or in another recurrent layer's place, or digested as KV of no positions.
    tries["the state at another position"] = (l, epkv.state_digest(n - 1, st))
    moved = epkv.State(st.conv_floats - 1, st.matrix_floats + 1, st.data)
    tries["the window and matrices split elsewhere"] = (l, epkv.state_digest(n, moved))
    if len(rec) > 1:
        other = next(i for i in rec if i != l)
        tries["another recurrent layer's state"] = (l, epkv.state_digest(n, layers[other].state))
    tries["a KV digest of no positions"] = (l, epkv.layer_digest(n, n, layers[l].k, layers[l].v))
    for what, (layer, digest) in tries.items():
        if verifies(key, manifest.statement(layer, digest), seals[l]):
            fail(f"state forgery accepted: {what} (layer {layer})")
    # A recurrent layer's seal does not stand for another layer's, KV or state.
    for other in (i for i in sorted(layers) if i != l):
        if verifies(key, manifest.statement(other, layers[other].digest(n)), seals[l]):
            fail(f"layer {l}'s seal verifies for layer {other}")
    if not verifies(key, manifest.statement(l, epkv.state_digest(n, st)), seals[l]):
        fail(f"the genuine state of layer {l} does not verify")
    return len(tries) + len(layers) - 1


def state_refusals(h, layers, pb) -> int:
    """Malformed state chunks the reassembler refuses before any seal is checked (chunk.rs
    push_state); returns how many. The genuine chunk is taken, so each refusal is its
    change's."""
    n = len(h.token_ids)
    l = next(i for i in sorted(layers) if layers[i].state is not None)
    st = layers[l].state
    nan = bytearray(st.data)
    nan[0:4] = np.array([np.nan], "<f4").tobytes()
    bad = {
        "a state one float short": state_chunk(pb, h, l, st.data[:-4]),
        "a state one float long": state_chunk(pb, h, l, st.data + bytes(4)),
        "a NaN in the state": state_chunk(pb, h, l, bytes(nan)),
        "no state": state_chunk(pb, h, l, b""),
    }
    for what, c in bad.items():
        if not refused(reassembler(h, first_layer=l), c):
            fail(f"a malformed state chunk taken: {what}")
    count = len(bad)
    # A layer holding positions that carries a state too (its payload in f16, the one codec
    # encoded here: the state is what is refused).
    kv = next((i for i in sorted(layers) if layers[i].state is None), None)
    if kv is not None:
        layer = layers[kv]
        e = min(layer.start + epkv.CHUNK_TOKENS, n)
        c = pb.WireChunk(layer=kv, start=layer.start, end=e, codec="f16", state=st.data,
                         payload=epkv.encode_f16(layer.k[:, : e - layer.start],
                                                 layer.v[:, : e - layer.start]))
        if not refused(reassembler(h, first_layer=kv, codec="f16"), c):
            fail(f"layer {kv}: a chunk holding positions and a state taken")
        count += 1
    got, layer = reassembler(h, first_layer=l).push(state_chunk(pb, h, l, st.data))
    if got != l or layer.state != st:
        fail(f"the genuine state chunk of layer {l} is not taken as sent")
    return count


def refused(re: epkv.Reassembler, c) -> bool:
    try:
        re.push(c)
        return False
    except ProtocolError:
        return True


def check_refusals(stub, pb, cfg) -> list[str]:
    """Statuses the protocol promises (cloud_kv.proto, service.rs)."""
    fp, pid = cfg["fingerprint"], cfg["prompt_id"]
    cases = [
        ("another fingerprint", pb.FetchRequest(id=pid, model_fingerprint="0" * 64),
         grpc.StatusCode.FAILED_PRECONDITION),
        ("an unknown id", pb.FetchRequest(id="no-such-prompt", model_fingerprint=fp),
         grpc.StatusCode.NOT_FOUND),
        ("an unknown address", pb.FetchRequest(content_address=b"\0" * 32, model_fingerprint=fp),
         grpc.StatusCode.NOT_FOUND),
        ("no codec it speaks", pb.FetchRequest(id=pid, model_fingerprint=fp,
                                               accept_codecs=["bf17"]),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]
    seen = []
    for what, req, code in cases:
        try:
            for _ in stub.Fetch(req, timeout=30):
                pass
            fail(f"fetch with {what}: no error")
        except grpc.RpcError as e:
            if e.code() != code:
                fail(f"fetch with {what}: {e.code()}, want {code}")
        seen.append(f"{what} -> {code.name}")
    try:
        stub.List(pb.ListRequest(model_fingerprint="0" * 64), timeout=30)
        fail("list for another fingerprint: no error")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
            fail(f"list for another fingerprint: {e.code()}")
    seen.append("list for another fingerprint -> FAILED_PRECONDITION")
    return seen


def check_worked_example(doc_path: str) -> None:
    """docs/protocol.md's worked example, recomputed here from its inputs: the page alone is
    enough to build a statement, a digest and a signature a Rust cloud would make."""
    with open(doc_path) as f:
        doc = f.read()
    block = doc.split("## Worked example", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()

    def after(label: str) -> str:
        i = lines.index(label)
        out = []
        for line in lines[i + 1:]:
            if not all(c in "0123456789abcdef" for c in line) or not line:
                break
            out.append(line)
        return "".join(out)

    # The inputs: `name  value...` lines before the first blank line.
    inputs = {}
    for line in lines[:lines.index("")]:
        name, *values = line.split()
        inputs[name] = values
    one = lambda name: inputs[name][0]  # noqa: E731
    num = lambda name: int(one(name))  # noqa: E731
    ids = [int(x) for x in inputs["token_ids"]]
    start, end = (int(x) for x in inputs["positions"])
    n_kv_head, head_dim = num("n_kv_head"), num("head_dim")
    shape = (n_kv_head, end - start, head_dim)
    k = np.array([float(x) for x in inputs["keys"]], dtype=np.float16).reshape(shape)
    v = np.array([float(x) for x in inputs["values"]], dtype=np.float16).reshape(shape)
    address = epkv.content_address(one("fingerprint"), ids)
    digest = epkv.layer_digest(start, end, k, v)
    m = epkv.Manifest(one("prompt_id"), one("fingerprint"), address, num("n_layers"), n_kv_head,
                      head_dim, num("first_layer"), one("codec"), bool(num("mapped")))
    statement = m.statement(num("layer"), digest)
    signing = SigningKey(bytes.fromhex(one("seed")))
    want = {
        "content address": address,
        "layer digest": digest.hex(),
        f"statement ({len(statement)} bytes)": statement.hex(),
        "public key": signing.verify_key.encode().hex(),
        "signature": signing.sign(statement).signature.hex(),
    }
    for label, value in want.items():
        if label not in lines or after(label) != value:
            fail(f"docs/protocol.md's worked example: {label} is not {value}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--codecs", default=",".join(epkv.CODECS))
    ap.add_argument("--allow-missing-exports", action="store_true")
    ap.add_argument("--dump-epkv", metavar="DIR")
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    pb, pb_grpc = epkv.load_stubs(cfg["proto_dir"], cfg.get("stubs_dir"))
    if cfg.get("protocol_doc"):
        check_worked_example(cfg["protocol_doc"])
        print("docs/protocol.md's worked example: address, digest, statement and signature "
              "recomputed here")
    with open(cfg["cloud_pub"]) as f:
        key = VerifyKey(bytes.fromhex(f.read().strip()))
    exports = cfg.get("exports") or {}
    codecs = a.codecs.split(",")
    # Large enough for a chunk of MAX_CHUNK_TOKENS f16 positions of a large model.
    opts = [("grpc.max_receive_message_length", 256 << 20)]
    target = cfg["cloud"].removeprefix("http://")  # a host:port, or the edge's URL form
    with grpc.insecure_channel(target, options=opts) as ch:
        stub = pb_grpc.CloudKvStub(ch)
        listed = check_list(stub, pb, cfg, key)
        print(f"list: {listed['listed']} prompt(s), signature checked; {cfg['prompt_id']}: "
              f"{listed['tokens']} tokens at {listed['address'][:16]}")
        seals_checked, states_checked, compared = 0, 0, []
        forged = forged_states = malformed = None
        for codec in codecs:
            got = {}
            for zstd in (False, True):
                h, manifest, layers, seals, stats = fetch(stub, pb, cfg, codec, zstd, key, listed)
                got[zstd] = (layers, seals)
                seals_checked += len(seals)
                states_checked += stats["states"]
                states = (f", {stats['states']} states ({stats['state_bytes']} bytes)"
                          if stats["states"] else "")
                print(f"{codec:6}{' zstd' if zstd else '     '}: {len(layers)} layers x "
                      f"{h.n_kv_head} heads x {h.head_dim}, {stats['chunks']} chunks (at most "
                      f"{stats['max_positions']} positions), {stats['wire_bytes']} payload bytes"
                      f"{states}, compressed={h.compressed}, every CRC and seal checked")
                # Forgeries of the f16 stream (of the first codec's when f16 is not fetched).
                if forged is None and (codec == "f16" or "f16" not in codecs):
                    forged = forgeries(key, h, manifest, layers, seals, pb)
                    if stats["states"]:
                        forged_states = state_forgeries(key, h, manifest, layers, seals, pb)
                        malformed = state_refusals(h, layers, pb)
            # zstd changes the bytes on the wire, never the values nor the states.
            for l, layer in got[False][0].items():
                if not layer.same(got[True][0][l]):
                    fail(f"{codec}: layer {l} decodes differently with zstd")
            if codec in exports:
                compare_export(exports[codec], h, got[False][0], codec)
                compared.append(codec)
            elif not a.allow_missing_exports:
                fail(f"no export for {codec} in the config")
            if a.dump_epkv:
                os.makedirs(a.dump_epkv, exist_ok=True)
                layers = got[False][0]
                meta = {"prompt_id": h.prompt_id, "fingerprint": h.model_fingerprint,
                        "address": h.content_address.hex(), "token_ids": list(h.token_ids),
                        "n_layers": h.n_layers, "n_kv_head": h.n_kv_head,
                        "head_dim": h.head_dim, "first_layer": 0,
                        "layer_starts": list(h.layer_starts) or [0] * h.n_layers,
                        "codec": h.values_codec or h.codec, "mapped": False}
                if state_shape(h):
                    meta["state_shape"] = state_shape(h)
                epkv.write_epkv(os.path.join(a.dump_epkv, f"{codec}.epkv"), meta, layers)
        refusals = check_refusals(stub, pb, cfg)
    print(f"codecs {','.join(codecs)} x zstd off/on: {seals_checked} layer seals verified; "
          f"values equal with and without zstd; bit-identical to the Rust edge's export for "
          f"{','.join(compared) or 'no codec'}")
    print(f"forgery refused: {forged} of {forged} forged layers/statements fail their seal")
    if forged_states is not None:
        print(f"states: {states_checked} recurrent layers' states sealed and checked; forged "
              f"states refused: {forged_states} of {forged_states} forged states/statements "
              f"fail their seal; {malformed} of {malformed} malformed state chunks refused")
    print("statuses: " + "; ".join(refusals))
    print("OK")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ProtocolError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    except grpc.RpcError as e:
        print(f"FAIL: gRPC {e.code()}: {e.details()}", file=sys.stderr)
        sys.exit(1)
