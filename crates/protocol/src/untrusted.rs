//! One entry point for everything that reads bytes from the network or a store: protobuf
//! messages, wire chunks, the layer-major reassembler, the codecs and the stored-prefix format.
//! Whatever the bytes, it must return (errors are fine), never panic or allocate without bound:
//! cargo-fuzz drives it (`fuzz/`), and a stable test runs seeds and mutations of them in CI.

use edgeprompt_engine::recurrent::{DeltaNet, Recurrence, ShortConv};
use edgeprompt_kv::chunk::{Chunk, Reassembler};
use edgeprompt_kv::codec::{self, Codec};
use prost::Message;

use crate::{fetch_message::Body, FetchMessage, FetchRequest};

/// A shape the fuzzed stream may be reassembled into (the seeds use it too).
pub const SHAPE: (usize, usize, usize, usize) = (2, 5, 2, 8);

/// Head dims the fuzzer picks from: one group and several for int4 (32) and int4ch (64), and
/// dims that are no multiple of either.
const DIMS: [usize; 6] = [8, 32, 64, 96, 128, 200];

/// (layers, tokens, heads, head dim) from the input's first four bytes: 1-4 layers, 1-512
/// tokens (past one 256-token chunk), 1-4 heads, a dim of `DIMS`.
pub fn shape_of(b: [u8; 4]) -> (usize, usize, usize, usize) {
    (
        1 + (b[0] & 3) as usize,
        1 + b[1] as usize + 256 * ((b[0] >> 2) & 1) as usize,
        1 + (b[2] & 3) as usize,
        DIMS[b[3] as usize % DIMS.len()],
    )
}

/// The four bytes `shape_of` reads as `shape` (for seeds), if it is one it can make.
pub fn shape_bytes(shape: (usize, usize, usize, usize)) -> Option<[u8; 4]> {
    let (l, t, h, d) = shape;
    let dim = DIMS.iter().position(|&x| x == d)?;
    let (hi, lo) = ((t - 1) / 256, (t - 1) % 256);
    if !(1..=4).contains(&l) || !(1..=4).contains(&h) || hi > 1 {
        return None;
    }
    Some([
        (l - 1) as u8 | (hi as u8) << 2,
        lo as u8,
        (h - 1) as u8,
        dim as u8,
    ])
}

/// The recurrent state shape of a hybrid stream, when the first byte's bit 3 says so (seeds
/// of attention-only streams leave it clear): a convolution of 2-4 taps; with bit 7 a short
/// convolution over 8 channels, else a DeltaNet of 1 key head and 2 value heads of 8.
pub fn state_of(b: [u8; 4]) -> Option<Recurrence> {
    let kernel = 2 + (b[0] >> 4) as usize % 3;
    (b[0] & 8 != 0).then(|| match b[0] & 0x80 {
        0 => Recurrence::DeltaNet(DeltaNet {
            conv_kernel: kernel,
            k_heads: 1,
            v_heads: 2,
            head_dim: 8,
        }),
        _ => Recurrence::ShortConv(ShortConv { kernel, width: 8 }),
    })
}

/// What a stored prefix of `shape` must be (any token id below 2^20).
pub fn expect_of(
    shape: (usize, usize, usize, usize),
    state: Option<Recurrence>,
) -> edgeprompt_kv::Expect {
    let (n_layers, max_tokens, n_kv_head, head_dim) = shape;
    edgeprompt_kv::Expect {
        n_layers,
        layers: Default::default(),
        n_kv_head,
        head_dim,
        max_tokens,
        vocab_size: 1 << 20,
        state,
    }
}

pub fn read_untrusted(data: &[u8]) {
    let _ = FetchRequest::decode(data);
    let Some((head, data)) = data.split_first_chunk::<4>() else {
        return;
    };
    let (layers, tokens, heads, dim) = shape_of(*head);
    let state = state_of(*head);
    let mut re = Reassembler::new(layers, tokens, heads, dim).with_state(state);
    let mut rest = data;
    while !rest.is_empty() {
        let Ok(m) = FetchMessage::decode_length_delimited(&mut rest) else {
            break;
        };
        match m.body {
            Some(Body::Chunk(c)) => {
                let Ok(c) = Chunk::try_from(c) else { break };
                if re.push(&c).is_err() {
                    break;
                }
            }
            Some(Body::Header(h)) => {
                let starts: Vec<usize> = h.layer_starts.iter().map(|&s| s as usize).collect();
                let Ok(r) = Reassembler::new(layers, tokens, heads, dim)
                    .with_state(state)
                    .with_starts(&starts)
                else {
                    break;
                };
                re = r;
            }
            None => {}
        }
    }
    let _ = edgeprompt_kv::read_prefix(&mut &data[..], &expect_of(shape_of(*head), state));
    for c in Codec::ALL {
        for compressed in [false, true] {
            let _ = codec::decode(c, compressed, data, heads, dim, tokens);
        }
    }
}
