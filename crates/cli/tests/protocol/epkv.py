"""A second implementation of EdgePrompt's wire protocol (edgeprompt.v1) in Python, following the
.proto and docs/protocol.md, shared by kv_client.py, kv_cloud.py and capture_wire.py.

What lives here, and the Rust it must agree with byte for byte:
- the codecs' payload layouts and their decoding to f16 (crates/kv/src/codec.rs);
- the chunk CRC and the layer-major reassembly (crates/kv/src/chunk.rs);
- the content address (crates/kv/src/address.rs);
- the layer digest, a recurrent layer's state digest, the seal's statement and the list's
  statement (crates/kv/src/seal.rs);
- a recurrent layer's state and its size (crates/engine/src/recurrent.rs Recurrent);
- EPKV files (versions 1 and 2): one prompt's decoded KV, and a hybrid model's states, as
  `edgeprompt kv-export` writes it;
- stubs generated from the .proto at run time (so no generated code is checked in).

Values are numpy float16 arrays; a layer is a `Layer`: its keys and values, each of shape
(n_kv_head, n_positions, head_dim), and for a hybrid model's recurrent layer (no positions) its
`State`, kept as the f32 LE bytes the wire carries.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.resources
import json
import os
import shutil
import struct
import sys
import tempfile
import zlib
from dataclasses import dataclass, field

import numpy as np

CODECS = ("f16", "int8", "int4", "int8ch", "int4ch")
# Values per int4 group: the row codec's, and int4ch's value rows' (codec.rs GROUP, GROUP_CH).
GROUP = 32
GROUP_CH = 64
# Tokens per key group of the per-channel codecs (codec.rs KEY_GROUP).
KEY_GROUP = 64
# Most positions one chunk may carry (chunk.rs MAX_CHUNK_TOKENS); the cloud sends 256.
MAX_CHUNK_TOKENS = 1024
CHUNK_TOKENS = 256


class ProtocolError(Exception):
    """Anything a stream, a file or a signature gets wrong."""


# ---------------------------------------------------------------------------------------------
# Stubs generated from the .proto, at run time.


def load_stubs(proto_dir: str, out: str | None = None):
    """Compile edgeprompt/v1/cloud_kv.proto with grpc_tools.protoc into a temporary directory
    and import it: the tests then exercise the .proto itself, not a checked-in copy of it.
    `out`: where to write them (default: a temporary directory removed at exit).
    Returns (messages module, grpc module)."""
    from grpc_tools import protoc
    import grpc_tools

    if out is None:
        out = tempfile.mkdtemp(prefix="edgeprompt-stubs-")
        atexit.register(shutil.rmtree, out, True)
    os.makedirs(out, exist_ok=True)
    # protoc needs the well-known types' include dir too (the .proto imports none today).
    include = str(importlib.resources.files(grpc_tools) / "_proto")
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "edgeprompt/v1/cloud_kv.proto",
    ])
    if rc != 0:
        raise ProtocolError(f"protoc failed ({rc}) on {proto_dir}/edgeprompt/v1/cloud_kv.proto")
    sys.path.insert(0, out)
    pb = importlib.import_module("edgeprompt.v1.cloud_kv_pb2")
    pb_grpc = importlib.import_module("edgeprompt.v1.cloud_kv_pb2_grpc")
    return pb, pb_grpc


# ---------------------------------------------------------------------------------------------
# Content address, statements, digests (address.rs, seal.rs).


def content_address(fingerprint: str, token_ids) -> str:
    """SHA-256 of "edgeprompt-kv-v1\\0", the fingerprint's UTF-8, a zero byte, the token count
    (u64 LE) and each id (u32 LE); hex."""
    h = hashlib.sha256()
    h.update(b"edgeprompt-kv-v1\0")
    h.update(fingerprint.encode())
    h.update(b"\0")
    h.update(struct.pack("<Q", len(token_ids)))
    h.update(np.asarray(token_ids, dtype="<u4").tobytes())
    return h.hexdigest()


def _lp(s: str) -> bytes:
    """A string as the statements hold it: u32 LE byte length, then the UTF-8 bytes."""
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def list_statement(fingerprint: str, entries) -> bytes:
    """What a cloud signs for its list: the asking fingerprint, then every entry's id and
    address (hex text, not the 32 bytes), all length-prefixed, and only then every entry's
    token count (u32 LE). `entries`: (id, tokens, address_hex) in the reply's order."""
    m = b"edgeprompt-list-v1\0" + _lp(fingerprint)
    for pid, _, addr in entries:
        m += _lp(pid) + _lp(addr)
    for _, tokens, _ in entries:
        m += struct.pack("<I", tokens)
    return m


def fresh_list_statement(fingerprint: str, entries, issued_unix_ms: int,
                         max_age_secs: int) -> bytes:
    """What a cloud signs as the list's fresh_signature: its own tag, the issue time (u64 LE)
    and maximum age (u32 LE), then the v1 statement after its tag."""
    v1 = list_statement(fingerprint, entries)
    return (b"edgeprompt-list-v2\0" + struct.pack("<QI", issued_unix_ms, max_age_secs)
            + v1[len(b"edgeprompt-list-v1\0"):])


@dataclass
class Manifest:
    """Whose KV a stream is (seal.rs Manifest): everything a layer's signature binds besides
    the values."""

    prompt_id: str
    fingerprint: str
    address: str  # hex, computed from the token ids
    n_layers: int
    n_kv_head: int
    head_dim: int
    first_layer: int
    codec: str  # what the values were decoded from (header.values_codec, else header.codec)
    mapped: bool

    def statement(self, layer: int, digest: bytes) -> bytes:
        m = b"edgeprompt-kv-seal-v1\0"
        for s in (self.prompt_id, self.fingerprint, self.address, self.codec):
            m += _lp(s)
        for n in (self.n_layers, self.n_kv_head, self.head_dim, self.first_layer,
                  int(self.mapped), layer):
            m += struct.pack("<Q", n)
        return m + digest


def layer_digest(start: int, end: int, k: np.ndarray, v: np.ndarray) -> bytes:
    """SHA-256 of a layer's positions and values: start, end, n_kv_head, head_dim (u64 LE),
    then per head its keys then its values, f16 bits LE. k, v: (heads, positions, head_dim)."""
    n_kv_head, n, head_dim = k.shape
    assert v.shape == k.shape and end - start == n, (k.shape, v.shape, start, end)
    h = hashlib.sha256()
    h.update(b"edgeprompt-layer-v1\0")
    h.update(struct.pack("<4Q", start, end, n_kv_head, head_dim))
    for head in range(n_kv_head):
        h.update(k[head].astype("<f2").tobytes())
        h.update(v[head].astype("<f2").tobytes())
    return h.digest()


def state_digest(position: int, st: "State") -> bytes:
    """SHA-256 of a recurrent layer's state: its own tag (so no state digest is a KV layer's),
    the position it is at (the token count), the window's and the matrices' float counts
    (u64 LE), then the state's bytes as the wire holds them."""
    h = hashlib.sha256()
    h.update(b"edgeprompt-state-v1\0")
    h.update(struct.pack("<3Q", position, st.conv_floats, st.matrix_floats))
    h.update(st.data)
    return h.digest()


# ---------------------------------------------------------------------------------------------
# States (recurrent.rs Recurrent): a hybrid model's recurrent layer holds no positions, but one
# f32 state after the prompt's last token, sent exact (never quantized nor compressed).


@dataclass(frozen=True)
class State:
    conv_floats: int
    matrix_floats: int
    data: bytes  # f32 LE: the convolution window, then each value head's matrix

    @classmethod
    def parse(cls, data: bytes, conv_floats: int, matrix_floats: int) -> "State":
        """Refused unless exactly the shape's size and every value finite (as Rust's
        Recurrent::from_le_bytes): a model never makes an infinite or NaN state."""
        want = 4 * (conv_floats + matrix_floats)
        if len(data) != want:
            raise ProtocolError(f"a state of {len(data)} bytes, the shape's is {want}")
        if not np.isfinite(np.frombuffer(data, "<f4")).all():
            raise ProtocolError("a state with values that are not finite")
        return cls(conv_floats, matrix_floats, bytes(data))

    def floats(self) -> np.ndarray:
        return np.frombuffer(self.data, "<f4")


STATE_KINDS = {0: "GATED_DELTA_NET", 1: "SHORT_CONV"}


def state_floats(shape) -> tuple[int, int]:
    """A header's StateShape -> (window floats, matrix floats): (conv_kernel - 1) rows of
    conv_channels, then v_heads matrices of head_dim x head_dim. Refused when its fields do not
    fit its kind (docs/protocol.md, "States")."""
    kind = STATE_KINDS.get(shape.kind)
    if kind is None or shape.conv_kernel < 1:
        raise ProtocolError(f"a state shape of kind {shape.kind}, kernel {shape.conv_kernel}")
    heads = (shape.k_heads, shape.v_heads, shape.head_dim)
    if kind == "GATED_DELTA_NET":
        # The window holds the Q, K and V projections side by side.
        channels = (2 * shape.k_heads + shape.v_heads) * shape.head_dim
        if shape.conv_channels != channels or 0 in heads:
            raise ProtocolError(f"a Gated DeltaNet state of {shape.conv_channels} channels for "
                                f"heads {heads} ({channels})")
    elif heads != (0, 0, 0):
        raise ProtocolError(f"a short convolution's state with heads {heads}")
    return ((shape.conv_kernel - 1) * shape.conv_channels,
            shape.v_heads * shape.head_dim * shape.head_dim)


@dataclass
class Layer:
    """One layer as an edge reassembles it: K and V over positions start..n, or, for a
    recurrent layer (start = n), no positions and its state."""

    start: int
    k: np.ndarray
    v: np.ndarray
    state: State | None = None

    def digest(self, end: int) -> bytes:
        """What the layer's seal signs (seal.rs layer_digest): a state's own digest, else the
        KV's."""
        if self.state is not None:
            return state_digest(end, self.state)
        return layer_digest(self.start, end, self.k, self.v)

    def same(self, other: "Layer") -> bool:
        """Bit for bit (f16 bits, state bytes), not as floats: -0 and NaN compare as bits."""
        return (self.start == other.start and self.state == other.state
                and self.k.shape == other.k.shape and self.v.shape == other.v.shape
                and self.k.view(np.uint16).tobytes() == other.k.view(np.uint16).tobytes()
                and self.v.view(np.uint16).tobytes() == other.v.view(np.uint16).tobytes())


# ---------------------------------------------------------------------------------------------
# Codecs (codec.rs). Decoding reproduces Rust's f32 arithmetic (`q as f32 * d + m`, a multiply
# then an add, never fused), rounded once to f16 (round to nearest, ties to even): numpy float32
# ops then .astype(float16) do exactly that.


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 from a uint8 array of even length."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float16)


def row_bytes(codec: str, head_dim: int) -> int:
    """Encoded bytes of one row of head_dim values (a value row, for the channel codecs)."""
    if codec == "f16":
        return 2 * head_dim
    if codec in ("int8", "int8ch"):
        return 2 + head_dim
    if codec == "int4":
        return -(-head_dim // GROUP) * (4 + GROUP // 2)
    if codec == "int4ch":
        return -(-head_dim // GROUP_CH) * (4 + GROUP_CH // 2)
    raise ProtocolError(f"unknown codec {codec!r}")


def _channel_bits(codec: str) -> int | None:
    return {"int8ch": 8, "int4ch": 4}.get(codec)


def head_bytes(codec: str, head_dim: int, n: int, key: bool) -> int:
    """Encoded bytes of one head of n positions, keys or values."""
    if n == 0:
        return 0
    bits = _channel_bits(codec)
    if key and bits:
        # First row in f16, then groups of KEY_GROUP rows: per channel (scale, min) as f16, then
        # the codes, bits each, packed.
        group = lambda rows: 4 * head_dim + -(-(rows * head_dim * bits) // 8)  # noqa: E731
        full, last = divmod(n - 1, KEY_GROUP)
        return 2 * head_dim + full * group(KEY_GROUP) + (group(last) if last else 0)
    return n * row_bytes(codec, head_dim)


def chunk_bytes(codec: str, n_kv_head: int, head_dim: int, n: int) -> int:
    return n_kv_head * (head_bytes(codec, head_dim, n, True) + head_bytes(codec, head_dim, n, False))


def _int8_rows(b: np.ndarray, n: int, head_dim: int) -> np.ndarray:
    """n rows of (f16 scale, head_dim signed bytes): q * d in f32, then f16."""
    rows = b.reshape(n, 2 + head_dim)
    d = _f16(rows[:, :2].reshape(-1)).astype(np.float32)[:, None]
    q = rows[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).astype(np.float16)


def _int4_rows(b: np.ndarray, n: int, head_dim: int, group: int) -> np.ndarray:
    """n rows, each ceil(head_dim / group) groups of (f16 scale, f16 min, group/2 bytes of
    nibbles, low nibble first); the last group's padding is dropped."""
    n_groups = -(-head_dim // group)
    g = b.reshape(n, n_groups, 4 + group // 2)
    d = _f16(g[:, :, 0:2].reshape(-1)).astype(np.float32).reshape(n, n_groups, 1)
    m = _f16(g[:, :, 2:4].reshape(-1)).astype(np.float32).reshape(n, n_groups, 1)
    nib = g[:, :, 4:]
    q = np.stack([nib & 0xF, nib >> 4], axis=-1).reshape(n, n_groups, group).astype(np.float32)
    x = (q * d + m).astype(np.float16)  # two f32 roundings, as Rust (no FMA), then f16
    return x.reshape(n, n_groups * group)[:, :head_dim]


def _channel_keys(b: np.ndarray, n: int, head_dim: int, bits: int) -> np.ndarray:
    """A per-channel key head: its first row in f16, then groups of at most KEY_GROUP rows,
    each head_dim (scale, min) f16 pairs then the codes in row order (8 bits, or 4 bits two
    per byte, low nibble first, the last byte padded)."""
    out = [_f16(b[: 2 * head_dim]).reshape(1, head_dim)]
    pos, left = 2 * head_dim, n - 1
    while left > 0:
        rows = min(left, KEY_GROUP)
        length = 4 * head_dim + -(-(rows * head_dim * bits) // 8)
        g = b[pos : pos + length]
        params = g[: 4 * head_dim].reshape(head_dim, 4)
        d = _f16(params[:, 0:2].reshape(-1)).astype(np.float32)
        m = _f16(params[:, 2:4].reshape(-1)).astype(np.float32)
        codes = g[4 * head_dim :]
        if bits == 4:
            codes = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(-1)
        q = codes[: rows * head_dim].reshape(rows, head_dim).astype(np.float32)
        out.append((q * d + m).astype(np.float16))
        pos += length
        left -= rows
    return np.concatenate(out)


def decode_head(codec: str, b: np.ndarray, head_dim: int, n: int, key: bool) -> np.ndarray:
    """One head of n positions -> (n, head_dim) f16."""
    if n == 0:
        return np.zeros((0, head_dim), np.float16)
    bits = _channel_bits(codec)
    if key and bits:
        return _channel_keys(b, n, head_dim, bits)
    if codec == "f16":
        return _f16(b).reshape(n, head_dim)
    if codec in ("int8", "int8ch"):
        return _int8_rows(b, n, head_dim)
    if codec == "int4":
        return _int4_rows(b, n, head_dim, GROUP)
    if codec == "int4ch":
        return _int4_rows(b, n, head_dim, GROUP_CH)
    raise ProtocolError(f"unknown codec {codec!r}")


def decode(codec: str, compressed: bool, payload: bytes, n_kv_head: int, head_dim: int, n: int):
    """A chunk's payload -> (k, v), each (n_kv_head, n, head_dim) f16. The payload is all keys
    (head by head), then all values; zstd, when on, covers the whole of it."""
    if codec not in CODECS:
        raise ProtocolError(f"unknown codec {codec!r}")
    if n > MAX_CHUNK_TOKENS:
        raise ProtocolError(f"a chunk of {n} positions (at most {MAX_CHUNK_TOKENS})")
    expect = chunk_bytes(codec, n_kv_head, head_dim, n)
    if compressed:
        import zstandard

        # Read through a stream, at most one byte past the size expected: `decompress` would
        # trust a frame's declared content size and allocate it, however large.
        try:
            with zstandard.ZstdDecompressor().stream_reader(payload) as r:
                payload = r.read(expect + 1)
        except zstandard.ZstdError as e:
            raise ProtocolError(f"zstd: {e}") from None
    if len(payload) != expect:
        raise ProtocolError(f"{len(payload)} payload bytes, expected {expect} for {n} positions "
                            f"x {n_kv_head} heads x {head_dim} ({codec})")
    b = np.frombuffer(payload, np.uint8)
    kb, vb = head_bytes(codec, head_dim, n, True), head_bytes(codec, head_dim, n, False)
    k = [decode_head(codec, b[h * kb : (h + 1) * kb], head_dim, n, True) for h in range(n_kv_head)]
    base = n_kv_head * kb
    v = [decode_head(codec, b[base + h * vb : base + (h + 1) * vb], head_dim, n, False)
         for h in range(n_kv_head)]
    shape = (n_kv_head, n, head_dim)
    return np.stack(k).reshape(shape), np.stack(v).reshape(shape)


def encode_f16(k: np.ndarray, v: np.ndarray) -> bytes:
    """The f16 codec's payload: keys head by head, then values, rows of LE f16."""
    return k.astype("<f2").tobytes() + v.astype("<f2").tobytes()


def chunk_checksum(layer: int, start: int, end: int, codec: str, compressed: bool,
                   payload: bytes, state: bytes = b"") -> int:
    """CRC-32 (IEEE, as crc32fast and zlib compute it) of layer, start, end (u32 LE), the codec
    name, the compressed flag (one byte), the payload as sent and the state (empty but on a
    recurrent layer's chunk)."""
    head = struct.pack("<3I", layer, start, end) + codec.encode() + bytes([int(compressed)])
    return zlib.crc32(state, zlib.crc32(payload, zlib.crc32(head))) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Reassembly (chunk.rs Reassembler): chunks layer-major, each layer's contiguous from its start;
# a recurrent layer is one chunk at the prompt's end carrying its state.


@dataclass
class Reassembler:
    n_layers: int
    n_tokens: int
    n_kv_head: int
    head_dim: int
    codec: str
    first_layer: int = 0
    starts: list = field(default_factory=list)  # empty: every layer from 0
    # A hybrid model's recurrent layers (the header's state_shape.layers) and their state's
    # (window floats, matrix floats), from state_floats.
    recurrent: list = field(default_factory=list)
    state_floats: tuple | None = None
    next_layer: int = 0
    next_start: int = 0
    _k: list = field(default_factory=list)
    _v: list = field(default_factory=list)

    def __post_init__(self):
        if not self.starts:
            self.starts = [0] * self.n_layers
        n = self.n_tokens
        self.recurrent = list(self.recurrent)  # a header's repeated field, or any iterable
        if self.recurrent and self.state_floats is None:
            raise ProtocolError(f"recurrent layers {self.recurrent} without a state shape")
        if self.recurrent != sorted(set(self.recurrent)) or \
                any(l >= self.n_layers for l in self.recurrent):
            raise ProtocolError(f"recurrent layers {self.recurrent} of {self.n_layers}")
        # A recurrent layer starts at the prompt's end exactly (it holds no positions); any
        # other layer before it (or at 0, for an empty prompt).
        if len(self.starts) != self.n_layers or any(
            s != n if self._stateful(l) else (s > n or (s == n and s > 0))
            for l, s in enumerate(self.starts)
        ):
            raise ProtocolError(f"layer starts {self.starts} for {self.n_layers} layers of "
                                f"{n} positions, recurrent {self.recurrent}")
        self.next_layer = min(self.first_layer, self.n_layers)
        self.next_start = self.starts[self.next_layer] if self.next_layer < self.n_layers else 0

    def _stateful(self, l: int) -> bool:
        # An empty prompt leaves no state to send: every layer is one empty chunk (as Rust).
        return l in self.recurrent and self.n_tokens > 0

    def complete(self) -> bool:
        return self.next_layer == self.n_layers

    def push(self, c):
        """Take one WireChunk (already checked: CRC); returns (layer, Layer) when it completes
        a layer, else None."""
        if self.complete() or c.layer != self.next_layer or c.start != self.next_start:
            raise ProtocolError(f"chunk out of order: want layer {self.next_layer} from "
                                f"{self.next_start}, got layer {c.layer} from {c.start}")
        if c.codec != self.codec:
            raise ProtocolError(f"a chunk in {c.codec} inside a stream of {self.codec}")
        if c.end < c.start or c.end > self.n_tokens or c.end - c.start > MAX_CHUNK_TOKENS:
            raise ProtocolError(f"positions {c.start}..{c.end} in a prompt of {self.n_tokens}")
        k, v = decode(c.codec, c.compressed, c.payload, self.n_kv_head, self.head_dim,
                      c.end - c.start)
        # No model makes infinite or NaN keys or values: Rust refuses such a chunk too.
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise ProtocolError(f"layer {c.layer} {c.start}..{c.end}: values not finite")
        if self._stateful(c.layer):
            return self._push_state(c, k, v)
        if c.state:
            raise ProtocolError(f"layer {c.layer}: a state on a layer that holds positions")
        self._k.append(k)
        self._v.append(v)
        self.next_start = c.end
        if self.next_start < self.n_tokens:
            return None
        l, start = self.next_layer, self.starts[self.next_layer]
        k, v = np.concatenate(self._k, axis=1), np.concatenate(self._v, axis=1)
        self._k, self._v = [], []
        return self._advance(l, Layer(start, k, v))

    def _push_state(self, c, k, v):
        """A recurrent layer's one chunk: no positions (its start, checked in order, is the
        token count), a payload that decodes to nothing, and a state of the shape's size."""
        if c.end != c.start:
            raise ProtocolError(f"layer {c.layer}: a recurrent layer's chunk holds positions "
                                f"{c.start}..{c.end}")
        try:
            state = State.parse(c.state, *self.state_floats)
        except ProtocolError as e:
            raise ProtocolError(f"layer {c.layer}: {e}") from None
        return self._advance(c.layer, Layer(c.start, k, v, state))

    def _advance(self, l: int, layer: Layer):
        self.next_layer += 1
        self.next_start = self.starts[self.next_layer] if self.next_layer < self.n_layers else 0
        return l, layer


# ---------------------------------------------------------------------------------------------
# EPKV files: b"EPKV", u32 LE version, u32 LE length N, N bytes of JSON metadata, then for each
# layer from first_layer on, for each KV head: its keys of positions layer_starts[l]..n (rows of
# head_dim f16 LE), then its values likewise (the order layer_digest hashes). Version 2 (a
# hybrid model) names its recurrent layers, their shape (the header's StateShape, the kind by
# its enum name) and their state's size in the metadata's state_shape {layers, kind,
# conv_kernel, k_heads, v_heads, head_dim, conv_channels, conv_floats, matrix_floats}, and
# follows each such layer's (empty) heads
# with its state, f32 LE as the wire holds it.

EPKV_MAGIC = b"EPKV"
EPKV_VERSION = 1
EPKV_VERSION_STATES = 2


@dataclass
class Epkv:
    meta: dict
    layers: dict  # layer -> Layer

    @property
    def n_tokens(self) -> int:
        return len(self.meta["token_ids"])


def _epkv_states(path: str, version: int, meta: dict) -> tuple[set, tuple | None]:
    """The recurrent layers and their state's (window, matrix) floats a file says it holds:
    version 2 and a state_shape go together."""
    shape = meta.get("state_shape")
    if version not in (EPKV_VERSION, EPKV_VERSION_STATES):
        raise ProtocolError(f"{path}: EPKV version {version}, this reader knows "
                            f"{EPKV_VERSION} and {EPKV_VERSION_STATES}")
    if (version == EPKV_VERSION_STATES) != (shape is not None):
        raise ProtocolError(f"{path}: version {version} with state_shape {shape}")
    if shape is None:
        return set(), None
    return set(shape["layers"]), (shape["conv_floats"], shape["matrix_floats"])


def read_epkv(path: str) -> Epkv:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != EPKV_MAGIC:
        raise ProtocolError(f"{path}: not an EPKV file")
    version, n = struct.unpack_from("<II", data, 4)
    meta = json.loads(data[12 : 12 + n].decode())
    recurrent, floats = _epkv_states(path, version, meta)
    pos = 12 + n
    n_tokens = len(meta["token_ids"])
    heads, dim = meta["n_kv_head"], meta["head_dim"]
    starts = meta.get("layer_starts") or [0] * meta["n_layers"]
    layers = {}
    for l in range(meta["first_layer"], meta["n_layers"]):
        rows = n_tokens - starts[l]
        # Per head: keys then values, so read (heads, 2, rows, dim) and split.
        count = heads * 2 * rows * dim
        arr = np.frombuffer(data, "<f2", count, pos).astype(np.float16)
        arr = arr.reshape(heads, 2, rows, dim)
        pos += 2 * count
        state = None
        if l in recurrent:
            if rows != 0:
                raise ProtocolError(f"{path}: recurrent layer {l} holds {rows} positions")
            size = 4 * sum(floats)
            state = State.parse(data[pos : pos + size], *floats)
            pos += size
        layers[l] = Layer(starts[l], np.ascontiguousarray(arr[:, 0]),
                          np.ascontiguousarray(arr[:, 1]), state)
    if pos != len(data):
        raise ProtocolError(f"{path}: {len(data) - pos} bytes past the last layer")
    return Epkv(meta, layers)


def write_epkv(path: str, meta: dict, layers: dict) -> None:
    """`layers`: layer -> Layer. Version 2 when `meta` has a state_shape, whose layers must be
    exactly those holding a state."""
    version = EPKV_VERSION_STATES if meta.get("state_shape") else EPKV_VERSION
    recurrent, _ = _epkv_states(path, version, meta)
    js = json.dumps(meta).encode()
    with open(path, "wb") as f:
        f.write(EPKV_MAGIC + struct.pack("<II", version, len(js)) + js)
        for l in range(meta["first_layer"], meta["n_layers"]):
            layer = layers[l]
            if (layer.state is not None) != (l in recurrent):
                raise ProtocolError(f"{path}: layer {l}'s state does not match state_shape")
            for h in range(layer.k.shape[0]):
                f.write(layer.k[h].astype("<f2").tobytes())
                f.write(layer.v[h].astype("<f2").tobytes())
            if layer.state is not None:
                f.write(layer.state.data)
