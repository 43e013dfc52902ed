//! One entry point for everything that reads bytes from the network or a store: protobuf
//! messages, wire chunks, the layer-major reassembler, the codecs and the stored-prefix format.
//! Whatever the bytes, it must return (errors are fine), never panic or allocate without bound:
//! cargo-fuzz drives it (`fuzz/`), and a stable test runs seeds and mutations of them in CI.

use edgeprompt_kv::chunk::{Chunk, Reassembler};
use edgeprompt_kv::codec::{self, Codec};
use prost::Message;

use crate::{fetch_message::Body, FetchMessage, FetchRequest};

/// The shape the fuzzed stream is reassembled into (the seeds use it too).
pub const SHAPE: (usize, usize, usize, usize) = (2, 5, 2, 8);

pub fn read_untrusted(data: &[u8]) {
    let _ = FetchRequest::decode(data);
    let (layers, tokens, heads, dim) = SHAPE;
    let mut re = Reassembler::new(layers, tokens, heads, dim);
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
                let Ok(r) = Reassembler::new(layers, tokens, heads, dim).with_starts(&starts)
                else {
                    break;
                };
                re = r;
            }
            None => {}
        }
    }
    let _ = edgeprompt_kv::read_prefix(&mut &data[..]);
    for c in Codec::ALL {
        for compressed in [false, true] {
            let _ = codec::decode(c, compressed, data, heads, dim, tokens);
        }
    }
}
