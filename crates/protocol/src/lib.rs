//! The edge-to-cloud protocol (docs/design.md §4): the edge asks for a cloud prompt's KV; the cloud
//! answers with a header and then sealed chunks in layer-major order.
//!
//! Privacy is a property of these types: `FetchRequest` names a cloud prompt (a short id or a
//! 32-byte content address), the edge's model fingerprint and the codecs it accepts. There is
//! no field for text, token ids or KV, so nothing of the edge's prompt can be sent.
//!
//! The types are generated from the `.proto` into `src/generated/` (committed; a test
//! regenerates them and fails on any difference); docs/protocol.md is its guide.

pub mod untrusted;

use edgeprompt_engine::recurrent::Recurrence;
use edgeprompt_kv::{Chunk, Codec};

// The messages and the service, generated from `proto/edgeprompt/v1/cloud_kv.proto`.
include!("generated/edgeprompt.v1.rs");

/// The `.proto` compiled (a `FileDescriptorSet`): what the contract test pins.
pub const DESCRIPTOR: &[u8] = include_bytes!("generated/cloud_kv.fds");

/// Which cloud prompt a fetch names: its id or its content address.
pub use fetch_request::Prompt as PromptRef;

impl From<Chunk> for WireChunk {
    fn from(c: Chunk) -> Self {
        Self {
            layer: c.layer,
            start: c.start,
            end: c.end,
            codec: c.codec.name().to_string(),
            compressed: c.compressed,
            payload: c.payload,
            checksum: c.checksum,
            layer_seal: Vec::new(),
            state: c.state,
        }
    }
}

impl TryFrom<WireChunk> for Chunk {
    type Error = String;
    fn try_from(w: WireChunk) -> Result<Self, String> {
        Ok(Chunk {
            layer: w.layer,
            start: w.start,
            end: w.end,
            codec: Codec::parse(&w.codec).ok_or_else(|| format!("unknown codec {:?}", w.codec))?,
            compressed: w.compressed,
            payload: w.payload,
            state: w.state,
            checksum: w.checksum,
        })
    }
}

/// The header's description of a hybrid model's recurrent layers (`recurrent[l]`: layer `l` is
/// one) and their state's shape; none for a model without them.
pub fn state_shape(recurrent: &[bool], s: Option<Recurrence>) -> Option<StateShape> {
    let s = s?;
    let (kind, (k_heads, v_heads, head_dim)) = match s {
        Recurrence::DeltaNet(d) => (StateKind::GatedDeltaNet, (d.k_heads, d.v_heads, d.head_dim)),
        Recurrence::ShortConv(_) => (StateKind::ShortConv, (0, 0, 0)),
    };
    Some(StateShape {
        layers: (0..recurrent.len())
            .filter(|&l| recurrent[l])
            .map(|l| l as u32)
            .collect(),
        conv_kernel: s.conv_kernel() as u32,
        k_heads: k_heads as u32,
        v_heads: v_heads as u32,
        head_dim: head_dim as u32,
        conv_channels: s.conv_dim() as u32,
        kind: kind as i32,
    })
}

/// Whether a prompt id is acceptable (short, plain): ids are names, not content.
pub fn valid_prompt_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}
